#!/usr/bin/env bash
# test_hf.sh — Hugging Face weights in and out (common/formats/safetensors.c,
# hf_model.c; plait ckpt import/export, model.init):
# - a GPT-2 written in transformers' GPT2LMHeadModel layout (its names, Conv1D
#   weights stored (in, out)) trains, as model.init, exactly as its llm.c file
#   does (every step's metrics to the bit);
# - a Llama directory (llama_ref.py's case: config.json, two safetensors shards
#   and their index) imported as a run's step-0 checkpoint and exported again
#   holds the same tensors to the bit, read by an independent reader (the npm
#   package "safetensors"), and export → import → export rewrites the same
#   bytes, in shards of a given size; a Llama's export as an llm.c file is
#   refused;
# - hostile files and configs are refused with what is wrong and where.
# Run from the repository root; PLAIT_BUILD (default ./build) holds bin/plait.
source "$(dirname "$0")/lib.sh" # defines: PLAIT, PY, ROOT, WORK, check, finish

READER=$ROOT/build/safetensors-reader
setup_reader() { npm_package_dir "$ROOT/tests/hf" "$READER" "safetensors reader"; }

gpt2_as_llmc_and_as_hf() {
    "$PY" "$ROOT/tests/golden/gpt2_ref.py" case "$WORK/gcase" --steps 4 >/dev/null &&
        "$PY" "$ROOT/tests/golden/gpt2_ref.py" hf "$WORK/gcase" "$WORK/ghf" &&
        "$PLAIT" train "$WORK/gcase/plan.json" --out "$WORK/g_llmc" >"$WORK/g_llmc.log" 2>&1 &&
        "$PLAIT" train "$WORK/gcase/plan.json" --out "$WORK/g_hf" \
            --set model.init="$WORK/ghf" >"$WORK/g_hf.log" 2>&1 &&
        metrics_equal "$WORK/g_llmc/metrics.jsonl" "$WORK/g_hf/metrics.jsonl"
}
check gpt2_from_hf_trains_as_from_llmc gpt2_as_llmc_and_as_hf

# A GPT-2 as transformers saves it (hf_gpt2_ref.py: three shards in F32, BF16
# and F16 with their index, the tied lm_head.weight beside the embedding):
# plait's logits and loss on its first batch are those of a PyTorch forward
# written after transformers' modeling_gpt2, within 1e-5 relative (fp32).
HFREF=$ROOT/tests/golden/hf_gpt2_ref.py

# gpt2_case NAME [case options]: the case in $WORK/hcase_NAME, one step of it
# trained with its logits dumped into $WORK/hrun_NAME
gpt2_case() {
    local c=$WORK/hcase_$1 r=$WORK/hrun_$1
    shift
    "$PY" "$HFREF" case "$c" "$@" &&
        PLAIT_DUMP_STEP1="$r/dump" "$PLAIT" train "$c/plan.json" --out "$r" >"$r.log" 2>&1 ||
        { tail -n 20 "$r.log"; return 1; }
}
gpt2_logits_as_transformers() {
    gpt2_case "$1" "${@:2}" && "$PY" "$HFREF" compare "$WORK/hcase_$1" "$WORK/hrun_$1"
}
check gpt2_transformers_layout_logits_match_referee gpt2_logits_as_transformers prefixed
check gpt2_names_without_transformer_prefix gpt2_logits_as_transformers bare --no-prefix
check gpt2_without_lm_head_weight gpt2_logits_as_transformers headless --head none

# the comparison can fail: the referee's logits 1e-4 off are refused
referee_refuses_other_logits() {
    local c=$WORK/hcase_off
    rm -rf "$c" && cp -r "$WORK/hcase_prefixed" "$c" &&
        "$PY" -c 'import numpy as np, sys
a = np.fromfile(sys.argv[1], dtype="<f4"); (a * np.float32(1 + 1e-4)).tofile(sys.argv[1])' \
            "$c/ref/logits.f32" &&
        ! "$PY" "$HFREF" compare "$c" "$WORK/hrun_prefixed"
}
check gpt2_referee_refuses_logits_1e-4_off referee_refuses_other_logits

# a tied GPT-2 whose lm_head.weight is not its embedding is refused
head_other_refused() {
    "$PY" "$HFREF" case "$WORK/hcase_other" --head other &&
        expect_refusal "lm_head other than wte" "lm_head.weight is not the token embedding" \
            "$PLAIT" ckpt import "$WORK/hcase_other/hf" "$WORK/hcase_other/plan.json" \
            --out "$WORK/hrun_other"
}

