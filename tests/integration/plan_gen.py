#!/usr/bin/env python3
"""plan_gen.py — random plans for tests/integration/test_plan_property.sh.

    plan_gen.py --seed S --count N --dir DIR --train FILE --val FILE [--gpu]

Writes DIR/NNN-<what>.json, N plans from a fixed seed (the same seed, the same
plans): small GPT models that train a step in well under a second, over every
layout up to 8 ranks (and "auto"), every pipeline schedule, ZeRO 0-3, fp32 /
bf16 / fp8, device auto / cpu / cuda and backend auto / socket / nccl; about
half of them also broken in one field (a value out of range, of the wrong type,
an unknown key), every field of the schema in turn. It does not know plait's
rules: the deciders' agreement is the property, not a second copy of the rules.

DIR/cases.tsv has one line per plan, tab-separated:
    NAME  FILE  RANKS  POLICY  EXPECT
RANKS: the ranks this machine gives (plait check --gpus-per-node, plait train
--ranks). POLICY: the plugin's plugstack.conf arguments ("-": none). EXPECT:
where the deciders may legitimately differ, ";"-separated ("-": nowhere; a
REGEX holds no ";"):
  machine:REGEX  this machine (or the ranks it gives) cannot run the plan:
                 where plait check refuses with a message matching REGEX,
                 plait train must refuse matching it too (a one-rank plait
                 train finds out as it picks its device, in its own words),
                 and the plugin accepts: it checks at submit, before the job
                 has nodes, so it cannot know what they hold;
  policy:REGEX   where the plan is otherwise accepted, the plugin refuses it
                 matching REGEX: the cluster's policy (plugstack.conf), which
                 plait check and plait train do not know.
Anywhere else the three verdicts, and a refusal's field and reason, are the same.
"""
import argparse
import copy
import json
import os
import random

LAYOUTS = [(t, p, d) for t in range(1, 9) for p in range(1, 9) for d in range(1, 9) if t * p * d <= 8]
SCHEDULES = ["1f1b", "gpipe", "interleaved", "zb-h1"]


def valid_plan(r, train, val):
    """A plan that is mostly, not always, valid: the fields are drawn one by
    one, so the rules between them (tp divides heads, pp <= layers, ...) are
    met only by chance."""
    tp, pp, dp = r.choice(LAYOUTS)
    # most draws keep the rules between fields (tp divides the heads, a layer
    # per stage, warm-up within the steps), some break them by chance
    heads = r.choice([h for h in (1, 2, 4, 8) if h % tp == 0] or [8]) if r.random() < 0.8 \
        else r.choice([1, 2, 4, 8])
    hidden = heads * r.choice([4, 8, 16]) if heads < 8 else 64
    layers = r.choice([n for n in (1, 2, 4, 8) if n >= pp]) if r.random() < 0.85 \
        else r.choice([1, 2, 4, 8])
    schedule = r.choice(SCHEDULES)
    steps = r.choice([1, 1, 2])
    plan = {
        "model": {"layers": layers, "heads": heads, "hidden": hidden, "vocab": 256,
                  "seq_len": r.choice([8, 16, 32]), "seed": r.randrange(1 << 32)},
        "data": {"train": train},
        "batch": {"micro_batch": r.choice([1, 2, 4]), "grad_accum": r.choice([1, 2, 3, 4, 8])},
        "optimizer": {"lr": r.choice([1e-3, 3e-4, 6e-4]),
                      "schedule": r.choice(["constant", "cosine"]),
                      "warmup_steps": r.choice([0, 0, 0, 0, 1])},
        "steps": steps,
        "precision": r.choice(["fp32", "bf16", "fp8"]),
        "parallel": {"tp": tp, "pp": pp, "dp": dp, "zero": r.choice([0, 0, 1, 1, 2, 2, 3]),
                     "schedule": schedule},
    }
    par = plan["parallel"]
    if schedule == "interleaved":
        par["virtual_stages"] = r.choice([2, 2, 3, 4])
    for degree in ("tp", "pp", "dp"):
        if r.random() < 0.12:
            par[degree] = "auto"
    optional = [
        (0.3, lambda: par.__setitem__("device", r.choice(["auto", "cpu", "cpu", "cuda"]))),
        (0.2, lambda: par.__setitem__("backend", r.choice(["auto", "socket", "nccl"]))),
        (0.2, lambda: par.__setitem__("sequence_parallel", r.random() < 0.5)),
        (0.1, lambda: par.__setitem__("allow_tp_over_pcie", r.random() < 0.5)),
        (0.1, lambda: par.__setitem__("bucket_mb", r.choice([0.001, 1, 25]))),
        (0.1, lambda: par.__setitem__("timeout_s", r.choice([30, 300]))),
        (0.15, lambda: par.__setitem__("stage_layers", split(r, layers, pp))),
        (0.2, lambda: plan.__setitem__("recompute", r.choice(["none", "selective", "full"]))),
        (0.15, lambda: plan.__setitem__("fp8_scaling", r.choice(["tensor", "block"]))
         if plan["precision"] == "fp8" or r.random() < 0.2 else None),
        (0.3, lambda: plan["data"].update(val=val, val_every=r.choice([0, 1]), val_batches=1)),
        (0.1, lambda: plan["data"].__setitem__("shuffle", r.random() < 0.5)),
        (0.1, lambda: plan["model"].__setitem__("padded_vocab", r.choice([256, 384, 512]))),
        (0.1, lambda: plan["model"].__setitem__("max_seq_len", r.choice([32, 64]))),
        (0.1, lambda: plan["model"].__setitem__("arch", "gpt2")),
        (0.1, lambda: plan["optimizer"].update(beta1=0.8, beta2=0.99, eps=1e-6)),
        (0.1, lambda: plan["optimizer"].update(weight_decay=0.0, grad_clip=0.0, min_lr_ratio=0.5)),
        (0.2, lambda: plan.__setitem__("checkpoint", {
            "every": r.choice([0, 1]), "every_minutes": r.choice([0, 30]), "keep": r.choice([1, 3]),
            "max_restarts": r.choice([0, 3]), "async": r.random() < 0.3, "dir": "ckpt"})),
        (0.1, lambda: plan.__setitem__("sample", {
            "tokens": r.choice([0, 4]), "temperature": 0.8, "top_k": r.choice([0, 5]),
            "prompt": "The ", "seed": 3})),
    ]
    for p, apply in optional:
        if r.random() < p:
            apply()
    return plan


