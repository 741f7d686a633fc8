# gpt2_124m.sh — sourced by the benches, after scripts/python.sh and with PY
# set: GPT-2 124M's shape, random tokens of its vocabulary in llm.c's shard
# format, and a plan that trains the model on them. Not a program of its own.
L=12 NH=12 C=768 V=50257 VP=50304 MAXT=1024

# gpt2_tokens OUT [COUNT]: COUNT tokens (default 2^20), the same ones every run
gpt2_tokens() {
    "$PY" - "$1" "$V" "${2:-$((1 << 20))}" <<'PYEOF'
import sys, numpy as np
n, v = int(sys.argv[3]), int(sys.argv[2])
h = np.zeros(256, np.int32); h[:3] = (20240520, 1, n)
t = np.random.default_rng(0).integers(0, v, n, dtype=np.uint16)
open(sys.argv[1], "wb").write(h.tobytes() + t.tobytes())
PYEOF
}

# gpt2_plan OUT TOKENS SEQ_LEN MICRO_BATCH STEPS [MEMBERS]: the plan, fp32 unless
# MEMBERS (more top-level members, e.g. '"parallel": {"dp": 2}') say otherwise;
# a constant learning rate and no checkpoints
gpt2_plan() {
    local more=${6:+$6, }
    cat >"$1" <<JSON
{"model": {"layers": $L, "heads": $NH, "hidden": $C, "vocab": $V, "padded_vocab": $VP,
           "seq_len": $3, "max_seq_len": $MAXT},
 "data": {"train": "$2"},
 "batch": {"micro_batch": $4},
 "optimizer": {"lr": 1e-4, "warmup_steps": 0, "schedule": "constant"},
 $more"steps": $5, "checkpoint": {"every": 0, "keep": 1}}
JSON
}

# gpt2_dp2_plan: the data-parallel benches' case in $work (tokens.bin, plan.json): micro-batch
# B=4 of T=64 tokens, fp32, dp 2 on the CPU, STEPS + 1 steps (the first warms up)
gpt2_dp2_plan() {
    T=64 B=4
    gpt2_tokens "$work/tokens.bin"
    gpt2_plan "$work/plan.json" "$work/tokens.bin" "$T" "$B" $((STEPS + 1)) \
        '"parallel": {"dp": 2, "device": "cpu"}'
}
