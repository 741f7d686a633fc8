"""gpu_check_report.py — the markdown report of scripts/gpu_check.sh, from
what it recorded: WORK/stages.tsv (a stage a line: name, status, seconds,
limit, exit code, note, the checks it was to run), WORK/meta.tsv (the
machine) and WORK/logs/STAGE.log (each stage's output: "ok NAME" lines of the
checks, plait-train --selftest's table, bench/bench_cuda.sh's lines). It only
reads and formats; gpu_check.sh decides what passed. Written again after every
stage, so a run cut short still leaves a report.

usage: gpu_check_report.py WORK REPORT.md ELAPSED_S BUDGET_S QUICK
"""
import os
import re
import sys

RESULT = {"ok": "ok", "fail": "**not ok**", "skip": "skip", "timeout": "**not ok** (out of time)",
          "notrun": "**not run**"}


def cell(text):
    """text safe inside a markdown table cell"""
    return str(text).replace("|", "\\|").replace("\n", " ").strip()


def table(header, rows, align=None):
    align = align or ["---"] * len(header)
    out = ["| " + " | ".join(header) + " |", "| " + " | ".join(align) + " |"]
    out += ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows]
    return out


def read(path):
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def load(work):
    stages = []
    for line in read(os.path.join(work, "stages.tsv")).splitlines():
        f = line.split("\t") + [""] * 7
        stages.append({"name": f[0], "status": f[1], "secs": f[2], "limit": f[3], "rc": f[4],
                       "note": f[5], "expect": f[6].split()})
    meta = []
    for line in read(os.path.join(work, "meta.tsv")).splitlines():
        key, _, value = line.partition("\t")
        meta.append((key, value))
    logs = {s["name"]: read(os.path.join(work, "logs", s["name"] + ".log")) for s in stages}
    return stages, meta, logs


def tap(log):
    """the checks a log reports: [(name, result, why, key lines)]"""
    checks = []
    for line in log.splitlines():
        m = re.match(r"^(not ok|ok) (\S+)(?: # (?i:skip) ?(.*))?$", line)
        if m:
            result = "fail" if m.group(1) == "not ok" else "skip" if m.group(3) is not None else "ok"
            checks.append([m.group(2), result, m.group(3) or "", []])
        elif checks and checks[-1][1] == "fail" and line.startswith("    # "):
            checks[-1][3].append(line[6:])
    return checks


def check_rows(stages, logs):
    """every check of the run: (name, result, note, key lines)"""
    rows = []
    for s in stages:
        if s["name"] == "selftest":
            result = {"ok": "ok", "skip": "skip"}.get(s["status"], "fail")
            if s["status"] == "notrun":
                result = "notrun"
            rows.append(("cuda_selftest", result, s["note"], []))  # its FAIL lines: ## Selftest
            continue
        if s["name"] not in ("checks", "memcheck", "multi_gpu"):
            continue
        seen = tap(logs.get(s["name"], ""))
        for name, result, why, lines in seen:
            if result == "fail" and not why and lines:  # the first of its key lines
                why = lines[0] if len(lines[0]) <= 100 else lines[0][:99] + "…"
            rows.append((name, result, why, lines))
        names = {row[0] for row in seen}
        missing = [name for name in s["expect"] if name not in names]
        why = {"timeout": f"not reached: the stage stopped at its {s['limit']} s limit",
               "notrun": s["note"], "skip": s["note"]}.get(
                   s["status"], "not reached: the stage's script stopped first")
        # a stage left out (GPU_CHECK_STAGES) skips its checks, saying why
        result = "skip" if s["status"] == "skip" and not seen else "notrun"
        rows += [(name, result, why, []) for name in missing]
        if not seen and not missing and s["status"] in ("fail", "timeout"):
            tail = logs.get(s["name"], "").splitlines()[-15:]
            rows.append((s["name"], "fail", s["note"] or f"exit {s['rc']}", tail))
    return rows


# ---- the bench's lines (bench/bench_cuda.sh, runtime/profile.c, bench/fp8_bench.c) ------

PLAIT_RE = re.compile(r"^plait-train bf16 (\d+)x(\d+) on (.*): ([\d,]+) tokens/s, (MFU [\d.]+%|MFU unknown)")
STEP_RE = re.compile(r"^  step: measured ([\d.]+) ms(?:, modelled ([\d.]+) ms \(modelled/measured "
                     r"([\d.]+)\)(?:, modelled MFU ([\d.]+)%)?)?")
