#!/usr/bin/env bash
# Everyday use: a run is never lost by an ordinary action (Ctrl-C, a closed
# terminal, a closed pipe; checkpoints by time by default), its console is kept
# in train.log, and a run is seen at a glance (plait status, plait plot,
# plait train --json / --quiet).
source "$(dirname "$0")/lib.sh"

tiny_plan "$WORK/plan.json"
"$PLAIT" train "$WORK/plan.json" --out "$WORK/ref" >"$WORK/ref.log" 2>&1 || { cat "$WORK/ref.log"; exit 1; }

# A non-interactive shell starts background jobs with SIGINT ignored (and
# plait-train, like any polite program, leaves ignored signals ignored): start
# them as a terminal would, SIGINT at its default, in their own process group.
as_from_terminal() {
    exec "$PY" -c 'import os, signal, sys
signal.signal(signal.SIGINT, signal.SIG_DFL)
signal.signal(signal.SIGHUP, signal.SIG_DFL)
os.setpgid(0, 0)
os.execvp(sys.argv[1], sys.argv[1:])' "$@"
}

# wait_for_step LOG N: until the progress line of step N is in LOG
wait_for_step() {
    for _ in $(seq 400); do grep -q "^step  *$2/" "$1" 2>/dev/null && return 0; sleep 0.05; done
    echo "step $2 never came"; cat "$1"; return 1
}

# stop_and_resume SIGNAL RUN: a slowed run gets SIGNAL (to its whole process
# group, as a terminal sends it) after step 2; it must say so, checkpoint, exit
# 75, and a second start must end with the metrics of a run never stopped.
stop_and_resume() {
    local sig=$1 run=$2 rc=0
    PLAIT_DEBUG_SLOW_RANK=0:40 as_from_terminal "$PLAIT" train "$WORK/plan.json" --out "$run" \
        >"$run.log1" 2>&1 &
    local pid=$!
    wait_for_step "$run.log1" 2 || return 1
    kill -"$sig" -- -"$pid"
    wait "$pid" || rc=$?
    [ "$rc" -eq 75 ] || { echo "exit code $rc, want 75"; cat "$run.log1"; return 1; }
    grep -q "stopping after this micro-batch, writing a checkpoint" "$run.log1" || { cat "$run.log1"; return 1; }
    grep -q "stopped by SIG$sig; a checkpoint was written" "$run.log1" || { cat "$run.log1"; return 1; }
    "$PLAIT" train "$WORK/plan.json" --out "$run" >"$run.log2" 2>&1 || { cat "$run.log2"; return 1; }
    grep -q "resuming from" "$run.log2" || { cat "$run.log2"; return 1; }
    metrics_equal "$WORK/ref/metrics.jsonl" "$run/metrics.jsonl"
}

test_ctrl_c_checkpoints_exits_75_and_resumes_to_the_bit() {
    stop_and_resume INT "$WORK/int"
}

test_sighup_checkpoints_exits_75_and_resumes_to_the_bit() {
    stop_and_resume HUP "$WORK/hup"
}

test_second_ctrl_c_stops_at_once() {
    local run=$WORK/twice rc=0
    # each micro-batch takes 400 ms: the second Ctrl-C comes before the first stop
    PLAIT_DEBUG_SLOW_RANK=0:400 as_from_terminal "$PLAIT" train "$WORK/plan.json" --out "$run" \
        >"$run.log" 2>&1 &
    local pid=$!
    wait_for_step "$run.log" 1 || return 1
    kill -INT -- -"$pid"
    sleep 0.1
    kill -INT -- -"$pid"
    wait "$pid" || rc=$?
    [ "$rc" -eq 130 ] || { echo "exit code $rc, want 130"; cat "$run.log"; return 1; }
}