def split(r, layers, pp):
    """Layers per stage: most often adding up, sometimes not."""
    if pp > layers or r.random() < 0.2:
        return [1] * max(pp, 1)
    cuts = sorted(r.sample(range(1, layers), pp - 1)) if pp > 1 else []
    edges = [0] + cuts + [layers]
    return [b - a for a, b in zip(edges, edges[1:])]


# One way to break each field: (path, bad value). Wrong types, values out of
# range, an unknown name. Drawn in turn, so every field is broken in a run of
# this many broken plans or more.
BREAKS = [
    ("model", "gpt2"), ("model.arch", "llama"), ("model.layers", 0), ("model.heads", -2),
    ("model.hidden", "wide"), ("model.vocab", 70000), ("model.padded_vocab", 100),
    ("model.seq_len", 0), ("model.max_seq_len", 4), ("model.seed", -1),
    ("model.init", "/nonexistent/gpt2.bin"), ("model.hiden", 32),
    ("data", []), ("data.train", 5), ("data.val", True), ("data.shuffle", "yes"),
    ("data.val_every", 3), ("data.val_batches", 0), ("data.tokenizer", 7),
    ("batch.micro_batch", 0), ("batch.grad_accum", 1.5), ("batch.size", 4),
    ("optimizer.lr", -3e-4), ("optimizer.beta1", 1.0), ("optimizer.beta2", -0.1),
    ("optimizer.eps", 0), ("optimizer.weight_decay", -1), ("optimizer.grad_clip", "1"),
    ("optimizer.warmup_steps", 5), ("optimizer.schedule", "linear"),
    ("optimizer.min_lr_ratio", 2), ("steps", 0), ("precision", "fp16"),
    ("fp8_scaling", "row"), ("recompute", "some"),
    ("checkpoint.dir", 3), ("checkpoint.every", -1), ("checkpoint.every_minutes", -5),
    ("checkpoint.keep", 0), ("checkpoint.max_restarts", -1), ("checkpoint.async", 1),
    ("parallel.tp", 0), ("parallel.pp", "many"), ("parallel.dp", -1),
    ("parallel.allow_tp_over_pcie", "no"), ("parallel.zero", 4), ("parallel.device", "gpu"),
    ("parallel.schedule", "1f2b"), ("parallel.virtual_stages", 0), ("parallel.stage_layers", [0]),
    ("parallel.sequence_parallel", 1), ("parallel.bucket_mb", 0), ("parallel.timeout_s", -1),
    ("parallel.backend", "mpi"), ("sample.tokens", -1), ("sample.temperature", 0),
    ("sample.top_k", "all"), ("sample.prompt", 42), ("sample.seed", "x"), ("epochs", 3),
]


