#!/usr/bin/env python3
"""Llama training parity fixture (tests/hf/test_llama_parity.c), from transformers' LlamaForCausalLM (fp32,
eager attention): same layout as scripts/gen_gpt2_parity.py —
  param.<name> / grad.<name> / final.<name>, tokens, logits, loss, train_tokens, step_losses,
  step_grad_norms, step_lrs — for one forward/backward and STEPS AdamW steps with gradient accumulation,
clipping and warmup+cosine. Names are transformers' (model.layers.0.self_attn.q_proj.weight, ...).
Also AC_STEPS steps of the same model from the same weights under torch.autocast("cpu", bfloat16)
(ac_tokens, ac_losses) and, for scale, the same run in fp32 (fp32_losses).
  pip install torch transformers safetensors
  python3 scripts/gen_llama_parity.py [--out tests/fixtures/hf/llama_train.safetensors]
"""
import argparse
import math

import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from transformers import LlamaConfig, LlamaForCausalLM

L, NH, NKV, C, I, V, T, B = 2, 4, 2, 64, 96, 128, 32, 4
STEPS, ACCUM = 10, 2
LR, MIN_LR, WARMUP, WD, CLIP = 1e-3, 1e-4, 3, 0.1, 1.0
BETA1, BETA2, EPS, RMS_EPS, THETA = 0.9, 0.95, 1e-8, 1e-5, 10000.0


AC_STEPS, AC_WARMUP = 100, 10


def lr_at(it, steps=STEPS, warmup=WARMUP):
    if it < warmup:
        return LR * (it + 1) / warmup
    ratio = (it - warmup) / (steps - warmup)
    return MIN_LR + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (LR - MIN_LR)


def loss_of(model, tk):
    logits = model(tk[:, :-1]).logits
    return logits, F.cross_entropy(logits.reshape(-1, V), tk[:, 1:].reshape(-1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="tests/fixtures/hf/llama_train.safetensors")
    args = ap.parse_args()
    torch.manual_seed(1234)
    torch.use_deterministic_algorithms(True)
    cfg = LlamaConfig(hidden_size=C, intermediate_size=I, num_hidden_layers=L, num_attention_heads=NH,
                      num_key_value_heads=NKV, vocab_size=V, max_position_embeddings=T, rms_norm_eps=RMS_EPS,
                      rope_theta=THETA, tie_word_embeddings=False)
    cfg._attn_implementation = "eager"
    model = LlamaForCausalLM(cfg)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "norm" in n:
                p.copy_(1.0 + 0.1 * torch.randn(p.shape))
            else:
                p.copy_(0.1 * torch.randn(p.shape))
    out = {"param." + n: p.detach().clone() for n, p in model.named_parameters()}
    g = torch.Generator().manual_seed(99)
    tokens = torch.randint(0, V, (B, T + 1), generator=g)
    logits, loss = loss_of(model, tokens)
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
            _, l = loss_of(model, train_tokens[it, micro])
            (l / ACCUM).backward()
            tot += l.item()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        opt.step()
        losses.append(tot / ACCUM)
        norms.append(norm.item())
        lrs.append(lr)
    out["train_tokens"] = train_tokens.to(torch.int32)
    # autocast-bf16 run (and its fp32 twin) from the initial weights
    ac_tokens = torch.randint(0, V, (AC_STEPS, B, T + 1), generator=g)
    acn = torch.rand((AC_STEPS, B, T + 1), generator=g) < 0.1
    for t in range(1, T + 1):
        nxt = (ac_tokens[..., t - 1] * 5 + 1) % V
        ac_tokens[..., t] = torch.where(acn[..., t], ac_tokens[..., t], nxt)
    out["ac_tokens"] = ac_tokens.to(torch.int32)
    for mode in ["bf16", "fp32"]:
        m2 = LlamaForCausalLM(cfg)
        with torch.no_grad():
            for n, p in m2.named_parameters():
                p.copy_(out["param." + n])
        dec = [p for n, p in m2.named_parameters() if p.dim() >= 2]
        nodec = [p for n, p in m2.named_parameters() if p.dim() < 2]
        o2 = torch.optim.AdamW([{"params": dec, "weight_decay": WD}, {"params": nodec, "weight_decay": 0.0}],
                               lr=LR, betas=(BETA1, BETA2), eps=EPS, foreach=False, fused=False)
        ls = []
        for it in range(AC_STEPS):
            for grp in o2.param_groups:
                grp["lr"] = lr_at(it, AC_STEPS, AC_WARMUP)
            o2.zero_grad(set_to_none=True)
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=(mode == "bf16")):
                logits = m2(ac_tokens[it, :, :-1]).logits
            l = F.cross_entropy(logits.float().reshape(-1, V), ac_tokens[it, :, 1:].reshape(-1))
            l.backward()
            torch.nn.utils.clip_grad_norm_(m2.parameters(), CLIP)
            o2.step()
            ls.append(l.item())
        out["ac_losses" if mode == "bf16" else "fp32_losses"] = torch.tensor(ls, dtype=torch.float32)
        print(mode, "losses", [round(x, 4) for x in ls[::10]])
    out["step_losses"] = torch.tensor(losses, dtype=torch.float32)
    out["step_grad_norms"] = torch.tensor(norms, dtype=torch.float32)
    out["step_lrs"] = torch.tensor(lrs, dtype=torch.float32)
    for n, p in model.named_parameters():
        out["final." + n] = p.detach().clone()
    meta = {k: str(v) for k, v in dict(n_layer=L, n_head=NH, n_kv_head=NKV, hidden=C, intermediate=I, vocab_size=V,
                                         seq_len=T, batch=B, steps=STEPS, accum=ACCUM, lr=LR, min_lr=MIN_LR,
                                         warmup=WARMUP, weight_decay=WD, clip=CLIP, beta1=BETA1, beta2=BETA2, eps=EPS,
                                         rms_eps=RMS_EPS, rope_theta=THETA, ac_steps=AC_STEPS, ac_warmup=AC_WARMUP,
                                         torch=torch.__version__).items()}
    save_file({k: v.contiguous() for k, v in out.items()}, args.out, metadata=meta)
    print(f"wrote {args.out}: loss {loss.item():.6f}, step losses {[round(x, 5) for x in losses]}")


if __name__ == "__main__":
    main()