test_ctrl_c_to_a_gang_gives_one_checkpoint_and_exit_75() {
    local run=$WORK/gang rc=0
    PLAIT_DEBUG_SLOW_RANK=1:40 as_from_terminal "$PLAIT" train "$WORK/plan.json" --out "$run" \
        --set parallel.dp=2 >"$run.log1" 2>&1 &
    local pid=$!
    wait_for_step "$run.log1" 2 || return 1
    kill -INT -- -"$pid" # the launcher's process group: what a terminal's Ctrl-C reaches
    wait "$pid" || rc=$?
    [ "$rc" -eq 75 ] || { echo "exit code $rc, want 75"; cat "$run.log1"; return 1; }
    [ "$(grep -c "stopping after this micro-batch" "$run.log1")" -eq 1 ] || { cat "$run.log1"; return 1; }
    [ "$(grep -c "checkpoint step .* written" "$run.log1")" -ge 1 ] || { cat "$run.log1"; return 1; }
    "$PLAIT" train "$WORK/plan.json" --out "$run" --set parallel.dp=2 >"$run.log2" 2>&1 || { cat "$run.log2"; return 1; }
    grep -q "resuming from" "$run.log2" || { cat "$run.log2"; return 1; }
    [ "$(grep -c '"step"' "$run/metrics.jsonl")" -eq 12 ] || { cat "$run/metrics.jsonl"; return 1; }
}

test_closed_stdout_pipe_does_not_stop_training() {
    local run=$WORK/pipe
    "$PLAIT" train "$WORK/plan.json" --out "$run" 2>"$run.err" | head -n 1 >/dev/null
    local rc=${PIPESTATUS[0]}
    [ "$rc" -eq 0 ] || { echo "exit code $rc, want 0"; cat "$run.err"; return 1; }
    [ "$(grep -c '"step"' "$run/metrics.jsonl")" -eq 12 ] || return 1
    grep -q "^step 12/12" "$run/train.log" || { cat "$run/train.log"; return 1; } # the log kept it
}

test_console_is_kept_in_train_log_across_resumes() {
    local run=$WORK/log rc=0 log=$WORK/log/train.log
    PLAIT_DEBUG_SIGNAL_AFTER_MICRO=8 "$PLAIT" train "$WORK/plan.json" --out "$run" >/dev/null 2>&1 || rc=$?
    [ "$rc" -eq 75 ] || { echo "exit code $rc"; return 1; }
    "$PLAIT" train "$WORK/plan.json" --out "$run" >/dev/null 2>&1 || return 1
    grep -q "stopping after micro-batch 2 of step 3" "$log" || { cat "$log"; return 1; }
    grep -q "resuming from" "$log" || { cat "$log"; return 1; }
    grep -q "^step 12/12" "$log" || { cat "$log"; return 1; }
}

test_checkpoints_by_time_without_checkpoint_every() {
    local run=$WORK/minutes
    PLAIT_DEBUG_SLOW_RANK=0:30 "$PLAIT" train "$WORK/plan.json" --out "$run" \
        --set checkpoint.every=0 --set checkpoint.every_minutes=0.002 >"$run.log" 2>&1 || { cat "$run.log"; return 1; }
    local n; n=$(grep -c "checkpoint step .* written" "$run.log")
    [ "$n" -ge 3 ] || { echo "$n checkpoints, want several by time"; cat "$run.log"; return 1; }
    # the default (30 minutes): a short run checkpoints once, at the end
    run=$WORK/minutes_default
    "$PLAIT" train "$WORK/plan.json" --out "$run" --set checkpoint.every=0 >"$run.log" 2>&1 || { cat "$run.log"; return 1; }
    [ "$(grep -c "checkpoint step .* written" "$run.log")" -eq 1 ] || { cat "$run.log"; return 1; }
    [ -d "$run/checkpoints/step_00000012_0000" ] || return 1
}

