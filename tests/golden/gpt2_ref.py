#!/usr/bin/python3
"""gpt2_ref.py — the numerical referee for plait-train: an independent PyTorch
GPT-2 (llm.c checkpoint and token-shard formats, AdamW, clipping, warmup and
cosine LR) that writes reference logits, gradients and step metrics for a small
random case, and compares a plait run against them (fp32, and bf16 through an
exact emulation of plait's bf16 products). Also a PyTorch speed reference.

It is not a trainer and shares no code with plait: it reads only the files
plait reads (model.bin, train_*.bin, plan.json) and plait's outputs.

Run it with Debian's /usr/bin/python3 (python3-torch 1.13):
  gpt2_ref.py case OUTDIR [--precision fp32|bf16] [model, data and optimizer
      options, see case --help]     model.bin, train_00[01].bin, plan.json and
      OUTDIR/ref/{logits.f32,grads.f32,metrics.json,meta.json}; for bf16 also
      OUTDIR/ref_fp32/ and OUTDIR/ref/spread.json
  gpt2_ref.py compare CASEDIR RUNDIR [--precision fp32|bf16]   (default: the
      plan's) reads RUNDIR/dump/{logits,grads}.f32, RUNDIR/metrics.jsonl and
      RUNDIR/plan.json; exit 1 on any failed check. The run may have any
      tp × pp × dp layout whose global batch (micro_batch × grad_accum × dp)
      is the case's micro-batch × grad-accum: dp rank r reads windows r, r+dp,
      … of the step's grad_accum·dp, so the step sees the case's windows, and
      dp rank 0's first micro-batch (whose logits the run dumps) is the
      case's first. plait dumps whole tensors in any layout.
  gpt2_ref.py hf CASEDIR OUTDIR      the case's model.bin as a Hugging Face
      GPT2LMHeadModel directory (transformers' names and Conv1D layout)
  gpt2_ref.py selftest               the referee checks itself
  gpt2_ref.py measure-bf16 [--seeds 0:20] [case options]   the measurements
      behind the bf16 tolerances
  gpt2_ref.py bench [--layers 12 --heads 12 --hidden 768 --vocab 50257
      --padded-vocab 50304 --seq-len 64 --max-seq-len 1024 --batch 4
      --steps 12 --warmup-steps 2 --threads 2]   one JSON line of step times
"""

import argparse
import glob
import io
import json
import math
import os
import shutil
import statistics
import sys
import tempfile
import time

import numpy as np
import torch
import torch.nn.functional as F

# ---------------------------------------------------------------- formats

HEADER_INTS = 256
MODEL_MAGIC, MODEL_VERSION_FP32 = 20240326, 3
TOKENS_MAGIC, TOKENS_VERSION = 20240520, 1

# Parameter tensors in llm.c checkpoint order. Per-layer tensors are kept as a
# list of L separate leaves (so autograd never scatters into a stacked tensor)
# and stacked only for files.
PARAM_NAMES = ["wte", "wpe", "ln1w", "ln1b", "qkvw", "qkvb", "attprojw", "attprojb",
               "ln2w", "ln2b", "fcw", "fcb", "fcprojw", "fcprojb", "lnfw", "lnfb"]
LAYERED = {"ln1w", "ln1b", "qkvw", "qkvb", "attprojw", "attprojb",
           "ln2w", "ln2b", "fcw", "fcb", "fcprojw", "fcprojb"}
DECAYED = {"wte", "wpe", "qkvw", "attprojw", "fcw", "fcprojw"}  # AdamW weight decay

# ---------------------------------------------------------------- tolerances
#
# Errors are norm-wise relative, ‖run − ref‖/‖ref‖, for the logits and each of
# the 16 gradient tensors, and elementwise relative for each step's loss, lr
# and grad_norm. The lr never depends on precision: always FP32_TOL.
#
# fp32: plait (fp32, its own summation order) against this reference computed
# in float64. 1e-4 is the brief's bound. This model run in float32 (torch's
# summation order, fp32 master weights) stays below 6e-7 on every tensor and
# 8e-7 on every metric (seeds 0..19, defaults; the selftest checks one);
# plait-train (seed 0) measured 6.9e-7 and 8.2e-8.
FP32_TOL = {"tensor": 1e-4, "loss": 1e-4, "grad_norm": 1e-4}

# bf16, against the bf16 emulation (float64, rounding to bf16 from the fp32
# value wherever plait does). A correct plait differs from it only by fp32
# summation order and fp32 arithmetic elsewhere. The first estimate was that
# this flips a bf16 rounding (a 2^-8 change of one element) only where an fp32
# value lies within ~2^-24·sqrt(K) of a rounding midpoint, p ≈ 2^-16·sqrt(K)
# ≈ 1e-4 of the elements, i.e. ~sqrt(p)·2^-8 ≈ 4e-5 norm-wise. Measurement says
# otherwise: each flip perturbs every value computed from it by ~2^-8/sqrt(C),
# far above fp32 noise, so the next rounding point flips ~1..6% of the
# affected elements, and so on (a cascade: per-Linear flip rates 2e-4, 8e-4,
# 3e-3, 2e-2, 6e-2 through one seed's 9 forward Linears). Measured with
# `measure-bf16` (defaults, seeds 0..39) between three emulations that differ
# only in summation order (float64; float32; float32 with each product's K
# split in 3 chunks summed in reverse), worst over the pairs:
#   logits 1.0e-3, gradient tensors 1.9e-3 (ln1w; lnfb only 5e-5),
#   step loss 2.6e-5, grad_norm 6.0e-4.
# (C=32 B=1 T=16, seeds 0..29: tensors 8.0e-4, loss 2.4e-5, grad_norm 3.0e-4;
# the cascade is heavy-tailed: most seeds stay near 1e-7 there.)
# plait-train itself (seed 0) measured 8.0e-4, 6.6e-6 and 1.0e-4.
# Bounds: 2.1x (tensors: 2^-8, one bf16 ulp) to 2.7x the worst measured.
BF16_TOL = {"tensor": 4e-3, "loss": 7e-5, "grad_norm": 1.5e-3}

# bf16 against the plain fp32 reference: a rounded operand is off by ≤ u =
# 2^-9 relative, ~u/sqrt(3) rms; a product of two, ~0.8u rms; a gradient of
# layer 0 passes through ~2·(4L+1) = 18 such products (forward and backward),
# a random walk of ~sqrt(18)·0.8u ≈ 3.5u ≈ 7e-3. Measured (defaults, seeds
# 0..39; C=32 B=1 T=16, seeds 0..29): tensors ≤ 7.2e-3, step loss ≤ 5.5e-5,
# grad_norm ≤ 2.1e-3. Bounds: tensors 8u ≈ 1.6e-2 (2x the estimate), metrics
# 4u ≈ 7.8e-3 (the loss is a mean over tokens, the norm a sum of squares:
# both average the rounding noise).
BF16_U = 2.0 ** -9
BF16_VS_FP32_TOL = {"tensor": 8 * BF16_U, "loss": 4 * BF16_U, "grad_norm": 4 * BF16_U}

# The bounds above cannot tell a correct bf16 path from a wrong one that moves
# the numbers by less than ~4e-3 (a plain fp32 run is 1.7e-3..5.7e-3 from the
# emulation; a run that forgets to round dY, 8e-4..4e-3). What does: the
# run's distance to the fp32 reference in units of the emulation's distance,
# r = ‖run − fp32‖/‖emu − fp32‖. The cascade spread is nearly orthogonal to
# the rounding error itself, so a correct run has r ≈ sqrt(1 + (s/d)²):
# measured 0.92..1.10 (defaults, seeds 0..39, both float32 emulations; plait
# 0.96..1.01), while plain fp32 gives r ≈ 0, truncation instead of
# round-to-nearest-even 1.70..6.64 (caught in 40 of 40 seeds), unrounded dY
# 0.64..1.06 (caught in 38 of 40). Window:
BF16_RATIO = (0.8, 1.25)


# ---------------------------------------------------------------- config

class Config:
    """Model, data and optimizer settings of one case (names as in plan.json)."""

    def __init__(self, **kw):
        self.__dict__.update(kw)

    @property
    def hs(self):
        return self.C // self.NH


