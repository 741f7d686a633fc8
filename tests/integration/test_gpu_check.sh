#!/usr/bin/env bash
# asan: skip (make gpu-check builds and runs the normal build; nothing of it is sanitized)
# test_gpu_check.sh — make gpu-check (scripts/gpu_check.sh) as far as a machine
# without a GPU can run it: it exits 77 with a report whose every check is
# skipped, each saying why, and the full log beside it; a build library that is
# missing (a compiler that cannot find yaml.h) stops it before the build, exit 2,
# naming the package to install; scripts/deps.sh and the README name the same
# build packages; and the report made from the first H100 run's real selftest
# and bench output (tests/gpu/fixtures), with a failed and a timed-out stage
# around them, has its tables, FAIL lines and failures' key lines, every
# table's rows as wide as its header.
source "$(dirname "$0")/lib.sh" # defines: BUILD, PY, ROOT, WORK, check, expect_error

GPU=0
PLAIT_SELFTEST_SHAPES=small "$BUILD/bin/plait-train" --selftest >/dev/null 2>&1 || [ $? -ne 77 ] && GPU=1

# every table of a markdown file: rows as wide as the header, a rule under it
tables_are_well_formed() {
    "$PY" - "$1" <<'PYEOF'
import sys
rows, bad = [], []
for n, line in enumerate(open(sys.argv[1]).read().split("\n") + [""], 1):
    if line.startswith("|"):
        rows.append((n, line.replace("\\|", "").count("|")))
    elif rows:
        if len(rows) < 2 or any(w != rows[0][1] for _, w in rows):
            bad.append(rows[0][0])
        rows = []
sys.exit(f"malformed tables at lines {bad}" if bad else 0)
PYEOF
}

test_without_gpu_every_check_is_skipped_saying_why() {
    local rc=0 out=$WORK/nogpu
    OUT=$out "$ROOT/scripts/gpu_check.sh" >"$WORK/nogpu.txt" 2>&1 || rc=$?
    [ "$rc" -eq 77 ] || { echo "exit $rc, want 77"; cat "$WORK/nogpu.txt"; return 1; }
    if [ ! -s "$out/gpu-check.md" ] || [ ! -s "$out/gpu-check.log" ]; then ls -l "$out"; return 1; fi
    grep -q "report: $out/gpu-check.md" "$WORK/nogpu.txt" || return 1
    grep -q '^\*\*no GPU here: every GPU check skipped, saying why (exit 77)\*\*' "$out/gpu-check.md" ||
        { cat "$out/gpu-check.md"; return 1; }
    tables_are_well_formed "$out/gpu-check.md" || return 1
    # the stages: libraries and build ok, the rest skipped; every check skipped with its why
    "$PY" - "$out/gpu-check.md" <<'PYEOF'
import re, sys
text = open(sys.argv[1]).read()
def rows(section):
    body = text.split(f"## {section}\n", 1)[1].split("\n## ", 1)[0]
    return [[c.strip() for c in l.strip("|").split("|")] for l in body.splitlines()
            if l.startswith("|")][2:]
stages = {r[0]: r for r in rows("Stages")}
assert [stages[s][1] for s in ("libraries", "build")] == ["ok", "ok"], stages
for s in ("selftest", "checks", "memcheck", "multi_gpu", "bench"):
    assert stages[s][1] == "skip", stages[s]
checks = rows("Checks")
names = [r[0] for r in checks]
for want in ("cuda_selftest", "cuda_torch_referee_fp32", "cuda_run_equals_cuda_run",
             "cuda_sigterm_mid_step_resumes_to_the_bit", "cuda_checkpoint_resumes_on_the_cpu",
             "cuda_compute_sanitizer_memcheck", "gpu2_tp2_matches_one_gpu", "gpu2_pp2_matches_one_gpu"):
    assert want in names, (want, names)
for name, result, why in checks:
    assert result == "skip" and re.search(r"no CUDA device|CUDA backend|GPU\(s\) here", why), (name, result, why)
assert "Nothing measured: " in text
print(f"{len(checks)} checks, each skipped saying why")
PYEOF
}

