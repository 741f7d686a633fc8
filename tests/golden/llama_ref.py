#!/usr/bin/python3
"""llama_ref.py — the numerical referee for plait-train's Llama (model.arch
"llama"): an independent PyTorch LlamaForCausalLM, written from transformers'
definitions (RMSNorm, rotary positions with rotate_half, grouped-query
attention through repeat_kv, SwiGLU MLP, untied head), that writes a small
random case as a Hugging Face model directory (config.json, sharded
safetensors with an index: the files plait imports through model.init) and
reference logits, gradients and step metrics, then compares a plait run
against them.

It shares no code with plait: it reads only the files plait reads and
plait's outputs. The formats, the data loader, the learning rate, the
clipping and the tolerances are gpt2_ref.py's (the same referee rules).

Run it with Debian's /usr/bin/python3:
  llama_ref.py case OUTDIR [--precision fp32|bf16] [options, see case --help]
      OUTDIR/init/ (config.json, model-0000{1,2}-of-00002.safetensors,
      model.safetensors.index.json), train_00[01].bin, plan.json and
      OUTDIR/ref/{logits.f32,grads.f32,metrics.json}
  llama_ref.py compare CASEDIR RUNDIR   reads RUNDIR/dump/{logits,grads}.f32
      and RUNDIR/metrics.jsonl; exit 1 on any failed check. Any layout whose
      global batch is the case's (gpt2_ref.py compare says how windows map).
  llama_ref.py selftest             the model against a direct formula, and
      compare failing a wrong run
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

# Tensors in plait's order (common/gpt2/gpt2_layout.h: a Llama fills GPT-2's
# tensors, q/k/v packed in qkvw, gate/up in fcw; no biases, no wpe).
PARAM_NAMES = ["wte", "ln1w", "qkvw", "attprojw", "ln2w", "fcw", "fcprojw", "lnfw", "lmhead"]
LAYERED = {"ln1w", "qkvw", "attprojw", "ln2w", "fcw", "fcprojw"}
DECAYED = {"wte", "qkvw", "attprojw", "fcw", "fcprojw", "lmhead"}
NORMS = {"ln1w", "ln2w", "lnfw"}


def param_shapes(c):
    """(name, shape) in plait's order; a tied model (c.tie) has no lmhead."""
    L, C, Vp, F_, hs = c.L, c.C, c.Vp, c.F, c.C // c.NH
    qkv = (c.NH + 2 * c.KV) * hs
    head = [] if getattr(c, "tie", False) else [("lmhead", (Vp, C))]
    return [("wte", (Vp, C)), ("ln1w", (L, C)), ("qkvw", (L, qkv, C)), ("attprojw", (L, C, C)),
            ("ln2w", (L, C)), ("fcw", (L, 2 * F_, C)), ("fcprojw", (L, C, F_)),
            ("lnfw", (C,))] + head


def names_of(c):
    return [n for n, _ in param_shapes(c)]


# ---------------------------------------------------------------- the model

