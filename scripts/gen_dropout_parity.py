#!/usr/bin/env python3
"""Generate the dropout parity fixture used by tests/e2e/test_dropout_parity.c.

PyTorch's CPU generator cannot be reproduced in C, so this script draws every dropout mask from the same
counters as suanli (Note [Dropout from counters] in src/ops/build.c), with Philox-4x32-10 reimplemented
below in numpy (checked against the Random123 known-answer vectors), and applies it the way
torch.nn.functional.dropout does: x * mask * 1/(1-p) (inverted dropout). Element e of site s in micro-batch
stream n is kept iff philox(key=seed, counter=(n * 2^16 + s, e // 4))[e % 4] >= p * 2^32. The model is the
tiny GPT-2 of scripts/gen_gpt2_parity.py with nanoGPT's four dropout places: the embedding output (site 0),
and in layer l the attention probabilities (1 + 3 l), the attention block's output projection (2 + 3 l) and
the MLP's output (3 + 3 l). Layout: the one of scripts/parity_common.py (one forward/backward with stream 0,
then STEPS AdamW steps; micro-batch j of step i uses stream i * ACCUM + j), plus `philox_kat`.
Usage: /tmp/moe-venv/bin/python scripts/gen_dropout_parity.py [--out tests/fixtures/dropout_parity.safetensors]
"""
import argparse
import math
import os
import sys

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import parity_common as pc  # noqa: E402

L, NH, C, V, T, B = 2, 4, 32, 64, 16, 4
P_ATTN, P_HIDDEN = 0.25, 0.2
SEED = 0x5EED0FD12
M32 = np.uint64(0xFFFFFFFF)


def philox4x32(key, hi, lo):
    """Philox-4x32-10 of 64-bit key, 64-bit counter words hi and lo (numpy uint64 array) -> 4 x uint32."""
    lo = np.asarray(lo, dtype=np.uint64)
    c0, c1 = lo & M32, lo >> np.uint64(32)
    c2 = np.full_like(lo, np.uint64(hi) & M32)
    c3 = np.full_like(lo, np.uint64(hi) >> np.uint64(32))
    k0, k1 = key & 0xFFFFFFFF, key >> 32
    for _ in range(10):
        p0, p1 = np.uint64(0xD2511F53) * c0, np.uint64(0xCD9E8D57) * c2
        c0, c1, c2, c3 = ((p1 >> np.uint64(32)) ^ c1 ^ np.uint64(k0), p1 & M32,
                          (p0 >> np.uint64(32)) ^ c3 ^ np.uint64(k1), p0 & M32)
        k0, k1 = (k0 + 0x9E3779B9) & 0xFFFFFFFF, (k1 + 0xBB67AE85) & 0xFFFFFFFF
    return c0, c1, c2, c3


def kat():
    """Random123's known answers for Philox-4x32-10."""
    z = [int(w[0]) for w in philox4x32(0, 0, [0])]
    f = [int(w[0]) for w in philox4x32(0xFFFFFFFFFFFFFFFF, 0xFFFFFFFFFFFFFFFF, [0xFFFFFFFFFFFFFFFF])]
    assert z == [0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8], [hex(x) for x in z]
    assert f == [0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD], [hex(x) for x in f]
    return z + f


def mask(p, stream, site, shape):
    """The float32 multipliers (0 or 1/(1-p)) of a tensor of `shape`, element order = row-major."""
    n = int(np.prod(shape))
    e = np.arange(n, dtype=np.uint64)
    words = philox4x32(SEED, (stream << 16) | site, e >> np.uint64(2))
    u = np.choose((e & np.uint64(3)).astype(np.int64), words)
    thr = min(int(float(np.float32(p)) * 4294967296.0), 0xFFFFFFFF)
    scale = np.float32(1.0 / (1.0 - float(np.float32(p))))
    return torch.from_numpy(np.where(u >= thr, scale, np.float32(0)).astype(np.float32).reshape(shape))


class Stream:
    n = 0  # the micro-batch counter of the masks


