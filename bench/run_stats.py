"""run_stats.py — what bench/bench_cuda.sh reads back from a run directory: its median step
time (the first step dropped), the device memory in use after step 1, and plait check's
prediction of it (the backend's scratch and the CUDA context's allowance in it)."""
import json
import statistics


def ms(run):
    rows = [r for r in map(json.loads, open(run + "/metrics.jsonl")) if "ms" in r][1:]
    return statistics.median(r["ms"] for r in rows)


def rank0(run):
    return json.load(open(run + "/run.json"))["memory"]["ranks"][0]


def used(run):
    return rank0(run).get("device_used_bytes", 0)


def pred(run):
    return rank0(run)["predicted"]["total"]
