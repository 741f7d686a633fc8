#!/usr/bin/env python3
"""torch_gpt2.py — PyTorch's tokens/s for the GPT-2 make bench-cuda trains:
the reference plait-train is measured against, in the same run.

The same model (GPT-2: learned positions, pre-LayerNorm blocks, GELU tanh,
tied LM head, padded vocabulary), the same batch (micro_batch × seq_len tokens
a step, no accumulation) and the same optimizer (AdamW, lr 1e-4, betas 0.9,
0.95, eps 1e-8, weight decay 0) as the plan bench/bench_cuda.sh writes, trained
the way a careful PyTorch user would: torch.compile, bf16 autocast,
scaled_dot_product_attention (flash attention where available) and the fused
AdamW. Prints one JSON line: {"tokens_per_s", "step_ms", "steps"} (median of
the timed steps; the first `--warmup` steps, which compile, are dropped).
Not a test. `--device cpu --no-compile` with a small model is a smoke test."""
import argparse
import json
import math
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


def attention(q, k, v):
    """Causal attention: SDPA (PyTorch 2), or the plain product where it is older
    (the smoke test on a development machine)."""
    if hasattr(F, "scaled_dot_product_attention"):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    T = q.shape[-2]
    s = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
    s = s.masked_fill(torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    return s.softmax(-1) @ v


class Block(nn.Module):
    def __init__(self, C, NH):
        super().__init__()
        self.NH = NH
        self.ln_1 = nn.LayerNorm(C)
        self.c_attn = nn.Linear(C, 3 * C)
        self.c_proj = nn.Linear(C, C)
        self.ln_2 = nn.LayerNorm(C)
        self.c_fc = nn.Linear(C, 4 * C)
        self.c_fc_proj = nn.Linear(4 * C, C)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.NH, C // self.NH).transpose(1, 2) for t in (q, k, v))
        y = attention(q, k, v)
        x = x + self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))
        return x + self.c_fc_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, L, NH, C, Vp, T):
        super().__init__()
        self.wte = nn.Embedding(Vp, C)
        self.wpe = nn.Embedding(T, C)
        self.h = nn.ModuleList(Block(C, NH) for _ in range(L))
        self.ln_f = nn.LayerNorm(C)
        for name, p in self.named_parameters():  # GPT-2's initialisation
            if p.dim() == 2:
                std = 0.02 / math.sqrt(2 * L) if name.endswith("proj.weight") else 0.02
                nn.init.normal_(p, 0.0, std)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, idx, targets, V):
        T = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
        for block in self.h:
            x = block(x)
        logits = self.ln_f(x) @ self.wte.weight.t()  # the tied head
        return F.cross_entropy(logits[..., :V].float().flatten(0, 1), targets.flatten())


def main():
    a = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    a.add_argument("--layers", type=int, default=12)
    a.add_argument("--heads", type=int, default=12)
    a.add_argument("--hidden", type=int, default=768)
    a.add_argument("--vocab", type=int, default=50257)
    a.add_argument("--padded-vocab", type=int, default=50304)
    a.add_argument("--seq-len", type=int, default=1024)
    a.add_argument("--micro-batch", type=int, default=16)
    a.add_argument("--steps", type=int, default=10, help="timed steps")
    a.add_argument("--warmup", type=int, default=3, help="untimed first steps (compilation)")
    a.add_argument("--device", default="cuda")
    a.add_argument("--no-compile", action="store_true")
    args = a.parse_args()

    torch.manual_seed(0)
    dev = torch.device(args.device)
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    model = GPT(args.layers, args.heads, args.hidden, args.padded_vocab, args.seq_len).to(dev)
    fused = {"fused": True} if dev.type == "cuda" else {}  # (older PyTorch: no such option)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95), eps=1e-8,
                            weight_decay=0.0, **fused)
    step_fn = model if args.no_compile else torch.compile(model)
    g = torch.Generator().manual_seed(1)
    shape = (args.micro_batch, args.seq_len)
    idx = torch.randint(0, args.vocab, shape, generator=g).to(dev)
    targets = torch.randint(0, args.vocab, shape, generator=g).to(dev)

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize()

    times = []
    for i in range(args.warmup + args.steps):
        sync()
        t0 = time.perf_counter()
        with torch.autocast(dev.type, dtype=torch.bfloat16):
            loss = step_fn(idx, targets, args.vocab)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        sync()
        if i >= args.warmup:
            times.append(time.perf_counter() - t0)
    step_s = statistics.median(times)
    print(json.dumps({"tokens_per_s": args.micro_batch * args.seq_len / step_s,
                      "step_ms": 1e3 * step_s, "steps": len(times),
                      "loss": float(loss)}))


if __name__ == "__main__":
    main()