ANCHOR_RE = re.compile(r"^  PyTorch anchor ([\d,]+) tokens/s .*: plait/anchor ([\d.]+)")
TORCH_RE = re.compile(r"^PyTorch +bf16 (\d+)x\d+: (?:([\d,]+) tokens/s .*plait / PyTorch = ([\d.]+)|(.*))$")
LLMC_RE = re.compile(r"^llm\.c +bf16 (\d+)x\d+: ([\d,]+) tokens/s")
PROF_RE = re.compile(r"^  (\S.*?)\s+([\d.]+)\s+([\d.]+)%$")
PROF_STEP_RE = re.compile(r"^  step\s+([\d.]+)$")
FP8_HEAD_RE = re.compile(r"^fp8-bench: .* (tensor|block) scaling")
FP8_ROW_RE = re.compile(r"^(\w+)\s+(fwd|dinp|dw|step)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)")
FP8_RUN_RE = re.compile(r"^plait-train fp8 (tensor|block) (\d+x\d+): ([\d,]+) tokens/s, (MFU [\d.]+%|MFU unknown)")


def bench(log):
    """the bench's measurements, and the lines that fit no table"""
    runs, order, profile, prof_step, fp8, fp8_runs, other = {}, [], [], None, {}, [], []
    b, scaling, in_profile = None, None, False
    for line in log.splitlines():
        m = PLAIT_RE.match(line)
        if m:
            b = int(m.group(1))
            runs[b] = {"tps": m.group(4), "mfu": m.group(5)[4:], "gpu": m.group(3)}
            order.append(b)
            continue
        m = STEP_RE.match(line)
        if m and b in runs:
            runs[b].update(ms=m.group(1), model_ms=m.group(2) or "", ratio=m.group(3) or "",
                           model_mfu=m.group(4) and m.group(4) + "%" or "")
            continue
        m = ANCHOR_RE.match(line)
        if m and b in runs:
            runs[b].update(anchor=m.group(1), vs_anchor=m.group(2))
            continue
        m = TORCH_RE.match(line)
        if m:
            r = runs.setdefault(int(m.group(1)), {})
            if m.group(2):
                r.update(torch=m.group(2), vs_torch=m.group(3))
            else:
                r.update(torch=m.group(4).strip(), vs_torch="")
            continue
        m = LLMC_RE.match(line)
        if m:
            runs.setdefault(int(m.group(1)), {})["llmc"] = m.group(2)
            continue
        if line.startswith("profile over"):
            in_profile = True
            continue
        if in_profile:
            m, s = PROF_RE.match(line), PROF_STEP_RE.match(line)
            if s:
                prof_step, in_profile = s.group(1), False
            elif m:
                profile.append((m.group(1), m.group(2), m.group(3) + "%"))
            else:
                in_profile = False
            if m or s:
                continue
        m = FP8_HEAD_RE.match(line)
        if m:
            scaling = m.group(1)
            continue
        m = FP8_ROW_RE.match(line)
        if m and scaling:
            fp8.setdefault((m.group(1), m.group(2)), {"bf16": m.group(3)})[scaling] = (m.group(4), m.group(5))
            continue
        m = FP8_RUN_RE.match(line)
        if m:
            fp8_runs.append((m.group(1), m.group(2), m.group(3), m.group(4)[4:]))
            continue
        if line.strip() and not line.startswith(("product ", "where a ")):
            other.append(line)
    return {"runs": runs, "order": order, "profile": profile, "prof_step": prof_step, "fp8": fp8,
            "fp8_runs": fp8_runs, "other": other}


def bench_section(log):
    m = bench(log)
    out = []
    runs = m["runs"]
    if runs:
        gpu = next((r["gpu"] for r in runs.values() if r.get("gpu")), "the GPU")
        out += [f"GPT-2 124M (vocab 50304, T 1024), bf16, on {gpu}: medians of the timed steps, "
                "the first dropped.", ""]
        rows = []
        for b in sorted(runs):
            r = runs[b]
            rows.append((f"{b}×1024", r.get("tps", "-"), r.get("mfu", "-"),
                         r.get("ms", "-"), r.get("model_ms") or "-", r.get("ratio") or "-",
                         r.get("torch", "-"), r.get("vs_torch") or "-", r.get("vs_anchor", "-"))
                        + ((r.get("llmc", "-"),) if any("llmc" in x for x in runs.values()) else ()))
        head = ["batch", "tokens/s", "MFU", "step ms", "modelled ms", "modelled/measured",
                "PyTorch tokens/s", "plait/PyTorch", "plait/anchor"]
        if any("llmc" in x for x in runs.values()):
            head.append("llm.c tokens/s")
        out += table(head, rows, ["---"] + ["---:"] * (len(head) - 1))
        anchors = {r["anchor"] for r in runs.values() if r.get("anchor")}
        if anchors:
            out += ["", "plait/anchor: against issue 11's PyTorch figures on an H100 80GB SXM "
                    f"({', '.join(sorted(anchors))} tokens/s)."]
    if m["profile"]:
        out += ["", f"Where a 16×1024 step goes (PLAIT_PROFILE=1, {m['prof_step'] or '?'} ms a step):",
                ""]
        out += table(["phase", "ms", "share"], m["profile"], ["---", "---:", "---:"])
    if m["fp8"]:
        scalings = [s for s in ("tensor", "block") if any(s in v for v in m["fp8"].values())]
        head = ["product", "pass", "bf16 ms"]
        for s in scalings:
            head += [f"fp8 {s} ms", f"bf16/fp8 {s}"]
        rows = []
        for (prod, pas), v in m["fp8"].items():
            row = [prod, pas, v["bf16"]]
            for s in scalings:
                row += list(v.get(s, ("-", "-")))
            rows.append(row)
        out += ["", "fp8 block products of GPT-2 124M at 16×1024 (build/bin/fp8-bench; the goal: "
                "bf16/fp8 1.3 or more):", ""]
        out += table(head, rows, ["---", "---"] + ["---:"] * (len(head) - 2))
    if m["fp8_runs"]:
        out += ["", "Whole fp8 runs:", ""]
        out += table(["scaling", "batch", "tokens/s", "MFU (of the bf16 peak)"], m["fp8_runs"],
                     ["---", "---", "---:", "---:"])
    if m["other"]:
        out += ["", "Its other lines:" if out else "Its output:", "", "```"] + m["other"][-40:] + ["```"]
    return out[1:] if out[:1] == [""] else out