# the referee's Llama case: its init/ directory and plan
"$PY" "$ROOT/tests/golden/llama_ref.py" case "$WORK/lcase" >"$WORK/lcase.log" 2>&1 ||
    cat "$WORK/lcase.log"

# tensors NAME DIR: every tensor of DIR's safetensors files as the npm reader
# reads them, one JSON line each, sorted by name, into $WORK/NAME.jsonl
tensors() {
    (cd "$READER" && node read.mjs "$2"/*.safetensors) | sort >"$WORK/$1.jsonl"
}

import_export_round_trip() {
    local c=$WORK/lcase
    "$PLAIT" ckpt import "$c/init" "$c/plan.json" --out "$WORK/imported" >/dev/null &&
        "$PLAIT" ckpt export "$WORK/imported" --hf "$WORK/out1" --shard-mb 0.02 >/dev/null &&
        ls "$WORK/out1"/model-00003-of-0000[3-9].safetensors >/dev/null &&
        "$PLAIT" ckpt import "$WORK/out1" "$c/plan.json" --out "$WORK/again" >/dev/null &&
        "$PLAIT" ckpt export "$WORK/again" --hf "$WORK/out2" --shard-mb 0.02 >/dev/null &&
        for f in "$WORK/out1"/*; do cmp "$f" "$WORK/out2/$(basename "$f")" || return 1; done &&
        tensors init "$c/init" && tensors out1 "$WORK/out1" &&
        [ "$(wc -l <"$WORK/init.jsonl")" -eq 21 ] &&
        cmp "$WORK/init.jsonl" "$WORK/out1.jsonl"
}
if why=$(setup_reader); then
    check llama_import_export_is_exact_and_read_by_another_reader import_export_round_trip
else
    echo "ok llama_import_export_is_exact_and_read_by_another_reader # SKIP $why"
fi

# The GPT-2's export, fp32 and bf16: export → import → export rewrites the
# same bytes, in shards of a given size
gpt2_round_trip() { # DTYPE
    local c=$WORK/hcase_prefixed d=$WORK/g$1
    "$PLAIT" ckpt import "$c/hf" "$c/plan.json" --out "$d/imported" >/dev/null &&
        "$PLAIT" ckpt export "$d/imported" --hf "$d/out1" --shard-mb 0.01 --dtype "$1" \
            >/dev/null &&
        ls "$d/out1"/model-00002-of-0000[2-9].safetensors >/dev/null &&
        "$PLAIT" ckpt import "$d/out1" "$c/plan.json" --out "$d/again" >/dev/null &&
        "$PLAIT" ckpt export "$d/again" --hf "$d/out2" --shard-mb 0.01 --dtype "$1" >/dev/null &&
        for f in "$d/out1"/*; do cmp "$f" "$d/out2/$(basename "$f")" || return 1; done
}
check gpt2_export_import_export_is_exact_fp32 gpt2_round_trip fp32
check gpt2_export_import_export_is_exact_bf16 gpt2_round_trip bf16
# ... and the npm reader reads the exports as the tensors the case wrote
# (bf16: rounded to nearest even by the case's script)
gpt2_export_read_by_another_reader() {
    local c=$WORK/hcase_prefixed
    tensors gexp "$WORK/gfp32/out1" && [ "$(wc -l <"$WORK/gexp.jsonl")" -eq 28 ] &&
        cmp "$WORK/gexp.jsonl" "$c/ref/export.jsonl" &&
        tensors gexp_bf16 "$WORK/gbf16/out1" &&
        cmp "$WORK/gexp_bf16.jsonl" "$c/ref/export_bf16.jsonl"
}
if [ -d "$READER/node_modules/safetensors" ]; then
    check gpt2_export_read_by_another_reader gpt2_export_read_by_another_reader
else
    echo "ok gpt2_export_read_by_another_reader # SKIP no safetensors reader"
fi

# the imported checkpoint trains as model.init does: the same metrics
imported_trains_as_init() {
    local c=$WORK/lcase
    "$PLAIT" ckpt import "$c/init" "$c/plan.json" --out "$WORK/imp_run" >/dev/null &&
        (cd "$c" && "$PLAIT" train plan.json --out "$WORK/imp_run" >"$WORK/imp.log" 2>&1) &&
        (cd "$c" && "$PLAIT" train plan.json --out "$WORK/init_run" >"$WORK/init.log" 2>&1) &&
        metrics_equal "$WORK/imp_run/metrics.jsonl" "$WORK/init_run/metrics.jsonl"
}
check llama_imported_checkpoint_trains_as_model_init imported_trains_as_init

# expect_refusal WHAT PATTERN CMD...: CMD fails (not by a signal) and says PATTERN
expect_refusal() {
    local what=$1 pattern=$2 out rc
    shift 2
    out=$("$@" 2>&1)
    rc=$?
    [ "$rc" -eq 1 ] && grep -q -- "$pattern" <<<"$out" && return 0
    echo "$what: exit $rc, wanted 1 and \"$pattern\":"
    echo "$out"
    return 1
}

check gpt2_lm_head_other_than_embedding_refused head_other_refused

llama_as_llmc_refused() {
    expect_refusal "export --llmc of a llama" "export a llama with --hf" \
        "$PLAIT" ckpt export "$WORK/imported" --llmc "$WORK/l.bin"
}
check llama_export_as_llmc_is_refused llama_as_llmc_refused

# hostile NAME PYTHON: a copy of the case's init whose first shard PYTHON rewrites
# (h: its header, a dict; k0: its first tensor's name; n_override: a header
# length to write instead of the header's), then imported
hostile() {
    local d=$WORK/hostile_$1
    rm -rf "$d" && cp -r "$WORK/lcase/init" "$d" &&
        "$PY" - "$d/model-00001-of-00002.safetensors" "$2" <<'PYEOF'
import json, sys
f = sys.argv[1]
raw = open(f, "rb").read()
n = int.from_bytes(raw[:8], "little")
h, data = json.loads(raw[8:8 + n]), raw[8 + n:]
k0 = next(k for k in h if k != "__metadata__")
exec(sys.argv[2])
text = json.dumps(h).encode() if not isinstance(h, bytes) else h
open(f, "wb").write((n_override if "n_override" in dir() else len(text)).to_bytes(8, "little") + text + data)
PYEOF
        "$PLAIT" ckpt import "$d" "$WORK/lcase/plan.json" --out "$WORK/hostile_run_$1"
}
check hostile_offsets_beyond_the_data expect_refusal offsets "outside the" hostile offsets \
    "h[k0]['data_offsets'] = [o + (1 << 30) for o in h[k0]['data_offsets']]"
check hostile_offsets_overlapping expect_refusal overlap "overlap tensor" hostile overlap \
    "k1 = next(k for k in h if k not in ('__metadata__', k0)); h[k1]['data_offsets'] = h[k0]['data_offsets']; h[k1]['shape'] = h[k0]['shape']; h[k1]['dtype'] = h[k0]['dtype']"
check hostile_size_not_the_shape expect_refusal size "bytes for" hostile size \
    "h[k0]['shape'][0] += 1"
check hostile_header_length_beyond_the_file expect_refusal length "a header of" hostile length \
    "n_override = 1 << 40"
check hostile_dtype expect_refusal dtype "unknown dtype" hostile dtype \
    "h[k0]['dtype'] = 'Q4'"
check hostile_header_not_json expect_refusal json "header" hostile json "h = b'{\"a\": [1,'"
check hostile_negative_shape expect_refusal shape "is not a size" hostile shape \
    "h[k0]['shape'][0] = -5"

# config_refused NAME PATTERN PYTHON: the case's config.json edited by PYTHON (c: the dict)
config_refused() {
    local d=$WORK/cfg_$1
    rm -rf "$d" && cp -r "$WORK/lcase/init" "$d" &&
        "$PY" - "$d/config.json" "$3" <<'PYEOF' &&
import json, sys
c = json.load(open(sys.argv[1]))
exec(sys.argv[2])
json.dump(c, open(sys.argv[1], "w"))
PYEOF
        expect_refusal "$1" "$2" "$PLAIT" check "$WORK/lcase/plan.json" --set model.init="$d"
}
check config_other_architecture_refused config_refused arch "Qwen2ForCausalLM: plait trains" \
    "c['architectures'] = ['Qwen2ForCausalLM']"
check config_rope_scaling_refused config_refused rope "rope_scaling: is set" \
    "c['rope_scaling'] = {'rope_type': 'llama3', 'factor': 8.0}"
check config_contradicting_the_plan_refused expect_refusal contradiction \
    "model.layers: 3 contradicts model.init" \
    "$PLAIT" check "$WORK/lcase/plan.json" --set model.layers=3
finish
