#!/usr/bin/env bash
# train.tensorboard: a run's scalars as TensorBoard event files, read back the way
# TensorBoard reads them (tests/tensorboard/read_events.mjs: the npm packages tfrecord, whose
# reader checks both masked CRC-32Cs of every record, and protobufjs decoding each record as
# a tensorflow.Event). A run stopped after step 8 and resumed from its step-4 checkpoint
# leaves two files; with TensorBoard's rule for a SessionLog START (what an earlier file
# holds from that step on is dropped) they read as metrics.jsonl does: every step's loss,
# lr and gradient norm, every evaluation's loss, in float32 (the resumed run stops at step 6:
# the first file's steps 7 and 8 must be dropped). When npm cannot reach its
# registry the check is skipped, saying so, never passed.
source "$(dirname "$0")/lib.sh"

READER=$ROOT/build/tensorboard-reader
setup_reader() { npm_package_dir "$ROOT/tests/tensorboard" "$READER" reader; }

tiny_plan "$WORK/plan.json"
RUN=(--set train.tensorboard=tb --set steps=8 --set checkpoint.every=4)

test_events_read_as_the_metrics_across_a_resume() {
    local run=$WORK/run
    "$PLAIT" train "$WORK/plan.json" --out "$run" "${RUN[@]}" >"$WORK/a.log" 2>&1 ||
        { cat "$WORK/a.log"; return 1; }
    # as a run that stopped after step 8 before its last checkpoint was kept, resumed to 6
    rm -rf "$run"/checkpoints/step_00000008_0000
    "$PLAIT" train "$WORK/plan.json" --out "$run" "${RUN[@]}" --set steps=6 >"$WORK/b.log" 2>&1 ||
        { cat "$WORK/b.log"; return 1; }
    grep -q "resuming from .*step_00000004_0000" "$WORK/b.log" || { cat "$WORK/b.log"; return 1; }
    local files=("$run"/tb/events.out.tfevents.*)
    [ ${#files[@]} -eq 2 ] || { ls -la "$run/tb"; return 1; }
    (cd "$READER" && node read_events.mjs "${files[@]}") >"$WORK/events.jsonl" || return 1
    "$PY" - "$WORK/events.jsonl" "$run/metrics.jsonl" <<'PYEOF'
import json, struct, sys
f32 = lambda x: struct.unpack("f", struct.pack("f", x))[0]
events = [json.loads(l) for l in open(sys.argv[1])]
seen, files = {}, []
for e in events:  # TensorBoard's reading: files in name order, each from its start
    if e["file"] not in files:
        files.append(e["file"])
        assert e.get("fileVersion") == "brain.Event:2", f"{e['file']} starts with {e}"
        continue
    if e.get("sessionLog", {}).get("status") == "START":
        seen = {k: v for k, v in seen.items() if k[1] < e["step"]}  # the purge
        continue
    for v in e["summary"]["value"]:
        seen[(v["tag"], e["step"])] = v["simpleValue"]
want = {}
for r in map(json.loads, open(sys.argv[2])):
    if "step" in r:
        for tag, key in (("train/loss", "loss"), ("train/lr", "lr"), ("train/grad_norm", "grad_norm")):
            want[(tag, r["step"])] = f32(r[key])
    else:
        want[("val/loss", r["eval_step"])] = f32(r["val_loss"])
got = {k: v for k, v in seen.items() if k[0] != "train/tokens_per_s"}
assert got == want, f"differ: {sorted(set(got.items()) ^ set(want.items()))[:6]}"
assert len(files) == 2 and sum(1 for k in seen if k[0] == "train/tokens_per_s") == 6
print(f"{len(want)} scalars as metrics.jsonl has them, {len(files)} files")
PYEOF
}

if why=$(setup_reader); then
    check events_read_as_the_metrics_across_a_resume test_events_read_as_the_metrics_across_a_resume
else
    echo "ok events_read_as_the_metrics_across_a_resume # SKIP $why"
fi
finish