def selftest_section(log):
    lines = log.splitlines()
    keep = [l for l in lines if l.startswith("plait-train --selftest:")]
    head = [l for l in lines if l.startswith("op ")][:1]
    gelu = [l for l in lines if l.startswith("gelu epilogue")]
    fails = [l for l in lines if re.search(r"\bFAIL\b|DIFFERS", l) and l not in keep]
    if any("(ulp)" in l for l in fails):  # a bf16 output's row: its error is a count
        head += [l for l in lines if l.startswith("(ulp):")][:1]
    out = ["```"] + keep + ["```"]
    what = (["the GELU epilogue alone (x over [-8, 8] against the CPU's tanh GELU)"] if gelu else []) \
        + (["every FAIL line"] if fails else [])
    if what:
        what = " and ".join(what)
        out += ["", f"{what[0].upper()}{what[1:]}; error = max |gpu - cpu| / max |cpu|:", "",
                "```"] + head + gelu
        out += fails[:60] + (["... (%d more)" % (len(fails) - 60)] if len(fails) > 60 else [])
        out += ["```"]
    return out


def main():
    work, path, elapsed, budget, quick = sys.argv[1:6]
    stages, meta, logs = load(work)
    rows = check_rows(stages, logs)
    metad = dict(meta)
    code = metad.get("exit")
    failed = [r for r in rows if r[1] in ("fail", "notrun")]
    stage_bad = [s for s in stages if s["status"] in ("fail", "timeout", "notrun")]
    skipped = [r for r in rows if r[1] == "skip"]
    if code is None:
        verdict = "in progress (or stopped before the end)"
    elif code == "77":
        verdict = "no GPU here: every GPU check skipped, saying why (exit 77)"
    elif code == "0":
        verdict = f"every check passed, {len(skipped)} skipped (exit 0)"
    else:
        verdict = (f"{len(failed)} of {len(rows)} checks failed or did not run, "
                   f"{len(stage_bad)} stage(s) not ok (exit {code})")
    mins, secs = divmod(int(float(elapsed)), 60)
    out = ["# plait gpu-check", "",
           f"**{verdict}**; {mins}m{secs:02d}s of the {budget} s budget"
           + (" (GPU_CHECK_QUICK=1)" if quick == "1" else "") + ".", ""]
    out += table(["", ""], [(k, v) for k, v in meta if k != "exit"])
    out += ["", "## Stages", ""]
    out += table(["stage", "result", "time s", "limit s", "note"],
                 [(s["name"], RESULT.get(s["status"], s["status"]), s["secs"], s["limit"],
                   s["note"]) for s in stages], ["---", "---", "---:", "---:", "---"])
    if rows:
        out += ["", "## Checks", ""]
        out += table(["check", "result", "why / note"],
                     [(n, RESULT.get(r, r), why) for n, r, why, _ in rows])
    if logs.get("selftest", "").strip():
        out += ["", "## Selftest", ""] + selftest_section(logs["selftest"])
    for s in stages:
        if s["name"] != "bench":
            continue
        out += ["", "## Bench", ""]
        body = bench_section(logs.get("bench", "")) if s["status"] not in ("skip", "notrun") else []
        out += body or [f"Nothing measured: {s['note']}."]
    details = [(n, lines) for n, r, _, lines in rows if r == "fail" and lines]
    details += [(f"{s['name']} (its last lines)", logs.get(s["name"], "").splitlines()[-20:])
                for s in stages
                if s["name"] != "bench" and (s["status"] == "timeout" or (
                    s["status"] == "fail" and s["name"] in ("libraries", "build")))]
    if details:
        out += ["", "## What failed", ""]
        for name, lines in details:
            out += [f"{name}:", "", "```"] + lines[-40:] + ["```", ""]
    out += ["", f"The full output of every stage: {os.path.basename(path)[:-3]}.log, beside this file.",
            ""]
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write("\n".join(out))
    os.replace(tmp, path)


if __name__ == "__main__":
    main()
