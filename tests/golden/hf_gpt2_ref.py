#!/usr/bin/python3
"""hf_gpt2_ref.py — a small random GPT-2 as Hugging Face transformers saves a
GPT2LMHeadModel (config.json; its names; Conv1D weights stored (in, out);
three safetensors shards, in F32, BF16 and F16, named by
model.safetensors.index.json; the tied lm_head.weight saved beside
transformer.wte.weight), and its logits and loss on a fixed batch from a
PyTorch forward written after transformers' modeling_gpt2 (Conv1D as
addmm(bias, x, weight), gelu_new, the tied lm_head), in float64, on the
tensors read back from the files by this script's own safetensors reader.
It shares no code with plait (gpt2_ref.py lends it the token shard and
safetensors writers and its distances).

Run it with Debian's /usr/bin/python3 (python3-torch):
  hf_gpt2_ref.py case OUTDIR [--no-prefix] [--head same|none|other]
      OUTDIR/hf/ (the model; --no-prefix: names without "transformer.";
      --head: lm_head.weight equal to the embedding (default), left out, or
      another matrix), OUTDIR/train_000.bin, OUTDIR/plan.json (model.init
      hf/, one step), OUTDIR/ref/{logits.f32 (B·T, V), loss.json} and
      OUTDIR/ref/export{,_bf16}.jsonl: each tensor plait's fp32 (bf16) export
      must hold, as tests/hf/read.mjs prints it ({name, dtype, shape,
      sha256}, sorted; bf16 rounded to nearest even here)
  hf_gpt2_ref.py compare CASEDIR RUNDIR   RUNDIR/dump/logits.f32 (B·T, Vp)
      and step 1's loss in RUNDIR/metrics.jsonl against ref/: norm-wise
      relative distance of the logits and relative distance of the loss at
      most 1e-5; exit 1 otherwise.
"""

import argparse
import hashlib
import json
import math
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpt2_ref as g  # noqa: E402

L, NH, C, V, MAXT, T, B = 2, 2, 16, 53, 16, 8, 2
TOL = 1e-5
SHARDS = [("model-00001-of-00003.safetensors", "F32"),
          ("model-00002-of-00003.safetensors", "BF16"),
          ("model-00003-of-00003.safetensors", "F16")]


def random_tensors(gen, head):
    """transformers' GPT2LMHeadModel state dict (fp32), "transformer." names."""
    def normal(shape, std=0.02, mean=0.0):
        return (mean + std * torch.randn(shape, generator=gen, dtype=torch.float64)).numpy() \
            .astype(np.float32)
    t = {"transformer.wte.weight": normal((V, C), 0.1), "transformer.wpe.weight": normal((MAXT, C)),
         "transformer.ln_f.weight": normal((C,), 0.1, 1.0), "transformer.ln_f.bias": normal((C,))}
    conv = {"attn.c_attn": 3 * C, "attn.c_proj": C, "mlp.c_fc": 4 * C, "mlp.c_proj": C}
    for l in range(L):
        p = f"transformer.h.{l}."
        t[p + "ln_1.weight"], t[p + "ln_2.weight"] = normal((C,), 0.1, 1.0), normal((C,), 0.1, 1.0)
        t[p + "ln_1.bias"], t[p + "ln_2.bias"] = normal((C,)), normal((C,))
        for name, nf in conv.items():
            nx = 4 * C if name == "mlp.c_proj" else C
            t[p + name + ".weight"] = normal((nx, nf))  # Conv1D: (in, out)
            t[p + name + ".bias"] = normal((nf,))
    if head == "same":
        t["lm_head.weight"] = t["transformer.wte.weight"].copy()
    elif head == "other":
        t["lm_head.weight"] = normal((V, C), 0.1)
    return t


def shard_of(name):
    """Embeddings, final norm and head in the F32 file, layer l in file l+1."""
    parts = name.split(".")
    return SHARDS[int(parts[parts.index("h") + 1]) + 1] if "h" in parts else SHARDS[0]