test_json_prints_the_metrics_records_on_stdout() {
    local run=$WORK/json
    "$PLAIT" train "$WORK/plan.json" --out "$run" --json >"$run.out" 2>"$run.err" || { cat "$run.err"; return 1; }
    cmp "$run.out" "$run/metrics.jsonl" || { head -3 "$run.out"; return 1; }
}

test_quiet_prints_only_the_summary() {
    local run=$WORK/quiet
    "$PLAIT" train "$WORK/plan.json" --out "$run" --quiet >"$run.out" 2>"$run.err" || { cat "$run.err"; return 1; }
    [ ! -s "$run.out" ] || { cat "$run.out"; return 1; }
    [ "$(wc -l <"$run.err")" -eq 1 ] || { cat "$run.err"; return 1; }
    grep -q "^plait-train: finished at step 12/12: loss" "$run.err" || { cat "$run.err"; return 1; }
}

test_status_of_a_running_run() {
    local run=$WORK/running
    PLAIT_DEBUG_SLOW_RANK=0:100 "$PLAIT" train "$WORK/plan.json" --out "$run" >"$run.log" 2>&1 &
    local pid=$!
    wait_for_step "$run.log" 2 || return 1
    "$PLAIT" status "$run" >"$run.status"
    "$PLAIT" status "$run" --json >"$run.json"
    local rank0
    rank0=$(pgrep -P "$pid" | paste -sd'|')
    kill -TERM "$pid"
    wait "$pid"
    # the run's holder is rank 0, plait train's child (plait train supervises it)
    grep -qE "state        running: pid ($rank0) on host" "$run.status" ||
        { cat "$run.status"; return 1; }
    "$PY" - "$run.json" <<'PYEOF' || return 1
import json, sys
s = json.load(open(sys.argv[1]))
assert s["state"] == "running", s
assert s["steps"] == 12 and s["step"] >= 2, s
assert s["layout"] == {"tp": 1, "pp": 1, "dp": 1}, s
assert s["tokens_per_s"] > 0 and s["eta_s"] > 0, s
PYEOF
}

test_status_of_a_finished_run() {
    "$PLAIT" status "$WORK/ref" >"$WORK/ref.status" || return 1
    grep -q "step         12/12 (100%), loss [0-9.]*, val loss [0-9.]* (step 12)" "$WORK/ref.status" || { cat "$WORK/ref.status"; return 1; }
    grep -q "checkpoints  3, newest step_00000012_0000 (verified)" "$WORK/ref.status" || { cat "$WORK/ref.status"; return 1; }
    grep -q "state        finished (exit 0)" "$WORK/ref.status" || { cat "$WORK/ref.status"; return 1; }
    grep -q "memory       rank 0: plait check predicted .* MB .*, allocated .* MB" "$WORK/ref.status" || { cat "$WORK/ref.status"; return 1; }
}

# the measured speed beside what plait-train's cost model gave as it started
# (run.json, from the CPU rates it measured then): the same figure in both
test_status_shows_measured_beside_modelled() {
    "$PLAIT" status "$WORK/ref" >"$WORK/ref.status2" || return 1
    grep -qE "speed        [0-9]+ tokens/s, ETA - \(plait check's cost model: [0-9]+ tokens/s here, measured/modelled [0-9.]+\)" \
        "$WORK/ref.status2" || { cat "$WORK/ref.status2"; return 1; }
    "$PLAIT" status "$WORK/ref" --json | "$PY" -c '
import json, sys
s = json.load(sys.stdin)
run = json.load(open(sys.argv[1] + "/run.json"))
assert s["modelled_tokens_per_s"] == run["throughput"]["modelled_tokens_per_s"] > 0, (s, run["throughput"])' "$WORK/ref"
}