def rms_norm(x, w, eps):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def rope_cos_sin(T, hs, theta, dtype):
    inv_freq = 1.0 / (theta ** (torch.arange(0, hs, 2, dtype=torch.float64) / hs))
    freqs = torch.outer(torch.arange(T, dtype=torch.float64), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def attention(q, k, v, NH, KV):
    """q (B,T,NH·hs), k and v (B,T,KV·hs) -> (B,T,NH·hs); causal, repeat_kv."""
    B, T, C = q.shape
    hs = C // NH
    q = q.view(B, T, NH, hs).transpose(1, 2)
    k = k.view(B, T, KV, hs).transpose(1, 2).repeat_interleave(NH // KV, dim=1)
    v = v.view(B, T, KV, hs).transpose(1, 2).repeat_interleave(NH // KV, dim=1)
    att = (q @ k.transpose(-2, -1)) / math.sqrt(hs)
    att = att.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf")).softmax(-1)
    return (att @ v).transpose(1, 2).reshape(B, T, C)


def llama_logits(P, idx, c, linear=F.linear):
    """idx (B,T) -> logits (B,T,Vp); linear(x, w, None) is every product."""
    T, hs = idx.shape[1], c.C // c.NH
    cos, sin = rope_cos_sin(T, hs, c.theta, P["wte"].dtype)
    x = F.embedding(idx, P["wte"])
    for l in range(c.L):
        h = rms_norm(x, P["ln1w"][l], c.eps)
        qkv = linear(h, P["qkvw"][l], None)
        q, k, v = qkv.split([c.NH * hs, c.KV * hs, c.KV * hs], dim=-1)
        B = q.shape[0]

        def rot(t, n):
            t = t.view(B, T, n, hs)
            return (t * cos[:, None] + rotate_half(t) * sin[:, None]).reshape(B, T, n * hs)
        x = x + linear(attention(rot(q, c.NH), rot(k, c.KV), v, c.NH, c.KV), P["attprojw"][l],
                       None)
        h = rms_norm(x, P["ln2w"][l], c.eps)
        gate, up = linear(h, P["fcw"][l], None).split([c.F, c.F], dim=-1)
        x = x + linear(F.silu(gate) * up, P["fcprojw"][l], None)
    head = P["wte"] if getattr(c, "tie", False) else P["lmhead"]
    return linear(rms_norm(x, P["lnfw"], c.eps), head, None)


# ---------------------------------------------------------------- Hugging Face files

def hf_tensors(c, arrays):
    """transformers' names -> float32 arrays (the vocabulary's real rows only)."""
    hs = c.C // c.NH
    out = {"model.embed_tokens.weight": arrays["wte"][:c.V], "model.norm.weight": arrays["lnfw"]}
    if "lmhead" in arrays:
        out["lm_head.weight"] = arrays["lmhead"][:c.V]
    for l in range(c.L):
        p = f"model.layers.{l}."
        q, k, v = np.split(arrays["qkvw"][l], [c.NH * hs, (c.NH + c.KV) * hs])
        gate, up = np.split(arrays["fcw"][l], [c.F])
        out.update({p + "input_layernorm.weight": arrays["ln1w"][l],
                    p + "self_attn.q_proj.weight": q, p + "self_attn.k_proj.weight": k,
                    p + "self_attn.v_proj.weight": v,
                    p + "self_attn.o_proj.weight": arrays["attprojw"][l],
                    p + "post_attention_layernorm.weight": arrays["ln2w"][l],
                    p + "mlp.gate_proj.weight": gate, p + "mlp.up_proj.weight": up,
                    p + "mlp.down_proj.weight": arrays["fcprojw"][l]})
    return out


def write_hf(d, c, arrays):
    """config.json and two safetensors shards with their index."""
    os.makedirs(d, exist_ok=True)
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
              "hidden_size": c.C, "intermediate_size": c.F, "num_attention_heads": c.NH,
              "num_key_value_heads": c.KV, "num_hidden_layers": c.L, "vocab_size": c.V,
              "max_position_embeddings": c.maxT, "rms_norm_eps": c.eps, "rope_theta": c.theta,
              "tie_word_embeddings": bool(getattr(c, "tie", False)), "torch_dtype": "float32",
              "hidden_act": "silu",
              "attention_bias": False, "mlp_bias": False}
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    tensors = hf_tensors(c, arrays)
    names = sorted(tensors)
    files = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    weight_map = {n: files[i % 2] for i, n in enumerate(names)}
    for fname in files:
        g.write_safetensors(os.path.join(d, fname),
                          {n: tensors[n] for n in names if weight_map[n] == fname})
    total = sum(int(np.asarray(t).size) * 4 for t in tensors.values())
    with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=1)


# ---------------------------------------------------------------- case

def init_weights(c, gen):
    def normal(shape, std, mean=0.0):
        return (mean + std * torch.randn(shape, generator=gen, dtype=torch.float64)).numpy()
    arrays = {n: normal(s, 0.1, 1.0) if n in NORMS else normal(s, 0.02)
              for n, s in param_shapes(c)}
    arrays["wte"][c.V:] = 0  # padding: what an import of V rows leaves
    if "lmhead" in arrays:
        arrays["lmhead"][c.V:] = 0
    return {n: a.astype(np.float32) for n, a in arrays.items()}


def unstack(arrays, dtype):
    def leaf(a):
        return torch.tensor(np.asarray(a), dtype=dtype).requires_grad_(True)
    return {n: [leaf(a) for a in arrays[n]] if n in LAYERED else leaf(arrays[n])
            for n in PARAM_NAMES if n in arrays}


def leaves(P, names):
    return [t for n in PARAM_NAMES if n in names and n in P
            for t in (P[n] if n in LAYERED else [P[n]])]


def train(casedir, c, arrays, dtype, linear):
    P = unstack(arrays, dtype)
    params = leaves(P, PARAM_NAMES)
    opt = torch.optim.AdamW(
        [{"params": leaves(P, DECAYED), "weight_decay": c.weight_decay},
         {"params": leaves(P, set(PARAM_NAMES) - DECAYED), "weight_decay": 0.0}],
        lr=c.lr, betas=(c.beta1, c.beta2), eps=c.eps_adam)
    shards = sorted(os.path.join(casedir, f) for f in os.listdir(casedir)
                    if f.startswith("train_") and f.endswith(".bin"))
    return g.train_steps(
        c, g.ShardLoader(shards, c.B, c.T), params, opt,
        lambda x: (llama_logits(P, x, c, linear), 0),
        lambda: {n: (torch.stack([t.grad for t in P[n]]) if n in LAYERED else P[n].grad)
                 .detach().to(torch.float32).numpy().copy() for n in P})


def plan_for(c):
    return {
        "model": {"arch": "llama", "init": "init", "seq_len": c.T, "seed": 1,
                  "padded_vocab": c.Vp},
        "data": {"train": "train_*.bin", "shuffle": False},
        "batch": {"micro_batch": c.B, "grad_accum": c.A},
        "optimizer": {"lr": c.lr, "beta1": c.beta1, "beta2": c.beta2, "eps": c.eps_adam,
                      "weight_decay": c.weight_decay, "grad_clip": c.grad_clip,
                      "warmup_steps": c.warmup, "schedule": c.schedule,
                      "min_lr_ratio": c.min_lr_ratio},
        "steps": c.steps, "precision": c.precision, "checkpoint": {"every": 0, "keep": 1},
    }


def make_case(outdir, c):
    os.makedirs(outdir, exist_ok=True)
    gen = torch.Generator().manual_seed(c.seed)
    arrays = init_weights(c, gen)
    write_hf(os.path.join(outdir, "init"), c, arrays)
    for i, n in enumerate(g.shard_lengths(c)):
        g.write_tokens(os.path.join(outdir, f"train_{i:03d}.bin"),
                       torch.randint(0, c.V, (n,), generator=gen).numpy())
    linear = g.bf16_linear if c.precision == "bf16" else F.linear
    # clipping must act on some steps and not on others (as gpt2_ref.py's cases)
    for _ in range(6):
        logits0, grads1, metrics = train(outdir, c, arrays, torch.float64, linear)
        norms = sorted(m["grad_norm"] for m in metrics)
        if 0 < sum(n > c.grad_clip for n in norms) < len(norms):
            break
        c.grad_clip = float(f"{(norms[len(norms) // 2 - 1] + norms[len(norms) // 2]) / 2:.4g}")
    else:
        raise SystemExit("llama_ref: no grad_clip clips only some steps")
    d = os.path.join(outdir, "ref")
    os.makedirs(d, exist_ok=True)
    logits0.astype("<f4").tofile(os.path.join(d, "logits.f32"))
    with open(os.path.join(d, "grads.f32"), "wb") as f:
        for n, shape in param_shapes(c):
            assert grads1[n].shape == shape, (n, grads1[n].shape, shape)
            f.write(grads1[n].astype("<f4").tobytes())
    with open(os.path.join(d, "metrics.json"), "w") as f:
        json.dump(metrics, f, indent=1)
    with open(os.path.join(outdir, "case.json"), "w") as f:
        json.dump(c.__dict__, f, indent=1)
    with open(os.path.join(outdir, "plan.json"), "w") as f:
        json.dump(plan_for(c), f, indent=2)
    print(f"case {outdir}: llama {c.precision} L={c.L} NH={c.NH} KV={c.KV} C={c.C} F={c.F} "
          f"V={c.V} Vp={c.Vp} T={c.T} B={c.B} A={c.A} steps={c.steps}")
    for m in metrics:
        print(f"  step {m['step']:3d}  loss {m['loss']:.6f}  lr {m['lr']:.6e}  "
              f"grad_norm {m['grad_norm']:.6f}")


# ---------------------------------------------------------------- compare

# fp32 logits: the Hugging Face import's bound (a fixed batch through the
# imported weights within 1e-5 relative), tighter than the training bound.
LOGITS_FP32_TOL = 1e-5


def compare(casedir, rundir, out=sys.stdout):
    with open(os.path.join(casedir, "case.json")) as f:
        c = g.Config(**json.load(f))
    tol = g.BF16_TOL if c.precision == "bf16" else g.FP32_TOL
    shapes = param_shapes(c)
    n_grads = sum(int(np.prod(s)) for _, s in shapes)
    rows = g.Rows()
    ref_logits = np.fromfile(os.path.join(casedir, "ref", "logits.f32"), dtype="<f4")
    ref_grads = np.fromfile(os.path.join(casedir, "ref", "grads.f32"), dtype="<f4")
    with open(os.path.join(casedir, "ref", "metrics.json")) as f:
        ref_metrics = {m["step"]: m for m in json.load(f)}
    logits, p1 = g.read_f32(os.path.join(rundir, "dump", "logits.f32"), ref_logits.size)
    grads, p2 = g.read_f32(os.path.join(rundir, "dump", "grads.f32"), n_grads)
    if logits is None:
        rows.add("logits", None, None, False, p1)
    else:
        lt = LOGITS_FP32_TOL if c.precision == "fp32" else tol["tensor"]
        e = g.rel_norm(logits, ref_logits)
        rows.add("logits", e, lt, e <= lt)
    off = 0
    for n, shape in shapes:
        k = int(np.prod(shape))
        if grads is None:
            rows.add("grads." + n, None, None, False, p2)
        else:
            e = g.rel_norm(grads[off:off + k], ref_grads[off:off + k])
            rows.add("grads." + n, e, tol["tensor"], e <= tol["tensor"])
        off += k
    g.compare_run_metrics(rows, rundir, ref_metrics, tol)
    return rows.print(f"llama_ref compare {rundir} against {casedir} ({c.precision}):", out)


# ---------------------------------------------------------------- selftest

def selftest():
    """The model's pieces against direct formulas, and compare catching a wrong run."""
    ok = True
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 2, 4, generator=gen, dtype=torch.float64)  # (B,T,heads,hs)
    cos, sin = rope_cos_sin(3, 4, 10000.0, torch.float64)
    got = x * cos[:, None] + rotate_half(x) * sin[:, None]
    for t in range(3):  # pair (i, i+hs/2) rotated by t·theta^(-2i/hs)
        for i in range(2):
            a = t * 10000.0 ** (-2 * i / 4)
            x0, x1 = x[:, t, :, i], x[:, t, :, i + 2]
            want0, want1 = x0 * math.cos(a) - x1 * math.sin(a), x1 * math.cos(a) + x0 * math.sin(a)
            ok &= torch.allclose(got[:, t, :, i], want0) and torch.allclose(got[:, t, :, i + 2],
                                                                            want1)
    q = torch.randn(1, 3, 8, generator=gen, dtype=torch.float64)
    kv = torch.randn(1, 3, 4, generator=gen, dtype=torch.float64)
    # grouped-query: 4 query heads over 2 key/value heads = multi-head with k, v repeated
    rep = kv.view(1, 3, 2, 2).repeat_interleave(2, dim=2).reshape(1, 3, 8)
    ok &= torch.allclose(attention(q, kv, kv, 4, 2), attention(q, rep, rep, 4, 4))
    print(f"llama_ref selftest: {'ok' if ok else 'FAILED'}")
    return ok