def param_shapes(cfg):
    """(name, file shape) in llm.c order; per-layer tensors have a leading L."""
    L, C, Vp, maxT = cfg.L, cfg.C, cfg.Vp, cfg.maxT
    return [("wte", (Vp, C)), ("wpe", (maxT, C)), ("ln1w", (L, C)), ("ln1b", (L, C)),
            ("qkvw", (L, 3 * C, C)), ("qkvb", (L, 3 * C)), ("attprojw", (L, C, C)),
            ("attprojb", (L, C)), ("ln2w", (L, C)), ("ln2b", (L, C)), ("fcw", (L, 4 * C, C)),
            ("fcb", (L, 4 * C)), ("fcprojw", (L, C, 4 * C)), ("fcprojb", (L, C)),
            ("lnfw", (C,)), ("lnfb", (C,))]


def leaves(P):
    """Every parameter leaf in llm.c order (a layered name gives L leaves)."""
    out = []
    for name in PARAM_NAMES:
        out.extend(P[name] if name in LAYERED else [P[name]])
    return out


def stacked(P, grad=False):
    """{name: tensor in file shape}, of the parameters or of their gradients."""
    def get(t):
        return t.grad if grad else t
    return {name: torch.stack([get(t) for t in P[name]]) if name in LAYERED else get(P[name])
            for name in PARAM_NAMES}


def unstack(arrays, dtype, requires_grad=True):
    """{name: array in file shape} -> parameters (layered names as lists of leaves)."""
    def leaf(a):
        return torch.tensor(np.asarray(a), dtype=dtype).requires_grad_(requires_grad)
    return {name: [leaf(a) for a in arrays[name]] if name in LAYERED else leaf(arrays[name])
            for name in PARAM_NAMES}


def read_header(path):
    h = np.fromfile(path, dtype="<i4", count=HEADER_INTS)
    if h.size != HEADER_INTS:
        raise SystemExit(f"gpt2_ref: {path}: too short for an llm.c header")
    return h


def write_model(path, cfg, arrays):
    h = np.zeros(HEADER_INTS, dtype="<i4")
    h[:8] = [MODEL_MAGIC, MODEL_VERSION_FP32, cfg.maxT, cfg.V, cfg.L, cfg.NH, cfg.C, cfg.Vp]
    with open(path, "wb") as f:
        f.write(h.tobytes())
        for name, shape in param_shapes(cfg):
            a = np.asarray(arrays[name], dtype="<f4")
            assert a.shape == shape, (name, a.shape, shape)
            f.write(a.tobytes())


def read_model(path):
    """-> (Config with the model dims, {name: float32 array in file shape})."""
    h = read_header(path)
    if h[0] != MODEL_MAGIC or h[1] != MODEL_VERSION_FP32:
        raise SystemExit(f"gpt2_ref: {path}: not an fp32 llm.c GPT-2 checkpoint (header {h[:2]})")
    cfg = Config(maxT=int(h[2]), V=int(h[3]), L=int(h[4]), NH=int(h[5]), C=int(h[6]),
                 Vp=int(h[7]))
    body = np.fromfile(path, dtype="<f4", offset=HEADER_INTS * 4)
    arrays, off = {}, 0
    for name, shape in param_shapes(cfg):
        n = int(np.prod(shape))
        arrays[name] = body[off:off + n].reshape(shape)
        off += n
    if off != body.size:
        raise SystemExit(f"gpt2_ref: {path}: {body.size} floats, header says {off}")
    return cfg, arrays


def safetensors_bytes(a, dtype):
    """The fp32 array a as the dtype's little-endian bytes: F32; F16 and BF16
    rounded to nearest, ties to even."""
    a = np.ascontiguousarray(a, dtype="<f4")
    if dtype == "F16":
        return a.astype("<f2")
    if dtype == "BF16":
        bits = a.view("<u4").astype(np.uint64)
        return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype("<u2")
    assert dtype == "F32", dtype
    return a


def write_safetensors(path, tensors, dtypes=None):
    """The safetensors format: u64 header length, JSON header, raw data (F32,
    or the dtype `dtypes` gives a name: F16, BF16)."""
    header, blobs, off = {}, [], 0
    for name in sorted(tensors):
        dtype = (dtypes or {}).get(name, "F32")
        a = safetensors_bytes(tensors[name], dtype)
        header[name] = {"dtype": dtype, "shape": list(a.shape), "data_offsets": [off, off + a.nbytes]}
        blobs.append(a.tobytes())
        off += a.nbytes
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(len(text).to_bytes(8, "little") + text)
        for b in blobs:
            f.write(b)


def write_hf(casedir, outdir):
    """The case's model.bin as transformers' GPT2LMHeadModel directory: its
    names, its Conv1D weights stored (in, out), the vocabulary's real rows."""
    cfg, a = read_model(os.path.join(casedir, "model.bin"))
    t = {"transformer.wte.weight": a["wte"][:cfg.V], "transformer.wpe.weight": a["wpe"],
         "transformer.ln_f.weight": a["lnfw"], "transformer.ln_f.bias": a["lnfb"]}
    conv = {"qkvw": "attn.c_attn", "attprojw": "attn.c_proj", "fcw": "mlp.c_fc",
            "fcprojw": "mlp.c_proj"}
    vec = {"ln1w": "ln_1.weight", "ln1b": "ln_1.bias", "ln2w": "ln_2.weight", "ln2b": "ln_2.bias",
           "qkvb": "attn.c_attn.bias", "attprojb": "attn.c_proj.bias", "fcb": "mlp.c_fc.bias",
           "fcprojb": "mlp.c_proj.bias"}
    for l in range(cfg.L):
        for n, hf in conv.items():
            t[f"transformer.h.{l}.{hf}.weight"] = a[n][l].T
        for n, hf in vec.items():
            t[f"transformer.h.{l}.{hf}"] = a[n][l]
    os.makedirs(outdir, exist_ok=True)
    write_safetensors(os.path.join(outdir, "model.safetensors"), t)
    with open(os.path.join(outdir, "config.json"), "w") as f:
        json.dump({"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "n_layer": cfg.L,
                   "n_head": cfg.NH, "n_embd": cfg.C, "n_positions": cfg.maxT,
                   "vocab_size": cfg.V, "activation_function": "gelu_new"}, f, indent=2)


def write_tokens(path, tokens):
    h = np.zeros(HEADER_INTS, dtype="<i4")
    h[:3] = [TOKENS_MAGIC, TOKENS_VERSION, len(tokens)]
    with open(path, "wb") as f:
        f.write(h.tobytes())
        f.write(np.asarray(tokens, dtype="<u2").tobytes())


def read_tokens(path):
    h = read_header(path)
    if h[0] != TOKENS_MAGIC or h[1] != TOKENS_VERSION:
        raise SystemExit(f"gpt2_ref: {path}: not an llm.c token shard (header {h[:2]})")
    toks = np.fromfile(path, dtype="<u2", offset=HEADER_INTS * 4)
    if toks.size != h[2]:
        raise SystemExit(f"gpt2_ref: {path}: {toks.size} tokens, header says {h[2]}")
    return toks


class ShardLoader:
    """llm.c token shards read in order, no shuffle: each micro-batch is a window
    of B·T+1 tokens at pos; a window that does not fit moves to the next shard
    (wrapping) at pos 0."""

    def __init__(self, paths, B, T):
        self.paths = sorted(paths)
        self.shards = [read_tokens(p) for p in self.paths]
        self.B, self.T = B, T
        for p, s in zip(self.paths, self.shards):
            if len(s) < B * T + 1:
                raise SystemExit(f"gpt2_ref: {p}: {len(s)} tokens, a micro-batch needs {B * T + 1}")
        self.shard, self.pos = 0, 0
        self.windows = []  # (shard, pos) of every micro-batch served

    def next(self):
        n = self.B * self.T
        if self.pos + n + 1 > len(self.shards[self.shard]):
            self.shard, self.pos = (self.shard + 1) % len(self.shards), 0
        w = self.shards[self.shard][self.pos:self.pos + n + 1].astype(np.int64)
        self.windows.append((self.shard, self.pos))
        self.pos += n
        x = torch.from_numpy(w[:-1].copy()).view(self.B, self.T)
        y = torch.from_numpy(w[1:].copy()).view(self.B, self.T)
        return x, y


# ---------------------------------------------------------------- model

_masks = {}