def write_hf(d, tensors, prefix):
    os.makedirs(d, exist_ok=True)
    named = {(n if prefix else n.removeprefix("transformer.")): a for n, a in tensors.items()}
    weight_map = {n: shard_of(n)[0] for n in named}
    for fname, dtype in SHARDS:
        mine = {n: a for n, a in named.items() if weight_map[n] == fname}
        g.write_safetensors(os.path.join(d, fname), mine, {n: dtype for n in mine})
    total = sum(os.path.getsize(os.path.join(d, f)) for f, _ in SHARDS)
    with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump({"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "n_layer": L,
                   "n_head": NH, "n_embd": C, "n_positions": MAXT, "n_ctx": MAXT,
                   "vocab_size": V, "activation_function": "gelu_new",
                   "layer_norm_epsilon": 1e-5, "tie_word_embeddings": True,
                   "torch_dtype": "float32"}, f, indent=2)


# ---------------------------------------------------------------- reading back

def read_safetensors(path):
    """{name: float32 array} of one file, by the format's definition."""
    raw = open(path, "rb").read()
    n = int.from_bytes(raw[:8], "little")
    header, data = json.loads(raw[8:8 + n]), raw[8 + n:]
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        b, end = e["data_offsets"]
        buf = data[b:end]
        if e["dtype"] == "F32":
            a = np.frombuffer(buf, dtype="<f4")
        elif e["dtype"] == "F16":
            a = np.frombuffer(buf, dtype="<f2").astype(np.float32)
        elif e["dtype"] == "BF16":
            a = (np.frombuffer(buf, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
        else:
            raise SystemExit(f"hf_gpt2_ref: {path}: {name} is {e['dtype']}")
        out[name] = a.reshape(e["shape"])
    return out


def read_hf(d):
    """The directory's tensors by their "transformer." names, through its index."""
    with open(os.path.join(d, "model.safetensors.index.json")) as f:
        weight_map = json.load(f)["weight_map"]
    files = {f: read_safetensors(os.path.join(d, f)) for f in set(weight_map.values())}
    return {(n if n.startswith(("transformer.", "lm_head")) else "transformer." + n):
            files[f][n] for n, f in weight_map.items()}


# ---------------------------------------------------------------- transformers' forward

def conv1d(x, w, b):
    """transformers.pytorch_utils.Conv1D: x (..., nx) · w (nx, nf) + b."""
    size_out = x.size()[:-1] + (w.size(-1),)
    return torch.addmm(b, x.reshape(-1, x.size(-1)), w).view(size_out)


def gelu_new(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x.pow(3.0))))


