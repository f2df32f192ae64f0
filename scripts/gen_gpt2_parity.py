#!/usr/bin/env python3
"""Generate the GPT-2 PyTorch parity fixture used by tests/e2e/test_gpt2_parity.c.

A tiny GPT-2 (pre-LN, tied embedding, GELU-tanh, nn.Linear weight layout (out, in)) written directly in
PyTorch with the same parameter names as suanli. Saves, in one safetensors file:
  param.<name>        initial weights
  tokens              int32 (B, T+1): inputs = [:, :-1], targets = [:, 1:]
  logits, loss        forward outputs on `tokens`
  grad.<name>         d(loss)/d(param) on `tokens`
  train_tokens        int32 (STEPS, ACCUM, B, T+1): micro-batches of the training run
  step_losses         (STEPS,) mean micro-batch loss of each step, before its update
  step_grad_norms     (STEPS,) global grad norm before clipping
  step_lrs            (STEPS,) learning rate used at each step
  final.<name>        weights after STEPS AdamW steps
Metadata holds the config and hyper-parameters. Shared pieces: scripts/parity_common.py. Requires: torch, safetensors (pip).
Usage: python3 scripts/gen_gpt2_parity.py [--out tests/fixtures/gpt2_parity.safetensors]
"""
import argparse
import math
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import parity_common as pc  # noqa: E402

L, NH, C, V, T, B = 2, 4, 64, 256, 32, 4


class Block(nn.Module):
    def __init__(self):
        super().__init__()
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
        q, k, v = self.attn.c_attn(self.ln_1(x)).split(C, dim=2)
        q = q.view(b, t, NH, C // NH).transpose(1, 2)
        k = k.view(b, t, NH, C // NH).transpose(1, 2)
        v = v.view(b, t, NH, C // NH).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(C // NH)
        mask = torch.tril(torch.ones(t, t, dtype=torch.bool))
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(b, t, C)
        x = x + self.attn.c_proj(y)
        x = x + self.mlp.c_proj(F.gelu(self.mlp.c_fc(self.ln_2(x)), approximate="tanh"))
        return x


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte = nn.Parameter(torch.empty(V, C))
        self.wpe = nn.Parameter(torch.empty(T, C))
        self.h = nn.ModuleList([Block() for _ in range(L)])
        self.ln_f = nn.LayerNorm(C)
        for name, p in self.named_parameters():
            if name.endswith("bias"):
                nn.init.normal_(p, 0.0, 0.02)  # nonzero biases so their gradients are exercised
            elif "ln" in name:
                nn.init.normal_(p, 1.0, 0.1)
            else:
                std = 0.02 / math.sqrt(2 * L) if name.endswith("c_proj.weight") else 0.02
                nn.init.normal_(p, 0.0, std * 5)  # larger than GPT-2's so logits are not flat

    def forward(self, idx, targets):
        t = idx.shape[1]
        x = self.wte[idx] + self.wpe[:t]
        for blk in self.h:
            x = blk(x)
        logits = self.ln_f(x) @ self.wte.t()
        loss = F.cross_entropy(logits.reshape(-1, V), targets.reshape(-1))
        return logits, loss


def loss_of(model, tk):
    return model(tk[:, :-1], tk[:, 1:])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="tests/fixtures/gpt2_parity.safetensors")
    args = ap.parse_args()
    torch.manual_seed(1234)
    torch.use_deterministic_algorithms(True)
    model = GPT()
    out = {}
    g = torch.Generator().manual_seed(99)
    loss = pc.forward_backward(model, loss_of, g, B, T, V, out)
    losses = pc.train(model, loss_of, pc.learnable_tokens(g, (pc.STEPS, pc.ACCUM, B, T + 1), V), out)
    meta = dict(n_layer=L, n_head=NH, n_embd=C, vocab_size=V, seq_len=T, batch=B, **pc.optim_meta())
    pc.save(out, args.out, meta, loss, losses)


if __name__ == "__main__":
    main()
