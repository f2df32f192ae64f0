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
Metadata holds the config and hyper-parameters. Requires: torch, safetensors (pip).
Usage: python3 scripts/gen_gpt2_parity.py [--out tests/fixtures/gpt2_parity.safetensors]
"""
import argparse
import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from safetensors.torch import save_file

L, NH, C, V, T, B = 2, 4, 64, 256, 32, 4
STEPS, ACCUM = 10, 2
LR, MIN_LR, WARMUP, WD, CLIP = 1e-3, 1e-4, 3, 0.1, 1.0
BETA1, BETA2, EPS = 0.9, 0.95, 1e-8


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


def lr_at(it):
    if it < WARMUP:
        return LR * (it + 1) / WARMUP
    ratio = (it - WARMUP) / (STEPS - WARMUP)
    return MIN_LR + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (LR - MIN_LR)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="tests/fixtures/gpt2_parity.safetensors")
    args = ap.parse_args()
    torch.manual_seed(1234)
    torch.use_deterministic_algorithms(True)
    model = GPT()
    out = {}
    for n, p in model.named_parameters():
        out["param." + n] = p.detach().clone()
    g = torch.Generator().manual_seed(99)
    tokens = torch.randint(0, V, (B, T + 1), generator=g)
    logits, loss = model(tokens[:, :-1], tokens[:, 1:])
    loss.backward()
    out["tokens"] = tokens.to(torch.int32)
    out["logits"] = logits.detach().clone()
    out["loss"] = loss.detach().reshape(1).clone()
    for n, p in model.named_parameters():
        out["grad." + n] = p.grad.detach().clone()
    model.zero_grad(set_to_none=True)

    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": WD}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=LR, betas=(BETA1, BETA2), eps=EPS, foreach=False, fused=False)
    # learnable sequences (an affine recurrence with noise) so the loss visibly falls over the steps
    train_tokens = torch.randint(0, V, (STEPS, ACCUM, B, T + 1), generator=g)
    noise = torch.rand((STEPS, ACCUM, B, T + 1), generator=g) < 0.1
    for t in range(1, T + 1):
        nxt = (train_tokens[..., t - 1] * 5 + 1) % V
        train_tokens[..., t] = torch.where(noise[..., t], train_tokens[..., t], nxt)
    losses, norms, lrs = [], [], []
    for it in range(STEPS):
        lr = lr_at(it)
        for grp in opt.param_groups:
            grp["lr"] = lr
        opt.zero_grad(set_to_none=True)
        tot = 0.0
        for micro in range(ACCUM):
            tk = train_tokens[it, micro]
            _, l = model(tk[:, :-1], tk[:, 1:])
            (l / ACCUM).backward()
            tot += l.item()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        opt.step()
        losses.append(tot / ACCUM)
        norms.append(norm.item())
        lrs.append(lr)
    out["train_tokens"] = train_tokens.to(torch.int32)
    out["step_losses"] = torch.tensor(losses, dtype=torch.float32)
    out["step_grad_norms"] = torch.tensor(norms, dtype=torch.float32)
    out["step_lrs"] = torch.tensor(lrs, dtype=torch.float32)
    for n, p in model.named_parameters():
        out["final." + n] = p.detach().clone()
    meta = {k: str(v) for k, v in dict(n_layer=L, n_head=NH, n_embd=C, vocab_size=V, seq_len=T, batch=B, steps=STEPS,
                                         accum=ACCUM, lr=LR, min_lr=MIN_LR, warmup=WARMUP, weight_decay=WD, clip=CLIP,
                                         beta1=BETA1, beta2=BETA2, eps=EPS, torch=torch.__version__).items()}
    save_file({k: v.contiguous() for k, v in out.items()}, args.out, metadata=meta)
    print(f"wrote {args.out}: loss {loss.item():.6f}, step losses {[round(x, 5) for x in losses]}")


if __name__ == "__main__":
    main()