def causal_attention(qkv, NH):
    """qkv (B,T,3C) -> (B,T,C): q,k,v are the three C-wide thirds, head h is
    columns h·hs..(h+1)·hs-1 of each; softmax(q·kᵀ/sqrt(hs), causal)·v."""
    B, T, C3 = qkv.shape
    C = C3 // 3
    hs = C // NH
    q, k, v = (t.view(B, T, NH, hs).transpose(1, 2) for t in qkv.split(C, dim=2))  # (B,NH,T,hs)
    att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))  # (B,NH,T,T)
    mask = _masks.get(T)
    if mask is None:
        mask = _masks[T] = torch.ones(T, T, dtype=torch.bool).triu(1)
    att = att.masked_fill(mask, float("-inf")).softmax(dim=-1)
    return (att @ v).transpose(1, 2).reshape(B, T, C)


def gpt2_logits(P, idx, NH, linear=F.linear):
    """idx (B,T) int64 -> logits (B,T,Vp). `linear(x, w, b)` computes x·wᵀ + b
    for every Linear and the tied LM head (b = None); the bf16 emulation swaps it."""
    T = idx.shape[1]
    C = P["wte"].shape[1]
    x = F.embedding(idx, P["wte"]) + P["wpe"][:T]  # (B,T,C)
    for l in range(len(P["qkvw"])):
        h = F.layer_norm(x, (C,), P["ln1w"][l], P["ln1b"][l], 1e-5)
        qkv = linear(h, P["qkvw"][l], P["qkvb"][l])  # (B,T,3C)
        x = x + linear(causal_attention(qkv, NH), P["attprojw"][l], P["attprojb"][l])
        h = F.layer_norm(x, (C,), P["ln2w"][l], P["ln2b"][l], 1e-5)
        h = F.gelu(linear(h, P["fcw"][l], P["fcb"][l]), approximate="tanh")  # (B,T,4C)
        x = x + linear(h, P["fcprojw"][l], P["fcprojb"][l])
    x = F.layer_norm(x, (C,), P["lnfw"], P["lnfb"], 1e-5)
    return linear(x, P["wte"], None)  # (B,T,Vp), tied weights


def gpt2_loss(logits, targets, V):
    """Mean cross-entropy over the first V logit columns (padding never enters)."""
    return F.cross_entropy(logits[..., :V].reshape(-1, V), targets.reshape(-1))


# ---------------------------------------------------------------- bf16 emulation

def bf16_round(x):
    """Round to bf16 (nearest, ties to even) from the fp32 value, keep the dtype.
    A float64 input is first rounded to fp32, as plait holds fp32 values."""
    return x.to(torch.float32).to(torch.bfloat16).to(x.dtype)


def make_linear(round_fn, k_chunks=1):
    """A Linear whose products take round_fn'ed inputs and accumulate in the
    tensors' dtype: y = r(x)·r(W)ᵀ + b; dX = r(dY)·r(W); dW = r(dY)ᵀ·r(X);
    db = ΣdY (unrounded). k_chunks > 1 sums each product over K in that many
    chunks, last chunk first: the same maths in another summation order."""

    def mm(a, b):  # a (..., K) · b (K, N)
        if k_chunks == 1:
            return a @ b
        K = a.shape[-1]
        cuts = [K * i // k_chunks for i in range(k_chunks + 1)]
        out = None
        for i in reversed(range(k_chunks)):
            part = a[..., cuts[i]:cuts[i + 1]] @ b[cuts[i]:cuts[i + 1]]
            out = part if out is None else out + part
        return out

    class RoundedLinear(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, w, b):
            xr, wr = round_fn(x), round_fn(w)
            ctx.save_for_backward(xr, wr)
            ctx.has_bias = b is not None
            y = mm(xr, wr.t())  # (..., OC)
            return y + b if b is not None else y

        @staticmethod
        def backward(ctx, dy):
            xr, wr = ctx.saved_tensors
            dyr = round_fn(dy)
            dx = mm(dyr, wr)
            dw = mm(dyr.reshape(-1, dy.shape[-1]).t(), xr.reshape(-1, xr.shape[-1]))
            db = dy.reshape(-1, dy.shape[-1]).sum(0) if ctx.has_bias else None
            return dx, dw, db

    return RoundedLinear.apply


bf16_linear = make_linear(bf16_round)


# ---------------------------------------------------------------- training

def lr_at(s, cfg):
    """LR of 0-based step s: linear warmup, then constant or cosine to lr·min_lr_ratio."""
    if s < cfg.warmup:
        return cfg.lr * (s + 1) / cfg.warmup
    if cfg.schedule == "constant":
        return cfg.lr
    lo = cfg.lr * cfg.min_lr_ratio
    frac = (s - cfg.warmup) / (cfg.steps - cfg.warmup)
    return lo + 0.5 * (1.0 + math.cos(math.pi * frac)) * (cfg.lr - lo)


def make_optimizer(P, cfg):
    decay = [t for n in PARAM_NAMES if n in DECAYED for t in (P[n] if n in LAYERED else [P[n]])]
    other = [t for n in PARAM_NAMES if n not in DECAYED for t in (P[n] if n in LAYERED else [P[n]])]
    return torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                              {"params": other, "weight_decay": 0.0}],
                             lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps)


def clip_and_norm(params, grad_clip):
    """Global L2 norm of the gradients before clipping; clips if grad_clip > 0."""
    if grad_clip > 0:
        return float(torch.nn.utils.clip_grad_norm_(params, grad_clip))
    return float(torch.sqrt(sum((p.grad.double() ** 2).sum() for p in params)))


def train_steps(cfg, loader, params, opt, forward, grads_of):
    """The case's steps (the referees share them): each micro-batch's forward(x) ->
    (logits, what it adds to the loss: 0, or a mixture of experts' losses), the mean loss
    of the step's micro-batches, clipping, the learning rate, AdamW. Returns (logits of
    step 1 micro-batch 0 as float32 numpy, grads_of() after step 1's micro-batches,
    metrics list)."""
    logits0 = grads1 = None
    metrics = []
    for s in range(cfg.steps):
        losses = []
        for a in range(cfg.A):
            x, y = loader.next()
            logits, extra = forward(x)
            loss = gpt2_loss(logits, y, cfg.V) + extra
            if s == 0 and a == 0:
                logits0 = logits.detach().to(torch.float32, copy=True).numpy()
            (loss / cfg.A).backward()
            losses.append(loss.item())
        if s == 0:
            grads1 = grads_of()  # copies: clipping scales the gradients in place
        grad_norm = clip_and_norm(params, cfg.grad_clip)
        lr = lr_at(s, cfg)
        for g in opt.param_groups:
            g["lr"] = lr
        opt.step()
        opt.zero_grad(set_to_none=True)
        metrics.append({"step": s + 1, "loss": sum(losses) / cfg.A, "lr": lr,
                        "grad_norm": grad_norm})
    return logits0, grads1, metrics


def train(casedir, cfg, arrays, dtype, linear):
    """Trains from the checkpoint arrays on the case's shards. Returns
    (logits of step 1 micro-batch 0 as float32 numpy, {name: step-1 gradient as
    float32 numpy in file shape}, metrics list, loader windows)."""
    P = unstack(arrays, dtype)
    loader = ShardLoader(glob.glob(os.path.join(casedir, cfg.train_glob)), cfg.B, cfg.T)
    logits0, grads1, metrics = train_steps(
        cfg, loader, leaves(P), make_optimizer(P, cfg),
        lambda x: (gpt2_logits(P, x, cfg.NH, linear), 0),
        lambda: {n: g.detach().to(torch.float32, copy=True).numpy()
                 for n, g in stacked(P, grad=True).items()})
    return logits0, grads1, metrics, loader.windows


def write_outputs(d, logits0, grads1, metrics, cfg):
    os.makedirs(d, exist_ok=True)
    logits0.astype("<f4").tofile(os.path.join(d, "logits.f32"))
    with open(os.path.join(d, "grads.f32"), "wb") as f:
        for name, shape in param_shapes(cfg):
            assert grads1[name].shape == shape
            f.write(grads1[name].astype("<f4").tobytes())
    with open(os.path.join(d, "metrics.json"), "w") as f:
        json.dump(metrics, f, indent=1)
        f.write("\n")


# ---------------------------------------------------------------- case