def attention(h, p, t):
    """GPT2Attention: c_attn, split into heads, causal softmax(q·kᵀ/√hs), c_proj."""
    q, k, v = conv1d(h, t[p + "attn.c_attn.weight"], t[p + "attn.c_attn.bias"]).split(C, dim=2)
    heads = [x.view(*x.shape[:-1], NH, C // NH).permute(0, 2, 1, 3) for x in (q, k, v)]
    w = heads[0] @ heads[1].transpose(-1, -2) / (heads[2].size(-1) ** 0.5)
    n = w.size(-1)
    causal = torch.tril(torch.ones(n, n, dtype=torch.bool))
    w = torch.where(causal, w, torch.tensor(torch.finfo(w.dtype).min, dtype=w.dtype))
    a = (w.softmax(dim=-1) @ heads[2]).permute(0, 2, 1, 3).contiguous()
    a = a.view(*a.shape[:-2], C)
    return conv1d(a, t[p + "attn.c_proj.weight"], t[p + "attn.c_proj.bias"])


def gpt2_lm_logits(t, idx):
    """GPT2LMHeadModel's logits (B, T, V) for idx (B, T)."""
    def ln(x, name):
        return F.layer_norm(x, (C,), t[name + ".weight"], t[name + ".bias"], 1e-5)
    x = t["transformer.wte.weight"][idx] + t["transformer.wpe.weight"][:idx.shape[1]]
    for l in range(L):
        p = f"transformer.h.{l}."
        x = x + attention(ln(x, p + "ln_1"), p, t)
        h = gelu_new(conv1d(ln(x, p + "ln_2"), t[p + "mlp.c_fc.weight"], t[p + "mlp.c_fc.bias"]))
        x = x + conv1d(h, t[p + "mlp.c_proj.weight"], t[p + "mlp.c_proj.bias"])
    return ln(x, "transformer.ln_f") @ t["transformer.wte.weight"].T  # tied lm_head


# ---------------------------------------------------------------- case and compare

def export_listing(t, dtype):
    """What read.mjs prints of plait's export in dtype (F32, BF16): every
    tensor but the head."""
    rows = []
    for name, a in t.items():
        if name != "lm_head.weight":
            b = g.safetensors_bytes(a, dtype)
            rows.append(json.dumps({"name": name, "dtype": dtype, "shape": list(a.shape),
                                    "sha256": hashlib.sha256(b.tobytes()).hexdigest()},
                                   separators=(",", ":")))
    return "".join(r + "\n" for r in sorted(rows))


def make_case(outdir, prefix, head):
    gen = torch.Generator().manual_seed(21)
    write_hf(os.path.join(outdir, "hf"), random_tensors(gen, head), prefix)
    tokens = torch.randint(0, V, (2 * B * T + 1,), generator=gen).numpy()
    g.write_tokens(os.path.join(outdir, "train_000.bin"), tokens)
    plan = {"model": {"init": "hf", "seq_len": T, "seed": 1},
            "data": {"train": "train_*.bin", "shuffle": False},
            "batch": {"micro_batch": B, "grad_accum": 1}, "steps": 1, "precision": "fp32",
            "checkpoint": {"every": 0, "keep": 1}}
    with open(os.path.join(outdir, "plan.json"), "w") as f:
        json.dump(plan, f, indent=2)
    # everything below reads the files back
    t = read_hf(os.path.join(outdir, "hf"))
    window = torch.from_numpy(g.read_tokens(os.path.join(outdir, "train_000.bin"))[:B * T + 1]
                              .astype(np.int64))
    P = {n: torch.from_numpy(a.copy()).to(torch.float64) for n, a in t.items()}
    logits = gpt2_lm_logits(P, window[:-1].view(B, T))
    loss = F.cross_entropy(logits.reshape(-1, V), window[1:].reshape(-1))
    ref = os.path.join(outdir, "ref")
    os.makedirs(ref, exist_ok=True)
    logits.to(torch.float32).numpy().astype("<f4").tofile(os.path.join(ref, "logits.f32"))
    with open(os.path.join(ref, "loss.json"), "w") as f:
        json.dump({"loss": loss.item()}, f)
    for dtype, name in (("F32", "export.jsonl"), ("BF16", "export_bf16.jsonl")):
        with open(os.path.join(ref, name), "w") as f:
            f.write(export_listing(t, dtype))


def compare(casedir, rundir):
    with open(os.path.join(rundir, "plan.json")) as f:
        vp = json.load(f)["model"]["padded_vocab"]
    got = np.fromfile(os.path.join(rundir, "dump", "logits.f32"), dtype="<f4")
    if got.size != B * T * vp:
        return [f"{rundir}/dump/logits.f32: {got.size} floats, wanted {B * T} x {vp}"]
    want = np.fromfile(os.path.join(casedir, "ref", "logits.f32"), dtype="<f4")
    with open(os.path.join(casedir, "ref", "loss.json")) as f:
        want_loss = json.load(f)["loss"]
    metrics, problem = g.read_run_metrics(os.path.join(rundir, "metrics.jsonl"))
    if problem:
        return [problem]
    d_logits = g.rel_norm(got.reshape(B * T, vp)[:, :V], want.reshape(B * T, V))
    d_loss = g.rel(metrics[1]["loss"], want_loss)
    print(f"logits: relative distance {d_logits:.2e}; loss {metrics[1]['loss']:.7f} against "
          f"{want_loss:.7f}, {d_loss:.2e} (tolerance {TOL:.0e})")
    return [f"{what} {d:.2e} above {TOL:.0e}" for what, d in
            (("logits", d_logits), ("loss", d_loss)) if not d <= TOL]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("case")
    c.add_argument("outdir")
    c.add_argument("--no-prefix", action="store_true")
    c.add_argument("--head", choices=["same", "none", "other"], default="same")
    m = sub.add_parser("compare")
    m.add_argument("casedir")
    m.add_argument("rundir")
    a = p.parse_args()
    if a.cmd == "case":
        make_case(a.outdir, not a.no_prefix, a.head)
        return 0
    problems = compare(a.casedir, a.rundir)
    for x in problems:
        print(f"hf_gpt2_ref: {x}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
