#!/usr/bin/env python3
"""fp16 mixed-precision fixtures (issue 19) for tests/e2e/test_fp16_train.c: a tiny GPT-2 and a tiny Llama
(transformers' LlamaForCausalLM), each trained STEPS steps from the same weights on the same data three ways:
  fp16: torch.autocast("cpu", dtype=torch.float16) + torch.amp.GradScaler("cpu") (init_scale INIT_SCALE,
        growth_interval WINDOW, backoff 0.5, growth 2: Megatron's rules with hysteresis 1, see Note
        [Dynamic loss scaling] in src/optim/loss_scale.c); INIT_SCALE is far above what fp16 gradients
        tolerate, so the first steps overflow and the scale backs off; the short WINDOW makes it grow back
        into overflow again and again: the forced overflow steps.
  fp32: the same loop without autocast, skipping the optimizer on the steps the fp16 run skipped (so that
        |fp32 - fp16| measures precision, not skipped updates).
Attention is eager softmax(q k^T / sqrt(hs)) v in both models (transformers' "eager"): its f16 rounding points
are explicit ops, which suanli's attention reproduces (Note [Eager half attention numerics] in
src/device/cpu/kernels/attention.c); torch's fused CPU SDPA in f16 rounds at points it does not document.
Saved per model (fp16_gpt2.safetensors, fp16_llama.safetensors):
  param.<name>            initial weights (f32)
  tokens                  int32 (B, T+1) of the step-0 forward; loss0_fp32/loss0_fp16 (1,), logits0_fp32 and
                          logits0_fp16 (B, T, V; the f16 logits widened to f32)
  train_tokens            int32 (STEPS, ACCUM, B, T+1)
  batch_loss0_fp32/_fp16  (STEPS,) the initial weights' losses on train_tokens[i, 0], forward only
  fp16_losses, fp16_scales (the scale each step's backward used), fp16_skipped (1 = inf/nan, no update),
  fp16_grad_norms (unscaled), fp32_losses   (STEPS,)
Requires torch (>= 2.3 for GradScaler("cpu")), transformers, safetensors.
Usage: python3 scripts/gen_fp16_parity.py [--outdir tests/fixtures/fp16]
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

STEPS, ACCUM, WARMUP = 100, 2, 5
INIT_SCALE = 2.0**24
WINDOW = {"gpt2": 8, "llama": 4}  # see fixture()
L, NH, C, V, T, B = 2, 4, 64, 128, 32, 2
NKV, I = 2, 96


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
        q, k, v = (z.view(b, t, NH, C // NH).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(C // NH)
        att = att.masked_fill(~torch.tril(torch.ones(t, t, dtype=torch.bool)), float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(b, t, C)
        x = x + self.attn.c_proj(y)
        return x + self.mlp.c_proj(F.gelu(self.mlp.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte = nn.Parameter(torch.empty(V, C))
        self.wpe = nn.Parameter(torch.empty(T, C))
        self.h = nn.ModuleList([Block() for _ in range(L)])
        self.ln_f = nn.LayerNorm(C)
        for name, p in self.named_parameters():
            if name.endswith("bias"):
                nn.init.normal_(p, 0.0, 0.02)
            elif "ln" in name:
                nn.init.normal_(p, 1.0, 0.1)
            else:
                std = 0.02 / math.sqrt(2 * L) if name.endswith("c_proj.weight") else 0.02
                nn.init.normal_(p, 0.0, std * 5)

    def forward(self, idx):
        x = self.wte[idx] + self.wpe[: idx.shape[1]]
        for blk in self.h:
            x = blk(x)
        return self.ln_f(x) @ self.wte.t()  # autocast: an f16 matmul


def llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(hidden_size=C, intermediate_size=I, num_hidden_layers=L, num_attention_heads=NH,
                      num_key_value_heads=NKV, vocab_size=V, max_position_embeddings=T, rms_norm_eps=1e-5,
                      rope_theta=10000.0, tie_word_embeddings=False)
    cfg._attn_implementation = "eager"
    m = LlamaForCausalLM(cfg)
    with torch.no_grad():
        for n, p in m.named_parameters():
            p.copy_(1.0 + 0.1 * torch.randn(p.shape) if "norm" in n else 0.1 * torch.randn(p.shape))
    return m


def logits_of(model, ids):
    out = model(ids)
    return out if torch.is_tensor(out) else out.logits


def loss_of(model, tk, fp16):
    with torch.autocast("cpu", dtype=torch.float16, enabled=fp16):
        logits = logits_of(model, tk[:, :-1])
        # cross-entropy is on autocast's fp32 list: the f16 logits are widened
        return logits, F.cross_entropy(logits.reshape(-1, V), tk[:, 1:].reshape(-1))


def run(make, init, tokens, fp16, window, skip_at=None):
    model = make()
    with torch.no_grad():
        for n, p in model.named_parameters():
            p.copy_(init["param." + n])
    opt = pc.adamw(model)
    scaler = torch.amp.GradScaler("cpu", init_scale=INIT_SCALE, growth_factor=2.0, backoff_factor=0.5,
                                  growth_interval=window, enabled=fp16)
    losses, scales, skipped, norms = [], [], [], []
    for it in range(STEPS):
        for grp in opt.param_groups:
            grp["lr"] = pc.lr_at(it, STEPS, WARMUP)
        opt.zero_grad(set_to_none=True)
        tot = 0.0
        for micro in range(ACCUM):
            _, l = loss_of(model, tokens[it, micro], fp16)
            scaler.scale(l / ACCUM).backward()
            tot += l.item()
        s = scaler.get_scale() if fp16 else 1.0
        scaler.unscale_(opt)
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), pc.CLIP)
        if fp16:
            scaler.step(opt)
            scaler.update()
            skip = scaler.get_scale() < s  # hysteresis 1, no floor: a backoff is exactly an inf/nan step
        else:
            skip = bool(skip_at[it])
            if not skip:
                opt.step()
        losses.append(tot / ACCUM)
        scales.append(s)
        skipped.append(1.0 if skip else 0.0)
        norms.append(norm.item())
    f = lambda v: torch.tensor(v, dtype=torch.float32)  # noqa: E731
    return f(losses), f(scales), f(skipped), f(norms)


def fixture(name, make, path):
    torch.manual_seed(1234)
    model = make()
    out = {"param." + n: p.detach().clone() for n, p in model.named_parameters()}
    g = torch.Generator().manual_seed(99)
    tokens = torch.randint(0, V, (B, T + 1), generator=g)
    with torch.no_grad():
        for fp16, tag in ((False, "fp32"), (True, "fp16")):
            logits, l = loss_of(model, tokens, fp16)
            out["logits0_" + tag] = logits.float().clone()
            out["loss0_" + tag] = l.float().reshape(1).clone()
    out["tokens"] = tokens.to(torch.int32)
    train_tokens = pc.learnable_tokens(g, (STEPS, ACCUM, B, T + 1), V)
    out["train_tokens"] = train_tokens.to(torch.int32)
    with torch.no_grad():  # step 0 on many batches: the initial weights' losses on train_tokens[:, 0]
        for fp16, tag in ((False, "fp32"), (True, "fp16")):
            out["batch_loss0_" + tag] = torch.tensor([loss_of(model, train_tokens[i, 0], fp16)[1].item()
                                                      for i in range(STEPS)], dtype=torch.float32)
    # Llama's window is 4, not 8: with 8 its gradients grew across the overflow threshold between two growth
    # steps (a drift crossing at step 12, decided by the last f16 rounding: suanli crossed a step later), and
    # with a short window the overflows come from the scale doubling, which either framework sees alike.
    l16, s16, k16, n16 = run(make, out, train_tokens, True, WINDOW[name])
    l32, _, _, _ = run(make, out, train_tokens, False, WINDOW[name], skip_at=k16)
    out.update(fp16_losses=l16, fp16_scales=s16, fp16_skipped=k16, fp16_grad_norms=n16, fp32_losses=l32)
    meta = dict(n_layer=L, n_head=NH, n_kv_head=NKV, n_embd=C, intermediate=I, vocab_size=V, seq_len=T, batch=B,
                **pc.optim_meta())
    meta.update(steps=STEPS, accum=ACCUM, warmup=WARMUP, init_scale=INIT_SCALE, window=WINDOW[name], hysteresis=1)
    d0 = abs(out["loss0_fp16"].item() - out["loss0_fp32"].item())
    print(f"{name}: step-0 loss fp32 {out['loss0_fp32'].item():.6f} fp16 {out['loss0_fp16'].item():.6f} "
          f"(|d| {d0:.3g}); skipped steps {[i for i in range(STEPS) if k16[i]]}; "
          f"mean |fp32-fp16| loss {(l32 - l16).abs().mean().item():.4g}; final scale {s16[-1].item():g}")
    pc.save(out, path, meta, l16[0].item(), l16.tolist()[::10])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--outdir", default="tests/fixtures/fp16")
    ap.add_argument("--only", choices=["gpt2", "llama"])
    args = ap.parse_args()
    torch.use_deterministic_algorithms(True)
    if args.only != "llama":
        fixture("gpt2", GPT, os.path.join(args.outdir, "fp16_gpt2.safetensors"))
    if args.only != "gpt2":
        fixture("llama", llama, os.path.join(args.outdir, "fp16_llama.safetensors"))


if __name__ == "__main__":
    main()