test_status_of_a_preempted_run() {
    local run=$WORK/preempted rc=0
    PLAIT_DEBUG_SIGNAL_AFTER_MICRO=8 "$PLAIT" train "$WORK/plan.json" --out "$run" >/dev/null 2>&1 || rc=$?
    [ "$rc" -eq 75 ] || { echo "exit code $rc"; return 1; }
    "$PLAIT" status "$run" >"$run.status" || return 1
    grep -q "state        preempted (exit 75) at .* by SIGTERM: run plait train again to resume" "$run.status" || { cat "$run.status"; return 1; }
    grep -q "newest step_00000002_0002 (verified)" "$run.status" || { cat "$run.status"; return 1; }
}

test_status_of_a_failed_run_says_why() {
    # its training data cut short under it: the run fails, saying so
    local run=$WORK/failed rc=0
    cp "$WORK/train.bin" "$WORK/failing.bin"
    PLAIT_DEBUG_SLOW_RANK=0:40 "$PLAIT" train "$WORK/plan.json" --out "$run" \
        --set data.train="$WORK/failing.bin" >"$run.log" 2>&1 &
    local pid=$!
    wait_for_step "$run.log" 2 || return 1
    truncate -s 2000 "$WORK/failing.bin"
    wait "$pid" || rc=$?
    [ "$rc" -eq 1 ] || { echo "exit code $rc"; cat "$run.log"; return 1; }
    "$PLAIT" status "$run" >"$run.status" || return 1
    grep -q "state        failed (exit 1) at .*: data.train: .*failing.bin: .*the file shrank" "$run.status" || { cat "$run.status"; return 1; }
    "$PLAIT" status "$run" "$WORK/ref" --json >"$run.json" || return 1
    [ "$(wc -l <"$run.json")" -eq 2 ] || { cat "$run.json"; return 1; }
}

# A run directory is untrusted input: a hand-made end.json whose "end" is no
# string, a message with terminal escape sequences, a step time of 1e15 ms:
# plait status neither crashes nor prints the escapes raw nor a negative ETA.
test_status_treats_the_run_directory_as_untrusted() {
    local run=$WORK/hostile
    cp -a "$WORK/ref" "$run"
    "$PY" - "$run" <<'PYEOF' || return 1
import json, sys
run = sys.argv[1]
e = json.load(open(run + "/end.json"))
e.update({"end": 5, "message": "\x1b[31mred\x1b[0m"})
json.dump(e, open(run + "/end.json", "w"))
lines = [json.loads(l) for l in open(run + "/metrics.jsonl")]
steps = [r for r in lines if "ms" in r]
steps[-1]["ms"], steps[-1]["step"] = 1e15, 5
open(run + "/metrics.jsonl", "w").write("".join(json.dumps(r) + "\n" for r in lines))
PYEOF
    "$PLAIT" status "$run" >"$run.status" 2>"$run.err" || { cat "$run.status" "$run.err"; return 1; }
    grep -q "end.json: end: an integer, not a string" "$run.err" || { cat "$run.err"; return 1; }
    "$PY" - "$run" <<'PYEOF' || return 1
import json, sys
e = json.load(open(sys.argv[1] + "/end.json"))
e["end"] = "failed"
json.dump(e, open(sys.argv[1] + "/end.json", "w"))
PYEOF
    "$PLAIT" status "$run" >"$run.status" 2>"$run.err" || { cat "$run.status" "$run.err"; return 1; }
    ! grep -q $'\x1b' "$run.status" || { echo "an escape sequence reached the terminal"; cat -v "$run.status"; return 1; }
    grep -q 'state        failed (exit 0) at .*: \\x1b\[31mred' "$run.status" || { cat -v "$run.status"; return 1; }
    ! grep -q "ETA -" "$run.status" || { cat "$run.status"; return 1; }
}

test_status_of_a_directory_that_is_no_run_is_an_error() {
    local rc=0
    mkdir -p "$WORK/norun"
    "$PLAIT" status "$WORK/norun" >/dev/null 2>"$WORK/norun.err" || rc=$?
    [ "$rc" -eq 1 ] || { echo "exit code $rc"; return 1; }
    grep -q "not a run directory" "$WORK/norun.err" || { cat "$WORK/norun.err"; return 1; }
}