# GPU_CHECK_STAGES runs the stages named (a session spreading them over two device calls):
# the others recorded as skipped with their checks, saying so; a stage it does not know is
# refused before anything runs, naming the stages
test_stages_run_only_those_named() {
    local rc=0 out=$WORK/stages
    GPU_CHECK_BUILD=0 GPU_CHECK_STAGES=memcheck,bench OUT=$out "$ROOT/scripts/gpu_check.sh" \
        >"$WORK/stages.txt" 2>&1 || rc=$?
    [ "$rc" -eq 0 ] || [ "$rc" -eq 77 ] || { echo "exit $rc"; cat "$WORK/stages.txt"; return 1; }
    tables_are_well_formed "$out/gpu-check.md" || return 1
    grep -q '^| selftest | skip | .* | not in GPU_CHECK_STAGES |$' "$out/gpu-check.md" &&
        grep -q '^| checks | skip | .* | not in GPU_CHECK_STAGES |$' "$out/gpu-check.md" &&
        grep -q '^| multi_gpu | skip | .* | not in GPU_CHECK_STAGES |$' "$out/gpu-check.md" &&
        grep -q '^| cuda_offload_equals_cuda_run | skip | not in GPU_CHECK_STAGES |$' "$out/gpu-check.md" &&
        ! grep -q '^| memcheck | skip | .* | not in GPU_CHECK_STAGES' "$out/gpu-check.md" &&
        grep -q '^| memcheck | ' "$out/gpu-check.md" || { cat "$out/gpu-check.md"; return 1; }
    rc=0
    GPU_CHECK_BUILD=0 GPU_CHECK_STAGES="checks bnch" OUT=$WORK/stages2 "$ROOT/scripts/gpu_check.sh" \
        >"$WORK/stages2.txt" 2>&1 || rc=$?
    [ "$rc" -eq 2 ] && grep -q 'GPU_CHECK_STAGES: no stage bnch (the stages: selftest checks memcheck multi_gpu bench)' \
        "$WORK/stages2.txt" || { echo "exit $rc"; cat "$WORK/stages2.txt"; return 1; }
}

# a compiler that cannot find yaml.h (as without libyaml-dev): stopped before the
# build, exit 2, the package named on the terminal and in the report
test_a_missing_library_is_named_by_its_package() {
    local rc=0 out=$WORK/nolib
    mkdir -p "$WORK/fakecc"
    cat >"$WORK/fakecc/cc" <<'SH'
#!/bin/sh
# the real compiler, but without yaml.h (libyaml-dev not installed)
src=$(cat)
case "$src" in *'<yaml.h>'*) echo '<stdin>:1:10: fatal error: yaml.h: No such file or directory' >&2; exit 1 ;; esac
printf '%s\n' "$src" | cc "$@"
SH
    chmod +x "$WORK/fakecc/cc"
    CC=$WORK/fakecc/cc OUT=$out "$ROOT/scripts/gpu_check.sh" >"$WORK/nolib.txt" 2>&1 || rc=$?
    [ "$rc" -eq 2 ] || { echo "exit $rc, want 2"; cat "$WORK/nolib.txt"; return 1; }
    grep -q "^    apt-get install libyaml-dev$" "$WORK/nolib.txt" &&
        grep -q "yaml.h or -lyaml: not found (Debian/Ubuntu package libyaml-dev)" "$WORK/nolib.txt" ||
        { cat "$WORK/nolib.txt"; return 1; }
    grep -q "^| libraries | \*\*not ok\*\* | .* | apt-get install libyaml-dev |$" "$out/gpu-check.md" ||
        { cat "$out/gpu-check.md"; return 1; }
    ! grep -q "^| build " "$out/gpu-check.md" # nothing built
}

# an nvidia-smi that lists a GPU the CUDA backend cannot open (a driver the
# backend does not load, here none at all): failed, exit 1, not skipped
test_a_gpu_the_backend_cannot_use_fails_not_skips() {
    local rc=0 out=$WORK/badgpu
    mkdir -p "$WORK/smi"
    cat >"$WORK/smi/nvidia-smi" <<'SH'
#!/bin/sh
case "$*" in
  -L) echo "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-00000000-0000-0000-0000-000000000000)" ;;
  --query-gpu=*) echo "NVIDIA H100 80GB HBM3, 580.65.06, 81559 MiB, 9.0" ;;
  *) echo "| NVIDIA-SMI 580.65.06    Driver Version: 580.65.06    CUDA Version: 13.0 |" ;;
