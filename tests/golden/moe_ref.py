#!/usr/bin/python3
"""moe_ref.py — the numerical referee for plait-train's mixture of experts
(model.moe), in float64, written from the definition in issue 23:

  router: logits = x·W_r (no bias); p = softmax(logits) over the E experts;
  the k largest p (ties to the lower index); gates = those k p renormalised
  to sum to 1; output = Σ gate·expert(x) + Σ shared experts(x) (gate 1);
  with a capacity, expert e takes at most ceil(capacity_factor·k·N/E) of a
  micro-batch's N tokens in token order and the rest skip it (their other
  choices still count); balance loss = aux_loss·E·Σ_e f_e·P_e, f_e the
  fraction of the k·N choices that went to e, P_e the mean p_e over the N
  tokens; z-loss = router_z_loss·mean(logsumexp(logits)²); both added to the
  cross-entropy of every micro-batch, for each MoE layer (layer l when
  l % every = every − 1). An expert is the arch's MLP: GELU (tanh) with
  biases for gpt2, SwiGLU without biases for llama.

model.init takes no experts, so a case starts from the weights plait drew
(its PLAIT_DUMP_STEP1 writes them on one rank as dump/params.f32, in
gpt2_layout.h's order): the referee reads those, trains the case's steps
itself and checks the run's step-1 logits, step-1 gradients and every step's
loss, lr and grad_norm. The data, the learning rate, AdamW, clipping and the
tolerances are gpt2_ref.py's; the dense block is gpt2_ref.py's (gpt2) and
llama_ref.py's (llama).

  moe_ref.py case OUTDIR [--arch gpt2|llama] [options]   plan.json, train_*.bin, case.json
  moe_ref.py compare CASEDIR RUNDIR   RUNDIR/dump/{params,logits,grads}.f32 and
      RUNDIR/metrics.jsonl; exit 1 on any failed check
  moe_ref.py selftest   the routing against a loop over tokens
"""

import argparse
import json
import math
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpt2_ref as g  # noqa: E402  (formats, loader, lr, clipping, tolerances)
import llama_ref as lr  # noqa: E402  (RMSNorm, rotary positions, grouped-query attention)


# ---------------------------------------------------------------- the tensors

def moe_layer(c, l):
    return l % c.every == c.every - 1