# the PNG's width, height and the pixels that are not white (cairo writes
# 8-bit RGB(A), rows filtered per row: undone here)
png_pixels() {
    "$PY" - "$1" <<'PYEOF'
import struct, sys, zlib
data = open(sys.argv[1], "rb").read()
assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
pos, idat = 8, b""
while pos < len(data):
    n, kind = struct.unpack(">I4s", data[pos:pos + 8])
    body = data[pos + 8:pos + 8 + n]
    if kind == b"IHDR":
        w, h, depth, colour = struct.unpack(">IIBB", body[:10])
    elif kind == b"IDAT":
        idat += body
    pos += 12 + n
assert depth == 8 and colour in (2, 6), (depth, colour)
bpp = 3 if colour == 2 else 4
raw, stride = zlib.decompress(idat), w * bpp
prev, ink, i = bytearray(stride), 0, 0
for _ in range(h):
    f, line = raw[i], bytearray(raw[i + 1:i + 1 + stride])
    i += 1 + stride
    for x in range(stride):
        a = line[x - bpp] if x >= bpp else 0
        b, c = prev[x], prev[x - bpp] if x >= bpp else 0
        if f == 1: line[x] = (line[x] + a) & 255
        elif f == 2: line[x] = (line[x] + b) & 255
        elif f == 3: line[x] = (line[x] + (a + b) // 2) & 255
        elif f == 4:
            p = a + b - c
            pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
            line[x] = (line[x] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
    ink += sum(1 for x in range(0, stride, bpp) if line[x:x + 3] != b"\xff\xff\xff")
    prev = line
print(w, h, ink)
PYEOF
}

test_plot_writes_a_png_of_the_curves() {
    local png=$WORK/loss.png
    "$PLAIT" train "$WORK/plan.json" --out "$WORK/lr" --set optimizer.lr=1e-3 >/dev/null 2>&1 || return 1
    if ! "$PLAIT" plot "$WORK/ref" "$WORK/lr" -o "$png" >"$WORK/plot.out" 2>&1; then
        if grep -q "install libcairo2-dev" "$WORK/plot.out"; then echo "(built without cairo: it says so)"; return 0; fi
        cat "$WORK/plot.out"; return 1
    fi
    grep -qx "$png" "$WORK/plot.out" || { cat "$WORK/plot.out"; return 1; }
    local w h ink
    read -r w h ink < <(png_pixels "$png") || return 1
    [ "$w" -eq 1200 ] && [ "$h" -eq 800 ] || { echo "size ${w}x$h"; return 1; }
    # frames, ticks, labels and curves: a few percent of the picture, not all of it
    [ "$ink" -gt 15000 ] && [ "$ink" -lt 400000 ] || { echo "$ink non-white pixels"; return 1; }
    # an empty run draws less than the same picture with curves
    mkdir -p "$WORK/empty" && "$PLAIT" plot "$WORK/empty" -o "$WORK/empty.png" >/dev/null 2>&1 || return 1
    local ink_empty
    read -r _ _ ink_empty < <(png_pixels "$WORK/empty.png") || return 1
    [ "$ink_empty" -lt "$ink" ] || { echo "empty $ink_empty >= $ink"; return 1; }
}

# Values a few ulps apart (a loss and the next double), and tokens near 1e17:
# the tick loop must end (it stepped by adding a step below the values' last
# bit, and spun for ever).
test_plot_ends_on_values_a_few_ulps_apart() {
    mkdir -p "$WORK/ulps"
    cp "$WORK/ref/plan.json" "$WORK/ulps/" || return 1
    "$PY" - "$WORK/ref/metrics.jsonl" "$WORK/ulps/metrics.jsonl" <<'PYEOF' || return 1
import json, math, sys
out = open(sys.argv[2], "w")
for line in open(sys.argv[1]):
    r = json.loads(line)
    if "val_loss" in r:
        continue
    if "loss" in r and "step" in r:
        r["loss"] = 5.545177444479562 if r["step"] % 2 else math.nextafter(5.545177444479562, 10)
        r["tokens"] = int(1e17) + r["step"]
    out.write(json.dumps(r) + "\n")
PYEOF
    timeout 30 "$PLAIT" plot "$WORK/ulps" -o "$WORK/ulps.png" >"$WORK/ulps.out" 2>&1
    local rc=$?
    [ "$rc" -ne 124 ] || { echo "plait plot did not end in 30 s"; return 1; }
    grep -q "install libcairo2-dev" "$WORK/ulps.out" && return 0 # built without cairo
    [ "$rc" -eq 0 ] && [ -s "$WORK/ulps.png" ] || { cat "$WORK/ulps.out"; return 1; }
}

test_plot_writes_svg_and_pdf() {
    "$PLAIT" plot "$WORK/ref" -o "$WORK/loss.svg" >/dev/null 2>&1 || return 0 # without cairo: above
    "$PLAIT" plot "$WORK/ref" -o "$WORK/loss.pdf" >/dev/null || return 1
    grep -q "<svg" "$WORK/loss.svg" || return 1
    [ "$(head -c 4 "$WORK/loss.pdf")" = "%PDF" ] || return 1
}

# plait plot's options, read back from the SVG's paths (cairo writes each stroke's style and
# points): the validation loss dashed 6,4 with a dot per evaluation; --smooth W the training
# loss's mean over its last W steps with the steps' own loss faint (opacity 0.25) behind;
# --log the loss's pixels linear in log(loss) (linear in the loss without it); where a run
# resumed (its metrics mark the first step after a resume) a vertical line dashed 2,3.
test_plot_options_change_what_is_drawn() {
    local run=$WORK/resumed-run rc=0
    PLAIT_DEBUG_SIGNAL_AFTER_MICRO=8 "$PLAIT" train "$WORK/plan.json" --out "$run" >/dev/null 2>&1 || rc=$?
    [ "$rc" -eq 75 ] || { echo "interrupted run exit $rc"; return 1; }
    "$PLAIT" train "$WORK/plan.json" --out "$run" >/dev/null 2>&1 || return 1
    "$PY" - "$run/metrics.jsonl" <<'PYEOF' || return 1
import json, sys
steps = [r for r in map(json.loads, open(sys.argv[1])) if "loss" in r]
marked = [r["step"] for r in steps if r.get("resumed")]
assert len(steps) == 12 and marked == [3], marked  # stopped mid-step 3: resumed there
PYEOF
    mkdir -p "$WORK/shapes"
    "$PY" - "$WORK/shapes/metrics.jsonl" <<'PYEOF' || return 1
import json, sys
with open(sys.argv[1], "w") as out:
    for i in range(1, 21):
        r = {"step": i, "loss": 10 * 0.8 ** i, "lr": 1e-3, "grad_norm": 1.0, "tokens": 100,
             "tokens_total": 100 * i, "ms": 5.0, "tokens_per_s": 2e4, "peak_pct": 10.0}
        if i == 11:
            r["resumed"] = True
        out.write(json.dumps(r) + "\n")
        if i % 5 == 0:
            out.write(json.dumps({"eval_step": i, "val_loss": 12 * 0.8 ** i, "val_tokens": 64}) + "\n")
PYEOF
    "$PLAIT" plot "$WORK/shapes" -o "$WORK/plain.svg" >/dev/null 2>&1 || return 0 # without cairo: above
    "$PLAIT" plot "$WORK/shapes" -o "$WORK/smooth.svg" --smooth 4 >/dev/null || return 1
    "$PLAIT" plot "$WORK/shapes" -o "$WORK/log.svg" --log >/dev/null || return 1
    grep -v '"resumed"' "$WORK/shapes/metrics.jsonl" >"$WORK/shapes.jsonl" && mkdir -p "$WORK/unresumed" &&
        mv "$WORK/shapes.jsonl" "$WORK/unresumed/metrics.jsonl" || return 1
    "$PLAIT" plot "$WORK/unresumed" -o "$WORK/unresumed.svg" >/dev/null || return 1
    expect_error "$WORK/smooth0.log" 2 "--smooth 0: must be a number of steps" \
        "$PLAIT" plot "$WORK/shapes" -o "$WORK/x.svg" --smooth 0 || return 1
    "$PY" - "$WORK" <<'PYEOF'
import math, re, sys
work = sys.argv[1]
RUN = "rgb(12%,47%,71%)"  # the first run's colour
def strokes(name):
    """(style, [(x, y)]) of each stroked path, in drawing order"""
    svg = open(f"{work}/{name}.svg").read()
    out = []
    for style, d in re.findall(r'<path style="(fill:none;[^"]*)" d="([^"]*)"', svg):
        pts = [(float(a), float(b)) for a, b in re.findall(r"[ML] ([-\d.]+) ([-\d.]+)", d)]
        out.append((style, pts))
    return out
def runs_lines(name, dash=None, opacity="1"):
    want = lambda s: RUN in s and f"stroke-opacity:{opacity};" in s and (
        (f"stroke-dasharray:{dash};" in s) if dash else "dasharray" not in s)
    return [p for s, p in strokes(name) if want(s)]
def residual(values, ys):
    """the largest distance (px) of ys from the best line through (values, ys)"""
    n = len(values); mx = sum(values) / n; my = sum(ys) / n
    b = sum((v - mx) * (y - my) for v, y in zip(values, ys)) / sum((v - mx) ** 2 for v in values)
    return max(abs(y - (my + b * (v - mx))) for v, y in zip(values, ys))
loss = [10 * 0.8 ** i for i in range(1, 21)]
mean4 = [sum(loss[max(0, i - 3):i + 1]) / len(loss[max(0, i - 3):i + 1]) for i in range(20)]
plain = runs_lines("plain")[0]  # the first panel's training loss
ys = [y for _, y in plain]
assert len(plain) == 20 and residual(loss, ys) < 0.05 < 1 < residual([math.log(v) for v in loss], ys)
logy = [y for _, y in runs_lines("log")[0]]
assert residual([math.log(v) for v in loss], logy) < 0.05 and residual(loss, logy) > 1, "--log"
assert not runs_lines("plain", opacity="0.25"), "a faint line without --smooth"
faint, smooth = runs_lines("smooth", opacity="0.25")[0], runs_lines("smooth")[0]
assert [y for _, y in faint] != [y for _, y in smooth], "--smooth drew the loss as it is"
assert residual(mean4, [y for _, y in smooth]) < 0.05 < 1 < residual(loss, [y for _, y in smooth])
assert residual(loss, [y for _, y in faint]) < 0.05, "the faint line is not each step's loss"
val = runs_lines("plain", dash="6,4")  # both loss panels, 4 evaluations each
assert len(val) == 2 and all(len(p) == 4 for p in val), val
svg = open(f"{work}/plain.svg").read()
dots = svg.count(f"fill:{RUN};") - 1  # less the legend's swatch
assert dots == 8, dots
resumes = runs_lines("plain", dash="2,3")  # one a panel, vertical, at step 10 (its checkpoint)
assert len(resumes) == 4 and all(p[0][0] == p[1][0] for p in resumes), resumes
assert resumes[0][0][0] == plain[9][0], (resumes[0], plain[9])
assert "2,3" not in open(f"{work}/unresumed.svg").read(), "a resume marked where none was"
PYEOF
}

for t in $(declare -F | awk '{print $3}' | grep '^test_'); do check "$t" "$t"; done
exit $((failures > 0))