esac
SH
    chmod +x "$WORK/smi/nvidia-smi"
    PATH=$WORK/smi:$PATH GPU_CHECK_BUILD=0 OUT=$out "$ROOT/scripts/gpu_check.sh" >"$WORK/badgpu.txt" 2>&1 ||
        rc=$?
    [ "$rc" -eq 1 ] || { echo "exit $rc, want 1"; cat "$WORK/badgpu.txt"; return 1; }
    tables_are_well_formed "$out/gpu-check.md" || return 1
    grep -qF '| gpu | NVIDIA H100 80GB HBM3, 580.65.06, 81559 MiB, 9.0 |' "$out/gpu-check.md" &&
        grep -qF '| CUDA (driver) | 13.0 |' "$out/gpu-check.md" &&
        grep -qE '^\| cuda_selftest \| \*\*not ok\*\* \| nvidia-smi lists 1 GPU\(s\), but the selftest found none usable: ' \
            "$out/gpu-check.md" &&
        grep -qE '^\| cuda_torch_referee_fp32 \| \*\*not ok\*\* \| nvidia-smi lists a GPU, but plait-train --selftest found none usable:' \
            "$out/gpu-check.md" &&
        grep -qE '^\| gpu1x2_tp2_matches_one_gpu \| \*\*not ok\*\* \| nvidia-smi lists 1 GPU\(s\), but plait-train --selftest found none usable:' \
            "$out/gpu-check.md" || { cat "$out/gpu-check.md"; return 1; }
}

# the README's install line for a GPU machine is scripts/deps.sh's build list
test_deps_and_readme_name_the_same_build_packages() {
    local readme deps
    readme=$(grep -m1 '^apt-get install .*libjansson-dev' "$ROOT/README.md" | tr ' ' '\n' |
        grep -v '^apt-get$\|^install$\|^-y$' | sort | tr '\n' ' ')
    deps=$("$ROOT/scripts/deps.sh" list build | tr ' ' '\n' | sort | tr '\n' ' ')
    [ -n "$deps" ] && [ "$readme" = "$deps" ] || { echo "README: $readme"; echo "deps.sh: $deps"; return 1; }
    grep -q libyaml-dev <<<"$deps"
}