def param_shapes(c):
    """(name, shape) in plait's order (common/gpt2/gpt2_layout.h): the dense tensors,
    the MLP's over the layers without an MoE block, then the router's and experts'."""
    L, C, Vp, E, X, Fm = c.L, c.C, c.Vp, c.E, c.E + c.S, c.Fm
    Lm = sum(moe_layer(c, l) for l in range(L))
    Ld = L - Lm
    if c.arch == "gpt2":
        return [("wte", (Vp, C)), ("wpe", (c.maxT, C)), ("ln1w", (L, C)), ("ln1b", (L, C)),
                ("qkvw", (L, 3 * C, C)), ("qkvb", (L, 3 * C)), ("attprojw", (L, C, C)),
                ("attprojb", (L, C)), ("ln2w", (L, C)), ("ln2b", (L, C)),
                ("fcw", (Ld, 4 * C, C)), ("fcb", (Ld, 4 * C)), ("fcprojw", (Ld, C, 4 * C)),
                ("fcprojb", (Ld, C)), ("lnfw", (C,)), ("lnfb", (C,)), ("routerw", (Lm, E, C)),
                ("expfcw", (Lm, X, Fm, C)), ("expfcb", (Lm, X, Fm)),
                ("expprojw", (Lm, X, C, Fm)), ("expprojb", (Lm, X, C))]
    qkv = (c.NH + 2 * c.KV) * (C // c.NH)
    return [("wte", (Vp, C)), ("ln1w", (L, C)), ("qkvw", (L, qkv, C)), ("attprojw", (L, C, C)),
            ("ln2w", (L, C)), ("fcw", (Ld, 2 * c.F, C)), ("fcprojw", (Ld, C, c.F)),
            ("lnfw", (C,)), ("lmhead", (Vp, C)), ("routerw", (Lm, E, C)),
            ("expfcw", (Lm, X, 2 * Fm, C)), ("expprojw", (Lm, X, C, Fm))]


DECAYED = {"wte", "wpe", "qkvw", "attprojw", "fcw", "fcprojw", "lmhead", "routerw", "expfcw",
           "expprojw"}
GLOBAL = {"wte", "wpe", "lnfw", "lnfb", "lmhead"}


def split_flat(flat, c):
    out, off = {}, 0
    for n, s in param_shapes(c):
        k = int(np.prod(s))
        out[n] = flat[off:off + k].reshape(s)
        off += k
    assert off == flat.size, (off, flat.size)
    return out


def leaves_of(arrays):
    """name -> a leaf, or a list of one leaf per layer (stacked tensors)."""
    P = {}
    for n, a in arrays.items():
        t = torch.tensor(np.asarray(a, dtype=np.float64))
        P[n] = t.requires_grad_(True) if n in GLOBAL else [x.clone().requires_grad_(True) for x in t]
    return P


def flat_leaves(P, names):
    return [t for n in names for t in (P[n] if isinstance(P[n], list) else [P[n]])]


# ---------------------------------------------------------------- the model

def top_k_lower_first(p, k):
    """The k largest of each row, largest first, a tie to the lower index: a stable
    sort of -p keeps equal values in index order."""
    return torch.sort(-p.detach(), dim=-1, stable=True).indices[:, :k]


def capacity_keep(choice, c, N):
    """(N,k) bool: each choice kept unless its expert already took its capacity of
    the tokens before it (token order, then choice order)."""
    keep = torch.ones(choice.shape, dtype=torch.bool)
    if c.capacity <= 0:
        return keep
    cap = math.ceil(c.capacity * c.k * N / c.E)
    taken = [0] * c.E
    for t in range(N):
        for j in range(c.k):
            e = int(choice[t, j])
            keep[t, j] = taken[e] < cap
            taken[e] += int(keep[t, j])
    return keep


def expert(c, W, x):
    """The arch's MLP: W = (fc, fcb, proj, projb), biases None for a Llama."""
    fc, fcb, proj, projb = W
    h = F.linear(x, fc, fcb)
    if c.arch == "gpt2":
        a = F.gelu(h, approximate="tanh")
    else:
        gate, up = h.split([c.Fm, c.Fm], dim=-1)
        a = F.silu(gate) * up
    return F.linear(a, proj, projb)


def moe_block(c, P, m, h):
    """MoE layer m's block on h (B,T,C) -> (output (B,T,C), balance loss, z-loss)."""
    B, T, C = h.shape
    N = B * T
    x = h.reshape(N, C)
    logits = x @ P["routerw"][m].T
    p = logits.softmax(-1)
    choice = top_k_lower_first(p, c.k)
    chosen = p.gather(1, choice)
    gates = chosen / chosen.sum(-1, keepdim=True)
    keep = capacity_keep(choice, c, N)

    def weights(e):
        b = (lambda n: P[n][m][e]) if c.arch == "gpt2" else (lambda n: None)
        return P["expfcw"][m][e], b("expfcb"), P["expprojw"][m][e], b("expprojb")
    out = torch.zeros_like(x)
    for e in range(c.E):
        sel = (choice == e) & keep  # (N,k): at most one per row
        if sel.any():
            g_e = (gates * sel).sum(-1, keepdim=True)
            out = out + g_e * expert(c, weights(e), x)
    for s in range(c.S):
        out = out + expert(c, weights(c.E + s), x)
    f = torch.stack([(choice == e).sum() for e in range(c.E)]).to(x.dtype) / (c.k * N)
    balance = c.aux * c.E * (f * p.mean(0)).sum()
    z = c.z * (torch.logsumexp(logits, -1) ** 2).mean()
    return out.view(B, T, C), balance, z


def forward(c, P, idx):
    """idx (B,T) -> (logits (B,T,Vp), the MoE losses summed over layers)."""
    B, T = idx.shape
    C, m, aux = c.C, 0, 0.0
    if c.arch == "gpt2":
        x = F.embedding(idx, P["wte"]) + P["wpe"][:T]
    else:
        x = F.embedding(idx, P["wte"])
        hs = C // c.NH
        cos, sin = lr.rope_cos_sin(T, hs, c.theta, x.dtype)
    d = 0  # the next dense MLP's index
    for l in range(c.L):
        if c.arch == "gpt2":
            h = F.layer_norm(x, (C,), P["ln1w"][l], P["ln1b"][l], 1e-5)
            qkv = F.linear(h, P["qkvw"][l], P["qkvb"][l])
            x = x + F.linear(g.causal_attention(qkv, c.NH), P["attprojw"][l], P["attprojb"][l])
            h = F.layer_norm(x, (C,), P["ln2w"][l], P["ln2b"][l], 1e-5)
        else:
            h = lr.rms_norm(x, P["ln1w"][l], c.eps)
            q, k, v = F.linear(h, P["qkvw"][l]).split([c.NH * hs, c.KV * hs, c.KV * hs], dim=-1)

            def rot(t, n):
                t = t.view(B, T, n, hs)
                return (t * cos[:, None] + lr.rotate_half(t) * sin[:, None]).reshape(B, T, n * hs)
            x = x + F.linear(lr.attention(rot(q, c.NH), rot(k, c.KV), v, c.NH, c.KV),
                             P["attprojw"][l])
            h = lr.rms_norm(x, P["ln2w"][l], c.eps)
        if moe_layer(c, l):
            y, balance, z = moe_block(c, P, m, h)
            aux, m = aux + balance + z, m + 1
        elif c.arch == "gpt2":
            y = expert(c._replace_dense(), (P["fcw"][d], P["fcb"][d], P["fcprojw"][d],
                                            P["fcprojb"][d]), h)
            d += 1
        else:
            y = expert(c._replace_dense(), (P["fcw"][d], None, P["fcprojw"][d], None), h)
            d += 1
        x = x + y
    if c.arch == "gpt2":
        x = F.layer_norm(x, (C,), P["lnfw"], P["lnfb"], 1e-5)
        return F.linear(x, P["wte"]), aux
    return F.linear(lr.rms_norm(x, P["lnfw"], c.eps), P["lmhead"]), aux


class Case(g.Config):
    def _replace_dense(self):
        """The same arch with the dense MLP's width in place of an expert's."""
        d = Case(**self.__dict__)
        d.Fm = self.F if self.arch == "llama" else 4 * self.C
        return d


# ---------------------------------------------------------------- training

def train(casedir, c, arrays):
    """The case's steps from arrays: (step-1 logits, step-1 gradients by name, metrics)."""
    P = leaves_of(arrays)
    names = [n for n, _ in param_shapes(c)]
    params = flat_leaves(P, names)
    opt = torch.optim.AdamW(
        [{"params": flat_leaves(P, [n for n in names if n in DECAYED]),
          "weight_decay": c.weight_decay},
         {"params": flat_leaves(P, [n for n in names if n not in DECAYED]), "weight_decay": 0.0}],
        lr=c.lr, betas=(c.beta1, c.beta2), eps=c.eps_adam)
    shards = sorted(os.path.join(casedir, f) for f in os.listdir(casedir)
                    if f.startswith("train_") and f.endswith(".bin"))

    def grads():
        return {n: np.zeros(shape) if not np.prod(shape) else
                (torch.stack([t.grad for t in P[n]]) if isinstance(P[n], list)
                 else P[n].grad).detach().numpy().copy() for n, shape in param_shapes(c)}
    return g.train_steps(c, g.ShardLoader(shards, c.B, c.T), params, opt,
                         lambda x: forward(c, P, x), grads)


# ---------------------------------------------------------------- case

def plan_for(c):
    model = {"arch": c.arch, "layers": c.L, "heads": c.NH, "hidden": c.C, "vocab": c.V,
             "padded_vocab": c.Vp, "seq_len": c.T, "max_seq_len": c.maxT, "seed": c.seed,
             "moe": {"experts": c.E, "top_k": c.k, "every": c.every, "shared_experts": c.S,
                     "capacity_factor": c.capacity, "aux_loss": c.aux, "router_z_loss": c.z,
                     "ffn_hidden": c.Fm}}
    if c.arch == "llama":
        model.update({"kv_heads": c.KV, "ffn_hidden": c.F})
    plan = lr.plan_for(c)  # the data, batch, optimizer and steps as the Llama referee's
    plan["model"] = model  # (its weights are plait's own: no model.init)
    return plan


def make_case(outdir, c):
    os.makedirs(outdir, exist_ok=True)
    gen = torch.Generator().manual_seed(c.data_seed)
    for i, n in enumerate(g.shard_lengths(c)):
        g.write_tokens(os.path.join(outdir, f"train_{i:03d}.bin"),
                       torch.randint(0, c.V, (n,), generator=gen).numpy())
    with open(os.path.join(outdir, "case.json"), "w") as f:
        json.dump(c.__dict__, f, indent=1)
    with open(os.path.join(outdir, "plan.json"), "w") as f:
        json.dump(plan_for(c), f, indent=2)
    print(f"case {outdir}: {c.arch} L={c.L} C={c.C} E={c.E} k={c.k} every={c.every} S={c.S} "
          f"capacity={c.capacity} aux={c.aux} z={c.z} Fm={c.Fm} B={c.B} T={c.T} A={c.A}")


# ---------------------------------------------------------------- compare

def compare(casedir, rundir, out=sys.stdout):
    with open(os.path.join(casedir, "case.json")) as f:
        c = Case(**json.load(f))
    tol = g.FP32_TOL
    shapes = param_shapes(c)
    n_params = sum(int(np.prod(s)) for _, s in shapes)
    rows = g.Rows()
    params, problem = g.read_f32(os.path.join(rundir, "dump", "params.f32"), n_params)
    if params is None:
        print(f"moe_ref compare {rundir}: {problem}", file=out)
        return False
    logits0, grads1, ref_metrics = train(casedir, c, split_flat(params, c))
    logits, p1 = g.read_f32(os.path.join(rundir, "dump", "logits.f32"), logits0.size)
    grads, p2 = g.read_f32(os.path.join(rundir, "dump", "grads.f32"), n_params)
    if logits is None:
        rows.add("logits", None, None, False, p1)
    else:
        e = g.rel_norm(logits, logits0)
        rows.add("logits", e, 1e-5, e <= 1e-5)
    run_grads = split_flat(grads, c) if grads is not None else None
    for n, shape in shapes:
        if not np.prod(shape):  # the dense MLP of a model whose every layer is MoE
            continue
        if run_grads is None:
            rows.add("grads." + n, None, None, False, p2)
        elif np.linalg.norm(grads1[n]) == 0:
            rows.add("grads." + n, None, None, False, "the referee's gradient is zero (a weak case)")
        else:
            e = g.rel_norm(run_grads[n], grads1[n])
            rows.add("grads." + n, e, tol["tensor"], e <= tol["tensor"])
    g.compare_run_metrics(rows, rundir, {m["step"]: m for m in ref_metrics}, tol)
    return rows.print(f"moe_ref compare {rundir} against {casedir}:", out)


# ---------------------------------------------------------------- selftest

def selftest():
    """The routing against a loop over tokens: top-k ties to the lower index, gates
    renormalised, the capacity in token order, f counting dropped choices."""
    ok = True
    p = torch.tensor([[0.3, 0.3, 0.4], [0.2, 0.5, 0.3], [0.25, 0.25, 0.5]], dtype=torch.float64)
    ok &= top_k_lower_first(p, 2).tolist() == [[2, 0], [1, 2], [2, 0]]
    c = Case(E=3, k=2, capacity=0.5)  # ceil(0.5·2·3/3) = 1 token an expert
    keep = capacity_keep(top_k_lower_first(p, 2), c, 3)
    ok &= keep.tolist() == [[True, True], [True, False], [False, False]]
    print(f"moe_ref selftest: {'ok' if ok else 'FAILED'}")
    return ok


# ---------------------------------------------------------------- main

def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    cp = sub.add_parser("case")
    cp.add_argument("outdir")
    cp.add_argument("--arch", choices=["gpt2", "llama"], default="gpt2")
    for name, typ, default in [("layers", int, 2), ("heads", int, 4), ("kv-heads", int, 2),
                               ("hidden", int, 32), ("ffn", int, 40), ("vocab", int, 100),
                               ("padded-vocab", int, 128), ("seq-len", int, 16),
                               ("max-seq-len", int, 32), ("batch", int, 2),
                               ("grad-accum", int, 2), ("steps", int, 6), ("lr", float, 1e-3),
                               ("warmup", int, 2), ("weight-decay", float, 0.1),
                               ("grad-clip", float, 1.0), ("experts", int, 4), ("top-k", int, 2),
                               ("every", int, 1), ("shared", int, 0), ("capacity", float, 0.0),
                               ("aux", float, 0.01), ("z", float, 0.0), ("moe-ffn", int, 24),
                               ("seed", int, 7), ("data-seed", int, 0)]:
        cp.add_argument("--" + name, type=typ, default=default)
    cm = sub.add_parser("compare")
    cm.add_argument("casedir")
    cm.add_argument("rundir")
    sub.add_parser("selftest")
    a = p.parse_args()
    if a.cmd == "selftest":
        sys.exit(0 if selftest() else 1)
    if a.cmd == "compare":
        sys.exit(0 if compare(a.casedir, a.rundir) else 1)
    c = Case(arch=a.arch, L=a.layers, NH=a.heads, KV=a.kv_heads, C=a.hidden, F=a.ffn, V=a.vocab,
             Vp=a.padded_vocab, maxT=a.max_seq_len, T=a.seq_len, B=a.batch, A=a.grad_accum,
             steps=a.steps, lr=a.lr, warmup=a.warmup, schedule="cosine", min_lr_ratio=0.1,
             weight_decay=a.weight_decay, grad_clip=a.grad_clip, beta1=0.9, beta2=0.95,
             eps_adam=1e-8, eps=1e-5, theta=10000.0, seed=a.seed, data_seed=a.data_seed,
             E=a.experts, k=a.top_k, every=a.every, S=a.shared, capacity=a.capacity, aux=a.aux,
             z=a.z, Fm=a.moe_ffn, precision="fp32")
    make_case(a.outdir, c)


if __name__ == "__main__":
    main()
