#!/usr/bin/env python3
"""The PyTorch anchor of bench/time_to_loss.sh: nanoGPT's CPU "baby GPT" recipe (model.py's GPT with its
dropout places, train.py's AdamW / cosine schedule / clipping, shakespeare_char's settings as in nanoGPT's
README CPU command, dropout 0.2 unless --dropout; that README command itself sets --dropout=0.0, and its
val 1.88 is with no dropout) on tinyshakespeare bytes with the same 90/10 split as `suanli data prepare`.
Prints "final val loss X" (mean over 20 random val batches, as nanoGPT's --eval_iters=20).
Usage: python bench/tools/nanogpt_baby.py --data data/tinyshakespeare.txt [--iters 2000] [--threads 2] [--dropout P]
"""
import argparse
import math
import os
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

L, NH, C, T, B, V, P = 4, 4, 128, 64, 12, 256, 0.2


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(C), nn.LayerNorm(C)
        self.c_attn, self.c_proj = nn.Linear(C, 3 * C), nn.Linear(C, C)
        self.c_fc, self.mlp_proj = nn.Linear(C, 4 * C), nn.Linear(4 * C, C)
        self.drop = nn.Dropout(P)

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        q, k, v = (z.view(b, t, NH, C // NH).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=P if self.training else 0.0, is_causal=True)
        x = x + self.drop(self.c_proj(y.transpose(1, 2).reshape(b, t, C)))
        return x + self.drop(self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)))))


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(V, C), nn.Embedding(T, C)
        self.drop, self.h, self.ln_f = nn.Dropout(P), nn.ModuleList([Block() for _ in range(L)]), nn.LayerNorm(C)
        self.apply(self._init)
        for n, p in self.named_parameters():
            if n.endswith("c_proj.weight") or n.endswith("mlp_proj.weight"):
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * L))

    @staticmethod
    def _init(m):
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, 0.0, 0.02)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)

    def forward(self, idx, targets):
        x = self.drop(self.wte(idx) + self.wpe(torch.arange(idx.shape[1])))
        for blk in self.h:
            x = blk(x)
        logits = self.ln_f(x) @ self.wte.weight.t()
        return F.cross_entropy(logits.reshape(-1, V), targets.reshape(-1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True)
    ap.add_argument("--iters", type=int, default=2000)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--dropout", type=float, default=0.2)
    a = ap.parse_args()
    if a.iters < 1 or a.threads < 1 or not 0 <= a.dropout < 1:
        ap.error("--iters and --threads must be at least 1 and --dropout in [0, 1)")
    if not os.path.isfile(a.data):
        ap.error(f"--data {a.data}: no such file")
    global P
    P = a.dropout
    torch.set_num_threads(a.threads)
    torch.manual_seed(1337)
    data = np.frombuffer(open(a.data, "rb").read(), dtype=np.uint8)
    n = int(len(data) * 0.9)
    split = {"train": torch.from_numpy(data[:n].astype(np.int64)), "val": torch.from_numpy(data[n:].astype(np.int64))}

    def batch(s):
        d = split[s]
        ix = torch.randint(len(d) - T, (B,))
        return torch.stack([d[i:i + T] for i in ix]), torch.stack([d[i + 1:i + 1 + T] for i in ix])

    model = GPT()
    decay = [p for p in model.parameters() if p.dim() >= 2]
    other = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": other, "weight_decay": 0.0}],
                            lr=1e-3, betas=(0.9, 0.99))

    def lr_at(it, warm=100, lr=1e-3, min_lr=1e-4):
        if it < warm:
            return lr * (it + 1) / (warm + 1)
        r = (it - warm) / (a.iters - warm)
        return min_lr + 0.5 * (1.0 + math.cos(math.pi * min(r, 1.0))) * (lr - min_lr)

    @torch.no_grad()
    def val_loss():
        model.eval()
        v = sum(model(*batch("val")).item() for _ in range(20)) / 20
        model.train()
        return v

    t0 = time.time()
    for it in range(a.iters):
        if it % 250 == 0 and it:
            print(f"step {it} val {val_loss():.4f} ({time.time() - t0:.1f} s)", flush=True)
        for g in opt.param_groups:
            g["lr"] = lr_at(it)
        loss = model(*batch("train"))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
    print(f"trained {a.iters} steps in {time.time() - t0:.1f} s; final val loss {val_loss():.4f}")


if __name__ == "__main__":
    main()