# the report from real H100 output (selftest, bench), beside a failed check, a
# stage stopped at its limit and one the budget left out
test_report_from_the_first_h100_run() {
    local w=${FAKE_DIR:-$WORK/fake} fx=$ROOT/tests/gpu/fixtures
    mkdir -p "$w/logs"
    { cat "$fx/h100_selftest.txt" # and a row of the GELU epilogue's, as the selftest prints it now
      echo "gelu epilogue fp32     x in [-8,8], 2^20              gelu             1.21e-06    5e-06 same    ok"; } \
        >"$w/logs/selftest.log"
    { cat "$fx/h100_bench_quick.txt"
      echo "PyTorch     bf16 16x1024: 123,456 tokens/s (torch.compile, autocast, SDPA, fused AdamW); plait / PyTorch = 0.15"; } \
        >"$w/logs/bench.log"
    printf '%s\n' "ok cuda_torch_referee_fp32" "not ok cuda_run_equals_cuda_run" "    # metrics differ:" \
        "    #  line 3 | with a bar" "ok cuda_fp8_tracks_the_cpu # SKIP this GPU has no fp8 tensor cores (sm_89+)" \
        >"$w/logs/checks.log"
    echo "========= COMPUTE-SANITIZER" >"$w/logs/memcheck.log"
    printf '%s\n' \
        "selftest	fail	31.0	300	1	FAILED: 12 of 255 checks failed	cuda_selftest" \
        "checks	fail	40.2	300	1	3 ok (1 of them skipped), 1 not ok	cuda_torch_referee_fp32 cuda_run_equals_cuda_run cuda_fp8_tracks_the_cpu" \
        "memcheck	timeout	240.0	240	124	stopped at its 240s limit	cuda_compute_sanitizer_memcheck" \
        "multi_gpu	notrun	0	0	-	the 540s budget (GPU_CHECK_BUDGET_S) was spent	gpu2_tp2_matches_one_gpu" \
        "bench	ok	93.0	532	0	BENCH_BATCHES=16 BENCH_STEPS=10 BENCH_TORCH=0" >"$w/stages.tsv"
    printf '%s\n' "gpu	NVIDIA H100 80GB HBM3, 580.65.06, 81559 MiB, 9.0" "exit	1" >"$w/meta.tsv"
    "$PY" "$ROOT/scripts/gpu_check_report.py" "$w" "$w/gpu-check.md" 412 540 0 || return 1
    local md=$w/gpu-check.md want
    tables_are_well_formed "$md" || { cat "$md"; return 1; }
    for want in \
        '**4 of 6 checks failed or did not run, 4 stage(s) not ok (exit 1)**; 6m52s of the 540 s budget.' \
        '| gpu | NVIDIA H100 80GB HBM3, 580.65.06, 81559 MiB, 9.0 |' \
        '| cuda_selftest | **not ok** | FAILED: 12 of 255 checks failed |' \
        '| cuda_run_equals_cuda_run | **not ok** | metrics differ: |' \
        '| cuda_fp8_tracks_the_cpu | skip | this GPU has no fp8 tensor cores (sm_89+) |' \
        '| cuda_compute_sanitizer_memcheck | **not run** | not reached: the stage stopped at its 240 s limit |' \
        '| gpu2_tp2_matches_one_gpu | **not run** | the 540s budget (GPU_CHECK_BUDGET_S) was spent |' \
        'plait-train --selftest: FAILED: 12 of 255 checks failed' \
        'The GELU epilogue alone (x over [-8, 8] against the CPU'"'"'s tanh GELU) and every FAIL line; error = max |gpu - cpu| / max |cpu|:' \
        'gelu epilogue fp32     x in [-8,8], 2^20              gelu             1.21e-06    5e-06 same    ok' \
        'matmul_fwd fp8 block   4,128,256,4,1000,1024,768  out_bias         1.09e+03    1e-05 same    FAIL' \
        '| 16×1024 | 19,009 | 1.6% | 861.9 | 35.7 | 0.04 | 123,456 | 0.15 | 0.04 |' \
        '| attention bwd | 612.86 | 70.9% |' \
        'Where a 16×1024 step goes (PLAIT_PROFILE=1, 864.63 ms a step):' \
        '| qkv | fwd | 0.154 | 0.326 | 0.47 | 0.340 | 0.45 |' \
        '| all | step | 2.593 | 7.668 | 0.34 | 6.268 | 0.41 |' \
        '| tensor | 16x1024 | 16,877 | 0.7% |' \
        ' line 3 | with a bar' \
        'memcheck (its last lines):' \
        '(no nsys here: no time per kernel)'; do
        grep -qxF -- "$want" "$md" || { echo "missing: $want"; cat "$md"; return 1; }
    done
}

if [ "$GPU" -eq 0 ]; then
    check gpu_check_without_gpu_skips_every_check_saying_why test_without_gpu_every_check_is_skipped_saying_why
else
    echo "ok gpu_check_without_gpu_skips_every_check_saying_why # SKIP a GPU is here: make gpu-check runs for real"
fi
if [ "$GPU" -eq 0 ]; then
    check gpu_check_fails_on_a_gpu_the_backend_cannot_use test_a_gpu_the_backend_cannot_use_fails_not_skips
fi
check gpu_check_runs_only_the_stages_named test_stages_run_only_those_named
check gpu_check_names_a_missing_library_by_its_package test_a_missing_library_is_named_by_its_package
check deps_and_readme_name_the_same_build_packages test_deps_and_readme_name_the_same_build_packages
check gpu_check_report_from_the_first_h100_run test_report_from_the_first_h100_run
finish