def break_field(plan, path, value):
    keys = path.split(".")
    node = plan
    for k in keys[:-1]:
        if not isinstance(node.get(k), dict):
            node[k] = {}
        node = node[k]
    node[keys[-1]] = value


def ranks_given(plan, r):
    """The ranks this machine gives: the plan's when it fixes them, else 1-8."""
    par = plan.get("parallel", {}) if isinstance(plan.get("parallel"), dict) else {}
    degrees = [par.get(k, 1) for k in ("tp", "pp", "dp")]
    if all(isinstance(d, int) and d >= 1 for d in degrees):
        n = degrees[0] * degrees[1] * degrees[2]
        if 1 <= n <= 8:
            return n
    return r.randint(1, 8)


def device_of(plan):
    par = plan.get("parallel")
    return par.get("device", "auto") if isinstance(par, dict) else "auto"


def expectations(plan, gpu):
    """Where the deciders may differ for this plan, and why (see the docstring)."""
    expect = []
    par = plan.get("parallel") if isinstance(plan.get("parallel"), dict) else {}
    if not gpu and par.get("device") == "cuda":
        expect.append('machine:parallel\\.device( is "cuda" but node .* has no GPU'
                      '|: "cuda" is not available)')
    if not gpu and par.get("device", "auto") == "auto" and par.get("backend") == "nccl":
        expect.append('machine:parallel\\.backend: "nccl" moves GPU memory, but '
                      '(the ranks on node .* train on its CPU|rank 0 trains on the CPU)')
    if "auto" in (par.get("tp"), par.get("pp"), par.get("dp")):
        # the ranks given (RANKS, drawn for an "auto" layout) may be too few
        expect.append("machine:(no layout of tp and pp fits these [0-9]+ slots"
                      "|tp [0-9]+ × pp [0-9]+ needs [0-9]+ ranks. the allocation has"  # (no ";" in EXPECT)
                      "|parallel: tp [0-9]+ × pp [0-9]+ = [0-9]+ ranks do not fit)")
    return expect


def policy_for(plan, r):
    """Now and then the cluster's policy, and whether it refuses this plan
    (as spank-plugin/policy.c words it): plait check and plait train know no
    cluster, so only the plugin refuses."""
    if r.random() >= 0.15:
        return "-", []
    kind = r.choice(["precision", "gpus", "checkpoint"])
    if kind == "precision":
        allowed = r.choice(["fp32", "fp32,bf16", "bf16,fp8"])
        refused = plan.get("precision", "fp32") not in allowed.split(",")
        return f"allowed_precisions={allowed}", (["policy:precision: .* is not allowed on "
                                                  "this cluster"] if refused else [])
    if kind == "gpus":
        most = r.choice([1, 2, 4])
        par = plan.get("parallel", {})
        degrees = [par.get(k, 1) for k in ("tp", "pp", "dp")]
        fixed = all(isinstance(d, int) for d in degrees)
        ranks = degrees[0] * degrees[1] * degrees[2] if fixed else 0  # "auto": not known yet
        return f"max_gpus_per_job={most}", (["policy:the plan needs [0-9]+ GPUs .*"
                                             "max_gpus_per_job"] if ranks > most else [])
    every = plan.get("checkpoint", {}).get("every", 0)
    refused = every == 0 and plan.get("steps", 1) > 1 or every > 1
    return "min_checkpoint_every=1", (["policy:checkpoint\\.every: .*min_checkpoint_every"]
                                      if refused else [])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("--count", type=int, required=True)
    ap.add_argument("--dir", required=True)
    ap.add_argument("--train", required=True)
    ap.add_argument("--val", required=True)
    ap.add_argument("--gpu", action="store_true", help="this machine has a GPU")
    a = ap.parse_args()
    r = random.Random(a.seed)
    os.makedirs(a.dir, exist_ok=True)
    broken = 0
    with open(os.path.join(a.dir, "cases.tsv"), "w") as cases:
        for i in range(a.count):
            plan = valid_plan(r, a.train, a.val)
            what = "drawn"
            if r.random() < 0.5:
                path, value = BREAKS[broken % len(BREAKS)]
                broken += 1
                break_field(plan, path, copy.deepcopy(value))
                what = "broken-" + path
            name = f"{i:03d}-{what}"
            file = os.path.join(a.dir, name + ".json")
            with open(file, "w") as f:
                json.dump(plan, f, indent=1)
            ranks = ranks_given(plan, r)
            policy, refusals = policy_for(plan, r)
            expect = expectations(plan, a.gpu) + refusals
            cases.write(f"{name}\t{file}\t{ranks}\t{policy}\t{';'.join(expect) or '-'}\n")


if __name__ == "__main__":
    main()