# ---------------------------------------------------------------- bench

def bench(a):
    """Median time of full fp32 training steps of a Llama on random tokens
    (forward, backward, clipping, AdamW, zero_grad), as gpt2_ref.py bench
    times GPT-2's: --steps timed steps after --warmup-steps untimed ones."""
    import time
    torch.set_num_threads(a.threads)
    c = g.Config(L=a.layers, NH=a.heads, KV=a.kv_heads, C=a.hidden, F=a.ffn, V=a.vocab,
                 Vp=a.padded_vocab, T=a.seq_len, B=a.batch, eps=1e-5, theta=10000.0)
    gen = torch.Generator().manual_seed(0)
    arrays = {n: np.ones(s, np.float32) if n in NORMS else
              (0.02 * torch.randn(s, generator=gen)).numpy() for n, s in param_shapes(c)}
    P = unstack(arrays, torch.float32)
    params = leaves(P, PARAM_NAMES)
    opt = torch.optim.AdamW(params, lr=6e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)

    def step():
        tok = torch.randint(0, c.V, (c.B, c.T + 1), generator=gen)
        t0 = time.perf_counter()
        loss = g.gpt2_loss(llama_logits(P, tok[:, :-1], c), tok[:, 1:], c.V)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return (time.perf_counter() - t0) * 1e3

    g.print_step_times(step, a)