def drop(x, p, site):
    return x * mask(p, Stream.n, site, tuple(x.shape))


class Block(nn.Module):
    def __init__(self, layer):
        super().__init__()
        self.layer = layer
        self.ln_1 = nn.LayerNorm(C)
        self.attn = nn.Module()
        self.attn.c_attn = nn.Linear(C, 3 * C)
        self.attn.c_proj = nn.Linear(C, C)
        self.ln_2 = nn.LayerNorm(C)
        self.mlp = nn.Module()
        self.mlp.c_fc = nn.Linear(C, 4 * C)
        self.mlp.c_proj = nn.Linear(4 * C, C)

    def forward(self, x):
        b, t, _ = x.shape
        site = 1 + 3 * self.layer
        q, k, v = self.attn.c_attn(self.ln_1(x)).split(C, dim=2)
        q = q.view(b, t, NH, C // NH).transpose(1, 2)
        k = k.view(b, t, NH, C // NH).transpose(1, 2)
        v = v.view(b, t, NH, C // NH).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(C // NH)
        causal = torch.tril(torch.ones(t, t, dtype=torch.bool))
        att = att.masked_fill(~causal, float("-inf")).softmax(dim=-1)
        att = drop(att, P_ATTN, site)  # (B, NH, T, T): nanoGPT's attn_dropout
        y = (att @ v).transpose(1, 2).reshape(b, t, C)
        x = x + drop(self.attn.c_proj(y), P_HIDDEN, site + 1)  # resid_dropout
        h = self.mlp.c_proj(F.gelu(self.mlp.c_fc(self.ln_2(x)), approximate="tanh"))
        return x + drop(h, P_HIDDEN, site + 2)  # mlp dropout


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte = nn.Parameter(torch.empty(V, C))
        self.wpe = nn.Parameter(torch.empty(T, C))
        self.h = nn.ModuleList([Block(i) for i in range(L)])
        self.ln_f = nn.LayerNorm(C)
        for name, p in self.named_parameters():
            if name.endswith("bias"):
                nn.init.normal_(p, 0.0, 0.02)
            elif "ln" in name:
                nn.init.normal_(p, 1.0, 0.1)
            else:
                std = 0.02 / math.sqrt(2 * L) if name.endswith("c_proj.weight") else 0.02
                nn.init.normal_(p, 0.0, std * 5)

    def forward(self, idx, targets):
        t = idx.shape[1]
        x = drop(self.wte[idx] + self.wpe[:t], P_HIDDEN, 0)  # transformer.drop
        for blk in self.h:
            x = blk(x)
        logits = self.ln_f(x) @ self.wte.t()
        return logits, F.cross_entropy(logits.reshape(-1, V), targets.reshape(-1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="tests/fixtures/dropout_parity.safetensors")
    args = ap.parse_args()
    k = kat()
    torch.manual_seed(4321)
    torch.use_deterministic_algorithms(True)
    model = GPT()
    out = {"philox_kat": torch.tensor(np.array(k, dtype=np.uint32).view(np.int32))}
    g = torch.Generator().manual_seed(77)
    Stream.n = 0
    loss = pc.forward_backward(model, lambda m, tk: m(tk[:, :-1], tk[:, 1:]), g, B, T, V, out)

    def loss_of(m, tk):  # pc.train calls this step by step, micro-batch by micro-batch
        r = m(tk[:, :-1], tk[:, 1:])
        Stream.n += 1
        return r

    Stream.n = 0
    losses = pc.train(model, loss_of, pc.learnable_tokens(g, (pc.STEPS, pc.ACCUM, B, T + 1), V), out)
    meta = dict(n_layer=L, n_head=NH, n_embd=C, vocab_size=V, seq_len=T, batch=B, p_attn=P_ATTN,
                p_hidden=P_HIDDEN, dropout_seed=SEED, **pc.optim_meta())
    pc.save(out, args.out, meta, loss, losses)


if __name__ == "__main__":
    main()