def init_weights(cfg, gen):
    """Random weights with every path exercised: N(0, 0.02) matrices, random
    biases and LayerNorm affines, large non-zero padded rows of wte (so padded
    logits entering the softmax would show)."""
    def normal(shape, std=1.0, mean=0.0):
        return (mean + std * torch.randn(shape, generator=gen, dtype=torch.float64)).numpy()
    arrays = {}
    for name, shape in param_shapes(cfg):
        if name in DECAYED:
            arrays[name] = normal(shape, 0.02)
        elif name in ("ln1w", "ln2w", "lnfw"):
            arrays[name] = normal(shape, 0.1, 1.0)
        else:
            arrays[name] = normal(shape, 0.02)
    arrays["wte"][cfg.V:] = normal((cfg.Vp - cfg.V, cfg.C), 0.5)
    return {n: a.astype(np.float32) for n, a in arrays.items()}


def shard_lengths(cfg):
    """Two shard lengths such that the steps·A micro-batches go through shard 0,
    then shard 1, then back to shard 0. Shard 0 ends exactly where its last
    window fits (pos + B·T + 1 == len); shard 1 is one token too short for
    one more window (pos + B·T + 1 == len + 1)."""
    n = cfg.B * cfg.T
    mbs = cfg.steps * cfg.A
    n0, n1 = max(1, (mbs + 2) // 3), max(1, mbs // 4)
    if n0 + n1 >= mbs:
        raise SystemExit(f"gpt2_ref: {mbs} micro-batches are too few to wrap around two shards")
    return [n0 * n + 1, (n1 + 1) * n]


def plan_for(cfg):
    return {
        "model": {"layers": cfg.L, "heads": cfg.NH, "hidden": cfg.C, "vocab": cfg.V,
                  "padded_vocab": cfg.Vp, "seq_len": cfg.T, "max_seq_len": cfg.maxT,
                  "seed": cfg.seed, "init": "model.bin"},
        "data": {"train": cfg.train_glob, "shuffle": False},
        "batch": {"micro_batch": cfg.B, "grad_accum": cfg.A},
        "optimizer": {"lr": cfg.lr, "beta1": cfg.beta1, "beta2": cfg.beta2, "eps": cfg.eps,
                      "weight_decay": cfg.weight_decay, "grad_clip": cfg.grad_clip,
                      "warmup_steps": cfg.warmup, "schedule": cfg.schedule,
                      "min_lr_ratio": cfg.min_lr_ratio},
        "steps": cfg.steps,
        "precision": cfg.precision,
        "checkpoint": {"every": 0, "keep": 1},
    }


def config_from_args(a):
    return Config(L=a.layers, NH=a.heads, C=a.hidden, V=a.vocab, Vp=a.padded_vocab,
                  maxT=a.max_seq_len, T=a.seq_len, B=a.batch, A=a.grad_accum, steps=a.steps,
                  lr=a.lr, warmup=a.warmup, schedule=a.schedule, min_lr_ratio=a.min_lr_ratio,
                  weight_decay=a.weight_decay, grad_clip=a.grad_clip, beta1=a.beta1,
                  beta2=a.beta2, eps=a.eps, seed=a.seed, precision=a.precision,
                  train_glob="train_*.bin")


def check_config(cfg):
    problems = []
    if cfg.C % cfg.NH:
        problems.append("hidden must be a multiple of heads")
    if cfg.Vp < cfg.V or cfg.V > 65536:
        problems.append("need vocab <= padded-vocab and vocab <= 65536")
    if cfg.T > cfg.maxT:
        problems.append("seq-len must be <= max-seq-len")
    if cfg.warmup > cfg.steps:
        problems.append("warmup must be <= steps")
    if problems:
        raise SystemExit("gpt2_ref: " + "; ".join(problems))


def make_case(outdir, cfg, quiet=False):
    """Writes model.bin, the shards and plan.json, then the reference outputs:
    ref/ (the plan's precision); for bf16 also ref_fp32/ (plain fp32) and
    ref/spread.json (this case's own spread between bf16 emulations).
    Returns the metrics of ref/."""
    say = (lambda *a: None) if quiet else print
    check_config(cfg)
    t0 = time.time()
    os.makedirs(outdir, exist_ok=True)
    gen = torch.Generator().manual_seed(cfg.seed)
    write_model(os.path.join(outdir, "model.bin"), cfg, init_weights(cfg, gen))
    for i, n in enumerate(shard_lengths(cfg)):
        toks = torch.randint(0, cfg.V, (n,), generator=gen).numpy()
        write_tokens(os.path.join(outdir, f"train_{i:03d}.bin"), toks)

    # Everything below reads the files back, as plait will.
    mcfg, arrays = read_model(os.path.join(outdir, "model.bin"))
    assert (mcfg.L, mcfg.NH, mcfg.C, mcfg.V, mcfg.Vp, mcfg.maxT) == \
        (cfg.L, cfg.NH, cfg.C, cfg.V, cfg.Vp, cfg.maxT)
    linear = bf16_linear if cfg.precision == "bf16" else F.linear

    # Clipping must act on some steps and not on others; if it does not, move
    # grad_clip to the median pre-clip norm and run again.
    for _ in range(6):
        logits0, grads1, metrics, windows = train(outdir, cfg, arrays, torch.float64, linear)
        norms = [m["grad_norm"] for m in metrics]
        clipped = sum(g > cfg.grad_clip for g in norms)
        if cfg.grad_clip <= 0 or 0 < clipped < len(norms):
            break
        new = float(f"{statistics.median(norms):.3g}")
        say(f"gpt2_ref: grad_clip {cfg.grad_clip} clips {clipped} of {len(norms)} steps; "
            f"using {new}")
        cfg.grad_clip = new
    else:
        raise SystemExit("gpt2_ref: could not find a grad_clip that clips only some steps")

    shards = [w[0] for w in windows]
    assert 1 in shards and 0 in shards[shards.index(1):], \
        f"data must go shard 0 -> 1 -> 0; windows were {windows}"

    write_outputs(os.path.join(outdir, "ref"), logits0, grads1, metrics, cfg)
    with open(os.path.join(outdir, "plan.json"), "w") as f:
        json.dump(plan_for(cfg), f, indent=2)
        f.write("\n")
    meta = {"reference_dtype": "float64 (written as float32)", "precision": cfg.precision,
            "windows (shard:pos)": [f"{sh}:{pos}" for sh, pos in windows],
            "shard_tokens": shard_lengths(cfg),
            "clipped_steps": [m["step"] for m in metrics if 0 < cfg.grad_clip < m["grad_norm"]],
            "torch": torch.__version__}

    if cfg.precision == "bf16":
        ref = outputs(logits0, grads1, metrics)
        l32, g32, m32, _ = train(outdir, cfg, arrays, torch.float64, F.linear)
        write_outputs(os.path.join(outdir, "ref_fp32"), l32, g32, m32, cfg)
        # This case's own spread between valid bf16 implementations (see BF16_TOL).
        spread = {}
        for name, lin in (("float32", bf16_linear),
                          ("float32_k_chunked", make_linear(bf16_round, k_chunks=3))):
            other = outputs(*train(outdir, cfg, arrays, torch.float32, lin)[:3])
            spread[name] = distances(other, ref)
            worst = max(TENSOR_KEYS, key=spread[name].get)
            say(f"bf16 emulation in {name} vs float64: worst tensor {spread[name][worst]:.2e} "
                f"({worst}; tol {BF16_TOL['tensor']:.1e}), loss {spread[name]['loss']:.2e} "
                f"(tol {BF16_TOL['loss']:.1e}), grad_norm {spread[name]['grad_norm']:.2e} "
                f"(tol {BF16_TOL['grad_norm']:.1e})")
        with open(os.path.join(outdir, "ref", "spread.json"), "w") as f:
            json.dump(spread, f, indent=1)
            f.write("\n")

    with open(os.path.join(outdir, "ref", "meta.json"), "w") as f:
        json.dump(meta, f, indent=1)
        f.write("\n")
    say(f"case {outdir}: {cfg.precision}, L={cfg.L} NH={cfg.NH} C={cfg.C} V={cfg.V} "
        f"Vp={cfg.Vp} T={cfg.T} B={cfg.B} A={cfg.A} steps={cfg.steps} "
        f"grad_clip={cfg.grad_clip} ({time.time() - t0:.1f}s)")
    say(f"  windows (shard, pos): {windows}")
    for m in metrics:
        mark = "clipped" if 0 < cfg.grad_clip < m["grad_norm"] else ""
        say(f"  step {m['step']:3d}  loss {m['loss']:.6f}  lr {m['lr']:.6e}  "
            f"grad_norm {m['grad_norm']:.6f} {mark}")
    return metrics


# ---------------------------------------------------------------- compare

TENSOR_KEYS = ["logits"] + [f"grads.{n}" for n in PARAM_NAMES]
METRIC_KEYS = ["loss", "lr", "grad_norm"]


def outputs(logits0, grads1, metrics):
    """One run's checked outputs: (flat logits, {name: flat gradient}, {step: record})."""
    return (np.asarray(logits0).ravel(), {n: np.asarray(g).ravel() for n, g in grads1.items()},
            {m["step"]: m for m in (metrics.values() if isinstance(metrics, dict) else metrics)})


def tensors_of(out):
    logits, grads, _ = out
    return {"logits": logits, **{f"grads.{n}": grads[n] for n in PARAM_NAMES}}


def rel(a, b):
    return abs(a - b) / abs(b) if b != 0 else abs(a - b)


def rel_norm(a, b):
    a, b = np.asarray(a, dtype=np.float64).ravel(), np.asarray(b, dtype=np.float64).ravel()
    nb = np.linalg.norm(b)
    d = np.linalg.norm(a - b)
    return float(d / nb) if nb > 0 else float(d)


def distances(a, b):
    """{tensor key: norm-wise relative distance, metric key: worst relative distance over steps}."""
    ta, tb = tensors_of(a), tensors_of(b)
    d = {k: rel_norm(ta[k], tb[k]) for k in TENSOR_KEYS}
    for key in METRIC_KEYS:
        d[key] = max(rel(float(a[2][s][key]), b[2][s][key]) for s in b[2])
    return d


def read_f32(path, n):
    """-> (array or None, problem or None)."""
    if not os.path.exists(path):
        return None, f"missing {path}"
    a = np.fromfile(path, dtype="<f4")
    if a.size != n:
        return None, f"{path}: {a.size} floats, expected {n}"
    if not np.all(np.isfinite(a)):
        return None, f"{path}: contains NaN or Inf"
    return a, None


class Rows:
    """A comparison's lines (the llama and moe referees'): what, its distance, the
    tolerance, ok or BAD."""

    def __init__(self):
        self.lines, self.ok = [], True

    def add(self, what, e, t, ok, note=""):
        self.ok &= ok
        e_text = "-" if e is None else f"{e:.3e}"
        t_text = "-" if t is None else f"{t:.1e}"
        self.lines.append(f"{'ok ' if ok else 'BAD'} {what:<16} {e_text:>10} (tol {t_text}) {note}")

    def print(self, title, out):
        print(title, file=out)
        for r in self.lines:
            print("  " + r, file=out)
        return self.ok


def compare_run_metrics(rows, rundir, ref_metrics, tol):
    """Every step's loss, lr and grad_norm of the run against ref_metrics ({step: record})."""
    metrics, problem = read_run_metrics(os.path.join(rundir, "metrics.jsonl"))
    if metrics is None or sorted(metrics) != sorted(ref_metrics):
        rows.add("steps", None, None, False, problem or f"run has steps {sorted(metrics or [])}")
        return
    for key in METRIC_KEYS:
        t = tol.get(key, FP32_TOL["loss"])  # lr: never precision-dependent
        e = max(rel(float(metrics[s][key]), ref_metrics[s][key]) for s in ref_metrics)
        rows.add(key, e, t, e <= t, f"worst of {len(ref_metrics)} steps")


def read_run_metrics(path):
    """metrics.jsonl -> ({step: record}, problem or None); lines without "step" are ignored."""
    if not os.path.exists(path):
        return None, f"missing {path}"
    steps = {}
    with open(path) as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except ValueError as e:
                return None, f"{path}:{lineno}: not JSON ({e})"
            if not isinstance(rec, dict) or "step" not in rec:
                continue
            missing = [k for k in METRIC_KEYS if not isinstance(rec.get(k), (int, float))]
            if missing:
                return None, f"{path}:{lineno}: step line without a number for {', '.join(missing)}"
            if rec["step"] in steps:
                return None, f"{path}:{lineno}: step {rec['step']} twice"
            steps[rec["step"]] = rec
    return steps, None


def split_grads(flat, cfg):
    out, off = {}, 0
    for name, shape in param_shapes(cfg):
        n = int(np.prod(shape))
        out[name] = flat[off:off + n]
        off += n
    return out


def sizes(cfg):
    return cfg.B * cfg.T * cfg.Vp, sum(int(np.prod(s)) for _, s in param_shapes(cfg))


def load_ref(d, cfg):
    n_logits, n_grads = sizes(cfg)
    logits, p1 = read_f32(os.path.join(d, "logits.f32"), n_logits)
    grads, p2 = read_f32(os.path.join(d, "grads.f32"), n_grads)
    for p in (p1, p2):
        if p:
            raise SystemExit(f"gpt2_ref: reference broken: {p}")
    with open(os.path.join(d, "metrics.json")) as f:
        metrics = json.load(f)
    return outputs(logits, split_grads(grads, cfg), metrics)


def check_against(rows, label, run, problems, ref, tol, ratio_to=None):
    """Appends rows (check, err, tol, ok, note) comparing run with ref. run
    parts may be None, with the reason in problems. With ratio_to ({tensor key:
    the emulation's distance to ref}), a tensor also fails when the run's
    distance is outside BF16_RATIO times it."""
    logits, grads, metrics = run
    ref_t = tensors_of(ref)
    for key in TENSOR_KEYS:
        part = logits if key == "logits" else grads
        if part is None:
            rows.append((label + key, None, tol["tensor"], False,
                         problems[0 if key == "logits" else 1]))
            continue
        got = part if key == "logits" else part[key[len("grads."):]]
        e = rel_norm(got, ref_t[key])
        ok, note = e <= tol["tensor"], ""
        if ratio_to is not None:
            r = e / ratio_to[key] if ratio_to[key] > 0 else float("inf")
            lo, hi = BF16_RATIO
            note = f"{r:.2f}x the emulation's distance"
            if not lo <= r <= hi:
                ok = False
                note += f", outside {lo}..{hi}"
        rows.append((label + key, e, tol["tensor"], ok, note))
    if metrics is None:
        rows.append((label + "steps", None, None, False, problems[2]))
        return
    if sorted(metrics) != sorted(ref[2]):
        rows.append((label + "steps", None, None, False,
                     f"run has steps {sorted(metrics)}, reference {sorted(ref[2])}"))
        return
    rows.append((label + "steps", None, None, True, f"{len(metrics)} steps"))
    for key in METRIC_KEYS:
        t = FP32_TOL["tensor"] if key == "lr" else tol[key]  # the lr never depends on precision
        errs = {s: rel(float(metrics[s][key]), ref[2][s][key]) for s in ref[2]}
        worst = max(errs, key=errs.get)
        e = errs[worst]
        note = f"worst at step {worst}"
        if e > t:
            note += ": " + ", ".join(f"step {s} {float(metrics[s][key]):.9g} vs "
                                     f"{ref[2][s][key]:.9g}"
                                     for s in sorted(errs) if errs[s] > t)
        rows.append((label + key, e, t, e <= t, note))


def run_layout(rundir, case_plan):
    """The run's layout as text, and the row checking that its global batch
    (micro_batch × grad_accum × dp, from RUNDIR/plan.json, the plan it ran)
    is the case's (micro_batch × grad_accum)."""
    path = os.path.join(rundir, "plan.json")
    try:
        with open(path) as f:
            plan = json.load(f)
        b, par = plan["batch"], plan.get("parallel", {})
        B, A = int(b["micro_batch"]), int(b.get("grad_accum", 1))
        tp, pp, dp = (int(par.get(k, 1)) for k in ("tp", "pp", "dp"))
        zero = int(par.get("zero", 0))
    except (OSError, ValueError, KeyError, TypeError) as e:
        return "layout unknown", ("batch", None, None, False, f"{path}: {e}")
    layout = f"tp {tp} × pp {pp} × dp {dp}" + (f", ZeRO {zero}" if dp > 1 else "")
    want_b, want_a = case_plan["batch"]["micro_batch"], case_plan["batch"].get("grad_accum", 1)
    ok = B == want_b and A * dp == want_a
    note = f"{B} × {A} × dp {dp}" + ("" if ok else f", the case's is {want_b} × {want_a}")
    return layout, ("batch", None, None, ok, note)


def compare(casedir, rundir, precision=None, out=sys.stdout):
    """Prints the table to out; returns the names of the failed checks (empty = pass)."""
    with open(os.path.join(casedir, "plan.json")) as f:
        plan = json.load(f)
    precision = precision or plan.get("precision", "fp32")
    mcfg, _ = read_model(os.path.join(casedir, plan["model"].get("init", "model.bin")))
    cfg = Config(L=mcfg.L, NH=mcfg.NH, C=mcfg.C, V=mcfg.V, Vp=mcfg.Vp, maxT=mcfg.maxT,
                 T=plan["model"]["seq_len"], B=plan["batch"]["micro_batch"])
    n_logits, n_grads = sizes(cfg)
    logits, p_logits = read_f32(os.path.join(rundir, "dump", "logits.f32"), n_logits)
    grads, p_grads = read_f32(os.path.join(rundir, "dump", "grads.f32"), n_grads)
    metrics, p_metrics = read_run_metrics(os.path.join(rundir, "metrics.jsonl"))
    run = (logits, split_grads(grads, cfg) if grads is not None else None, metrics)
    problems = (p_logits, p_grads, p_metrics)
    layout, batch_row = run_layout(rundir, plan)

    # ref/ holds the plan's precision; a bf16 case also has ref_fp32/.
    case_precision = plan.get("precision", "fp32")
    if precision == case_precision:
        ref = load_ref(os.path.join(casedir, "ref"), cfg)
    elif precision == "fp32" and os.path.isdir(os.path.join(casedir, "ref_fp32")):
        ref = load_ref(os.path.join(casedir, "ref_fp32"), cfg)
    else:
        raise SystemExit(f"gpt2_ref: {casedir} is an {case_precision} case: it has no "
                         f"{precision} reference (make one with case --precision {precision})")
    rows = [batch_row]
    if precision == "fp32":
        check_against(rows, "", run, problems, ref, FP32_TOL)
    else:
        check_against(rows, "", run, problems, ref, BF16_TOL)
        ref32 = load_ref(os.path.join(casedir, "ref_fp32"), cfg)
        check_against(rows, "vs fp32: ", run, problems, ref32, BF16_VS_FP32_TOL,
                      ratio_to=distances(ref, ref32))

    def line(what, e, t, ok, note):
        es = f"{e:10.3e}" if e is not None else f"{'-':>10}"
        ts = f"{t:8.1e}" if t is not None else f"{'-':>8}"
        return f"  {what:<28} {es} {ts}  {'pass' if ok else 'FAIL'}  {note}".rstrip()

    print(f"compare {rundir} against {casedir} ({precision}, {layout})", file=out)
    print(f"  {'check':<28} {'rel err':>10} {'tol':>8}  result", file=out)
    for row in rows:
        print(line(*row), file=out)
    failed = [r for r in rows if not r[3]]
    if failed:  # again at the end, where a log's tail shows them
        print(f"FAILED {len(failed)} of {len(rows)} checks:", file=out)
        for row in failed:
            print(line(*row), file=out)
    else:
        print(f"all {len(rows)} checks pass", file=out)
    return [r[0] for r in failed]


# ---------------------------------------------------------------- selftest

def bf16_truncate(x):
    """A wrong rounding (toward zero), for the selftest and measure-bf16."""
    i = x.to(torch.float32).view(torch.int32) & ~0xFFFF
    return i.view(torch.float32).to(x.dtype)


def make_linear_unrounded_dy():
    """A wrong bf16 Linear, for the selftest and measure-bf16: dY is not rounded."""

    class UnroundedDy(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, w, b):
            xr, wr = bf16_round(x), bf16_round(w)
            ctx.save_for_backward(xr, wr)
            ctx.has_bias = b is not None
            return F.linear(xr, wr, b)

        @staticmethod
        def backward(ctx, dy):
            xr, wr = ctx.saved_tensors
            dw = dy.reshape(-1, dy.shape[-1]).t() @ xr.reshape(-1, xr.shape[-1])
            db = dy.reshape(-1, dy.shape[-1]).sum(0) if ctx.has_bias else None
            return dy @ wr, dw, db

    return UnroundedDy.apply


def lay_out_as_run(casedir, refdir, rundir):
    """A fake plait run directory holding refdir's outputs (and non-step
    lines), and the case's plan as the plan it ran."""
    os.makedirs(os.path.join(rundir, "dump"), exist_ok=True)
    shutil.copy(os.path.join(casedir, "plan.json"), os.path.join(rundir, "plan.json"))
    for name in ("logits.f32", "grads.f32"):
        shutil.copy(os.path.join(refdir, name), os.path.join(rundir, "dump", name))
    with open(os.path.join(refdir, "metrics.json")) as f:
        metrics = json.load(f)
    with open(os.path.join(rundir, "metrics.jsonl"), "w") as f:
        f.write(json.dumps({"event": "start", "plan": os.path.join(casedir, "plan.json")}) + "\n")
        for m in metrics:
            f.write(json.dumps(m) + "\n")
        f.write(json.dumps({"event": "checkpoint", "dir": "ckpt"}) + "\n")


def lay_out_run_of(casedir, cfg, rundir, dtype, linear):
    """Trains the case with this model (dtype, linear) and lays it out as a run."""
    _, arrays = read_model(os.path.join(casedir, "model.bin"))
    logits0, grads1, metrics, _ = train(casedir, cfg, arrays, dtype, linear)
    write_outputs(os.path.join(rundir, "out"), logits0, grads1, metrics, cfg)
    lay_out_as_run(casedir, os.path.join(rundir, "out"), rundir)


def perturb_grad(rundir, cfg, name, rel_size, seed=1):
    """Adds noise of norm rel_size·‖grad‖ to one gradient tensor of a run."""
    path = os.path.join(rundir, "dump", "grads.f32")
    flat = np.fromfile(path, dtype="<f4")
    g = split_grads(flat, cfg)[name]
    noise = np.random.default_rng(seed).standard_normal(g.size)
    g += (rel_size * np.linalg.norm(g) / np.linalg.norm(noise) * noise).astype(np.float32)
    flat.tofile(path)


def set_run_layout(rundir, grad_accum, dp):
    """Edits the plan a fake run ran: its grad_accum and dp (ZeRO 1)."""
    path = os.path.join(rundir, "plan.json")
    with open(path) as f:
        plan = json.load(f)
    plan["batch"]["grad_accum"] = grad_accum
    plan["parallel"] = {"dp": dp, "zero": 1}
    with open(path, "w") as f:
        json.dump(plan, f)


def edit_metrics(rundir, fn):
    path = os.path.join(rundir, "metrics.jsonl")
    with open(path) as f:
        recs = [json.loads(line) for line in f]
    recs = fn(recs)
    with open(path, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in recs)


def selftest():
    results = []

    def check(name, ok, detail=""):
        results.append((name, bool(ok)))
        print(f"{'pass' if ok else 'FAIL'}  {name}  {detail}".rstrip())

    def check_compare(name, casedir, rundir, want):
        """want(failed) -> bool; the table is printed only when it is not."""
        table = io.StringIO()
        failed = compare(casedir, rundir, out=table)
        ok = want(failed)
        check(name, ok, f"failed checks: {', '.join(failed) or 'none'}")
        if not ok:
            print(table.getvalue())

    gen = torch.Generator().manual_seed(123)

    # bf16 rounding is round-to-nearest-even of the fp32 value.
    x = torch.tensor([1 + 2 ** -8, 1 + 3 * 2 ** -8, 1 + 2 ** -8 + 2 ** -20, -(1 + 2 ** -8)],
                     dtype=torch.float64)
    want = torch.tensor([1.0, 1 + 2 ** -6, 1 + 2 ** -7, -1.0], dtype=torch.float64)
    check("bf16_round_nearest_even", torch.equal(bf16_round(x), want), str(bf16_round(x).tolist()))

    # Attention against a naive loop over (b, h, i, j), reading q, k, v and the
    # heads straight out of the fused qkv layout.
    B, T, C, NH = 2, 5, 12, 3
    hs = C // NH
    qkv = torch.randn(B, T, 3 * C, generator=gen, dtype=torch.float64)
    fast = causal_attention(qkv, NH)
    slow = torch.zeros(B, T, C, dtype=torch.float64)
    for b in range(B):
        for h in range(NH):
            cols = slice(h * hs, (h + 1) * hs)
            for i in range(T):
                q = qkv[b, i, cols]
                scores = [float(q @ qkv[b, j, C:2 * C][cols]) / math.sqrt(hs) for j in range(i + 1)]
                mx = max(scores)
                w = [math.exp(s - mx) for s in scores]
                for j in range(i + 1):
                    slow[b, i, cols] += (w[j] / sum(w)) * qkv[b, j, 2 * C:3 * C][cols]
    err = float((fast - slow).abs().max())
    check("attention_matches_naive_loop", err < 1e-12, f"max abs diff {err:.1e}")

    # The whole model's backward against finite differences (float64).
    tiny = Config(L=2, NH=2, C=8, V=11, Vp=16, maxT=6, T=4)
    arrays = {n: a.astype(np.float64) for n, a in init_weights(tiny, gen).items()}
    P = unstack(arrays, torch.float64)
    idx = torch.randint(0, tiny.V, (2, tiny.T), generator=gen)
    tgt = torch.randint(0, tiny.V, (2, tiny.T), generator=gen)

    def loss_of(*ps):
        it = iter(ps)
        Q = {n: [next(it) for _ in P[n]] if n in LAYERED else next(it) for n in PARAM_NAMES}
        return gpt2_loss(gpt2_logits(Q, idx, tiny.NH), tgt, tiny.V)

    ok = torch.autograd.gradcheck(loss_of, tuple(leaves(P)), eps=1e-6, atol=1e-8, rtol=1e-6,
                                  raise_exception=False)
    check("model_backward_gradcheck_float64", ok)

    # The rounded Linear: its backward (rounding off, both summation orders)
    # against finite differences; with bf16 rounding, forward and backward
    # equal the formulas written out; swapped into the model with rounding
    # off it changes nothing; padded rows of wte get no gradient.
    for k in (1, 3):
        xs = torch.randn(2, 3, 5, generator=gen, dtype=torch.float64, requires_grad=True)
        ws = torch.randn(4, 5, generator=gen, dtype=torch.float64, requires_grad=True)
        bs = torch.randn(4, generator=gen, dtype=torch.float64, requires_grad=True)
        ok = torch.autograd.gradcheck(make_linear(lambda t: t, k), (xs, ws, bs),
                                      raise_exception=False)
        check(f"rounded_linear_backward_gradcheck_k_chunks_{k}", ok)
    xs = torch.randn(2, 3, 5, generator=gen, requires_grad=True)
    ws = torch.randn(4, 5, generator=gen, requires_grad=True)
    bs = torch.randn(4, generator=gen, requires_grad=True)
    dy = torch.randn(2, 3, 4, generator=gen)
    y = bf16_linear(xs, ws, bs)
    y.backward(dy)
    r = bf16_round
    xd, wd, dyd = r(xs.detach()).double(), r(ws.detach()).double(), r(dy).double()
    wants = (xd @ wd.t() + bs.detach().double(), dyd @ wd,
             dyd.reshape(-1, 4).t() @ xd.reshape(-1, 5), dy.double().reshape(-1, 4).sum(0))
    errs = [float((a.double() - b).abs().max() / b.abs().max())
            for a, b in zip((y, xs.grad, ws.grad, bs.grad), wants)]
    check("bf16_linear_matches_formulas", max(errs) < 1e-6, f"max rel {max(errs):.1e}")
    Pd, Pf = unstack(arrays, torch.float64), unstack(arrays, torch.float64)
    gpt2_loss(gpt2_logits(Pd, idx, tiny.NH, make_linear(lambda t: t)), tgt, tiny.V).backward()
    gpt2_loss(gpt2_logits(Pf, idx, tiny.NH), tgt, tiny.V).backward()
    err = max(float((a.grad - b.grad).abs().max()) for a, b in zip(leaves(Pd), leaves(Pf)))
    check("swapped_linear_gives_same_model", err < 1e-14, f"max abs diff {err:.1e}")
    pad = float(Pf["wte"].grad[tiny.V:].abs().max())
    check("padded_rows_get_no_gradient", pad == 0.0, f"max abs {pad}")

    with tempfile.TemporaryDirectory() as tmp:
        # fp32: the reference laid out as a run passes; a gradient tensor off
        # by 1e-3 fails by name; a missing step or a loss off by 1e-3 fails;
        # this model in float32 (another summation order) passes.
        case = os.path.join(tmp, "case32")
        cfg = default_config("fp32")
        make_case(case, cfg, quiet=True)
        run = os.path.join(tmp, "run")
        lay_out_as_run(case, os.path.join(case, "ref"), run)
        check_compare("fp32_reference_passes_itself", case, run, lambda f: f == [])
        perturb_grad(run, cfg, "attprojb", 1e-3)
        check_compare("fp32_gradient_off_by_1e-3_fails_by_name", case, run,
                      lambda f: f == ["grads.attprojb"])
        lay_out_as_run(case, os.path.join(case, "ref"), run)
        edit_metrics(run, lambda recs: [r for r in recs if r.get("step") != 10])
        check_compare("fp32_missing_step_fails", case, run, lambda f: f == ["steps"])
        lay_out_as_run(case, os.path.join(case, "ref"), run)

        def bump_loss(recs):
            recs[3]["loss"] *= 1 + 1e-3
            return recs
        edit_metrics(run, bump_loss)
        check_compare("fp32_loss_off_by_1e-3_fails", case, run, lambda f: f == ["loss"])
        # The run's layout: the case's global batch over dp 2 passes; dp 2
        # with the case's grad_accum (twice the batch) fails.
        lay_out_as_run(case, os.path.join(case, "ref"), run)
        for name, accum, want in (("same_global_batch_over_dp2_passes", cfg.A // 2, []),
                                  ("twice_the_global_batch_fails", cfg.A, ["batch"])):
            set_run_layout(run, accum, dp=2)
            check_compare("fp32_" + name, case, run, lambda f, want=want: f == want)
        lay_out_run_of(case, cfg, os.path.join(tmp, "run_f32"), torch.float32, F.linear)
        check_compare("fp32_float32_model_passes", case, os.path.join(tmp, "run_f32"),
                      lambda f: f == [])

        # bf16: the reference passes itself; the emulation in float32 in two
        # summation orders passes; plain fp32, unrounded dY, truncation and a
        # gradient off by 1e-2 fail.
        case16 = os.path.join(tmp, "case16")
        cfg16 = default_config("bf16")
        make_case(case16, cfg16, quiet=True)
        run16 = os.path.join(tmp, "run16")
        lay_out_as_run(case16, os.path.join(case16, "ref"), run16)
        check_compare("bf16_reference_passes_itself", case16, run16, lambda f: f == [])
        for name, lin in (("float32", bf16_linear),
                          ("float32_k_chunked", make_linear(bf16_round, k_chunks=3))):
            d = os.path.join(tmp, "run16_" + name)
            lay_out_run_of(case16, cfg16, d, torch.float32, lin)
            check_compare(f"bf16_emulation_in_{name}_passes", case16, d, lambda f: f == [])
        d = os.path.join(tmp, "run16_fp32")
        lay_out_as_run(case16, os.path.join(case16, "ref_fp32"), d)
        check_compare("bf16_plain_fp32_run_fails", case16, d,
                      lambda f: any(x.startswith("vs fp32: grads.") for x in f))
        for name, lin in (("unrounded_dY", make_linear_unrounded_dy()),
                          ("truncating", make_linear(bf16_truncate))):
            d = os.path.join(tmp, "run16_" + name)
            lay_out_run_of(case16, cfg16, d, torch.float32, lin)
            check_compare(f"bf16_{name}_run_fails", case16, d,
                          lambda f: any(x.startswith("vs fp32: grads.") for x in f))
        perturb_grad(run16, cfg16, "fcw", 1e-2)
        check_compare("bf16_gradient_off_by_1e-2_fails_by_name", case16, run16,
                      lambda f: f and all(x.endswith("grads.fcw") for x in f))

    bad = [n for n, ok in results if not ok]
    print(("selftest FAILED: " + ", ".join(bad)) if bad else f"selftest: all {len(results)} pass")
    return not bad


def measure_bf16(a):
    """The measurements behind BF16_TOL, BF16_VS_FP32_TOL and BF16_RATIO: for
    each seed, a case and its bf16 emulations in three summation orders, plain
    fp32 and two wrong bf16 paths; prints the worst distances and ratios."""
    variants = {"float32": (torch.float32, bf16_linear),
                "float32_k_chunked": (torch.float32, make_linear(bf16_round, k_chunks=3)),
                "unrounded_dY": (torch.float32, make_linear_unrounded_dy()),
                "truncating": (torch.float32, make_linear(bf16_truncate))}
    worst, ratios, outside = {}, {}, {n: 0 for n in variants}
    lo_seed, hi_seed = (int(v) for v in a.seeds.split(":"))
    for seed in range(lo_seed, hi_seed):
        with tempfile.TemporaryDirectory() as tmp:
            a.seed, a.precision = seed, "bf16"
            cfg = config_from_args(a)
            make_case(tmp, cfg, quiet=True)
            emu = load_ref(os.path.join(tmp, "ref"), cfg)
            fp32 = load_ref(os.path.join(tmp, "ref_fp32"), cfg)
            _, arrays = read_model(os.path.join(tmp, "model.bin"))
            runs = {n: outputs(*train(tmp, cfg, arrays, dt, lin)[:3])
                    for n, (dt, lin) in variants.items()}
            runs["fp32"] = fp32
            d_emu = distances(emu, fp32)
            pairs = [(n, "float64") for n in runs] + [("float32_k_chunked", "float32")]
            for x, y in pairs:
                d = distances(runs[x], emu if y == "float64" else runs[y])
                for k, v in d.items():
                    worst[(x, y, k)] = max(worst.get((x, y, k), 0.0), v)
            for x in variants:
                d = distances(runs[x], fp32)
                rs = [d[k] / d_emu[k] for k in TENSOR_KEYS]
                outside[x] += any(not BF16_RATIO[0] <= r <= BF16_RATIO[1] for r in rs)
                for k, r in zip(TENSOR_KEYS, rs):
                    lo, hi = ratios.get((x, k), (math.inf, 0.0))
                    ratios[(x, k)] = (min(lo, r), max(hi, r))
            for k, v in d_emu.items():
                worst[("float64", "fp32", k)] = max(worst.get(("float64", "fp32", k), 0.0), v)
            print(f"seed {seed} done", file=sys.stderr)
    print(f"worst distances over seeds {a.seeds} (tensor, loss, grad_norm):")
    for x, y in sorted({(x, y) for x, y, _ in worst}):
        t = max(TENSOR_KEYS, key=lambda k: worst[(x, y, k)])
        print(f"  {x:>18} vs {y:<8} tensors {worst[(x, y, t)]:.2e} ({t})  "
              f"loss {worst[(x, y, 'loss')]:.2e}  grad_norm {worst[(x, y, 'grad_norm')]:.2e}")
    print("r = |run - fp32| / |emulation - fp32| over tensors and seeds:")
    for x in variants:
        lo = min(ratios[(x, k)][0] for k in TENSOR_KEYS)
        hi = max(ratios[(x, k)][1] for k in TENSOR_KEYS)
        print(f"  {x:>18}  {lo:.2f} .. {hi:.2f}   seeds with a tensor outside "
              f"{BF16_RATIO[0]}..{BF16_RATIO[1]}: {outside[x]} of {hi_seed - lo_seed}")


# ---------------------------------------------------------------- bench

def bench(a):
    """Median time of full fp32 training steps of GPT-2 on random tokens: forward,
    backward, clipping, AdamW, zero_grad; --steps timed steps after
    --warmup-steps untimed ones. AdamW is torch's default (per-tensor) path:
    its foreach=True path was slower on this CPU (0.8 s against 0.5 s per
    124M step) and torch 1.13 has no fused AdamW for CPU."""
    torch.set_num_threads(a.threads)
    cfg = Config(L=a.layers, NH=a.heads, C=a.hidden, V=a.vocab, Vp=a.padded_vocab,
                 maxT=a.max_seq_len, T=a.seq_len, B=a.batch, lr=6e-4, weight_decay=0.1,
                 beta1=0.9, beta2=0.95, eps=1e-8)
    check_config(Config(**{**cfg.__dict__, "warmup": 0, "steps": 1}))
    gen = torch.Generator().manual_seed(0)
    P = {}
    for name, shape in param_shapes(cfg):
        def make(s):
            if name in DECAYED:
                return (0.02 * torch.randn(s, generator=gen)).requires_grad_()
            fill = 1.0 if name in ("ln1w", "ln2w", "lnfw") else 0.0
            return torch.full(s, fill).requires_grad_()
        P[name] = [make(shape[1:]) for _ in range(cfg.L)] if name in LAYERED else make(shape)
    params = leaves(P)
    opt = make_optimizer(P, cfg)

    def step():
        tok = torch.randint(0, cfg.V, (cfg.B, cfg.T + 1), generator=gen)
        t0 = time.perf_counter()
        loss = gpt2_loss(gpt2_logits(P, tok[:, :-1], cfg.NH), tok[:, 1:], cfg.V)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return (time.perf_counter() - t0) * 1e3

    print_step_times(step, a)


def print_step_times(step, a):
    """Runs step() (which returns its milliseconds) a.warmup_steps untimed then
    a.steps timed times; prints the bench's JSON line."""
    for _ in range(a.warmup_steps):
        step()
    ms = [step() for _ in range(a.steps)]
    print(json.dumps({"impl": "pytorch", "median_ms": round(statistics.median(ms), 1),
                      "ms": [round(t, 1) for t in ms], "threads": a.threads,
                      "torch": torch.__version__}))


# ---------------------------------------------------------------- CLI

def default_config(precision):
    p = build_parser()
    return config_from_args(p.parse_args(["case", "unused", "--precision", precision]))


def add_case_options(p):
    for flag, typ, default in [
            ("--layers", int, 2), ("--heads", int, 4), ("--hidden", int, 64),
            ("--vocab", int, 250), ("--padded-vocab", int, 256), ("--max-seq-len", int, 40),
            ("--seq-len", int, 32), ("--batch", int, 3), ("--grad-accum", int, 2),
            ("--steps", int, 10), ("--lr", float, 1e-3), ("--warmup", int, 3),
            ("--min-lr-ratio", float, 0.1), ("--weight-decay", float, 0.1),
            ("--grad-clip", float, 1.0), ("--beta1", float, 0.9), ("--beta2", float, 0.95),
            ("--eps", float, 1e-8), ("--seed", int, 0)]:
        p.add_argument(flag, type=typ, default=default, help=f"default {default}")
    p.add_argument("--schedule", choices=["cosine", "constant"], default="cosine")


def build_parser():
    p = argparse.ArgumentParser(prog="gpt2_ref.py", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)

    c = sub.add_parser("case", help="write a case (model, shards, plan) and its reference")
    c.add_argument("outdir")
    add_case_options(c)
    c.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")

    m = sub.add_parser("compare", help="check a plait run against a case's reference")
    m.add_argument("casedir")
    m.add_argument("rundir")
    m.add_argument("--precision", choices=["fp32", "bf16"], default=None,
                   help="default: the plan's")

    sub.add_parser("selftest", help="check this referee itself")

    h = sub.add_parser("hf", help="a case's model.bin as a Hugging Face GPT-2 directory")
    h.add_argument("casedir")
    h.add_argument("outdir")

    e = sub.add_parser("measure-bf16", help="the measurements behind the bf16 tolerances")
    e.add_argument("--seeds", default="0:20", help="FIRST:END (default 0:20)")
    add_case_options(e)

    b = sub.add_parser("bench", help="PyTorch fp32 training step time")
    for flag, default in [("--layers", 12), ("--heads", 12), ("--hidden", 768),
                          ("--vocab", 50257), ("--padded-vocab", 50304), ("--seq-len", 64),
                          ("--max-seq-len", 1024), ("--batch", 4), ("--steps", 12),
                          ("--warmup-steps", 2), ("--threads", 2)]:
        b.add_argument(flag, type=int, default=default, help=f"default {default}")
    return p


def main():
    a = build_parser().parse_args()
    if a.cmd == "case":
        make_case(a.outdir, config_from_args(a))
        return 0
    if a.cmd == "compare":
        return 1 if compare(a.casedir, a.rundir, a.precision) else 0
    if a.cmd == "selftest":
        return 0 if selftest() else 1
    if a.cmd == "hf":
        write_hf(a.casedir, a.outdir)
        return 0
    if a.cmd == "measure-bf16":
        measure_bf16(a)
        return 0
    bench(a)
    return 0


if __name__ == "__main__":
    sys.exit(main())