# ---------------------------------------------------------------- main

def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    cp = sub.add_parser("case")
    cp.add_argument("outdir")
    for name, typ, default in [("layers", int, 2), ("heads", int, 4), ("kv-heads", int, 2),
                               ("hidden", int, 32), ("ffn", int, 40), ("vocab", int, 100),
                               ("padded-vocab", int, 128), ("seq-len", int, 16),
                               ("max-seq-len", int, 32), ("batch", int, 2),
                               ("grad-accum", int, 2), ("steps", int, 6),
                               ("lr", float, 1e-3), ("warmup", int, 2),
                               ("weight-decay", float, 0.1), ("grad-clip", float, 1.0),
                               ("rope-theta", float, 10000.0), ("norm-eps", float, 1e-5),
                               ("seed", int, 0)]:
        cp.add_argument("--" + name, type=typ, default=default)
    cp.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    cp.add_argument("--tie", action="store_true", help="the LM head is the embedding")
    cm = sub.add_parser("compare")
    cm.add_argument("casedir")
    cm.add_argument("rundir")
    sub.add_parser("selftest")
    bp = sub.add_parser("bench")
    for name, default in [("layers", 30), ("heads", 9), ("kv-heads", 3), ("hidden", 576),
                          ("ffn", 1536), ("vocab", 49152), ("padded-vocab", 49152),
                          ("seq-len", 64), ("batch", 4), ("steps", 12), ("warmup-steps", 2),
                          ("threads", 2)]:
        bp.add_argument("--" + name, type=int, default=default)
    a = p.parse_args()
    if a.cmd == "bench":
        return bench(a)
    if a.cmd == "selftest":
        sys.exit(0 if selftest() else 1)
    if a.cmd == "compare":
        sys.exit(0 if compare(a.casedir, a.rundir) else 1)
    c = g.Config(L=a.layers, NH=a.heads, KV=a.kv_heads, C=a.hidden, F=a.ffn, V=a.vocab,
                 Vp=a.padded_vocab, maxT=a.max_seq_len, T=a.seq_len, B=a.batch, A=a.grad_accum,
                 steps=a.steps, lr=a.lr, warmup=a.warmup, schedule="cosine", min_lr_ratio=0.1,
                 weight_decay=a.weight_decay, grad_clip=a.grad_clip, beta1=0.9, beta2=0.95,
                 eps_adam=1e-8, eps=a.norm_eps, theta=a.rope_theta, seed=a.seed,
                 precision=a.precision, tie=a.tie)
    make_case(a.outdir, c)


if __name__ == "__main__":
    main()
