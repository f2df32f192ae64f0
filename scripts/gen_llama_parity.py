#!/usr/bin/env python3
"""Llama training parity fixture (tests/hf/test_llama_parity.c), from transformers' LlamaForCausalLM (fp32,
eager attention): same layout as scripts/gen_gpt2_parity.py —
  param.<name> / grad.<name> / final.<name>, tokens, logits, loss, train_tokens, step_losses,
  step_grad_norms, step_lrs — for one forward/backward and STEPS AdamW steps with gradient accumulation,
clipping and warmup+cosine. Names are transformers' (model.layers.0.self_attn.q_proj.weight, ...).
Also AC_STEPS steps of the same model from the same weights under torch.autocast("cpu", bfloat16)
(ac_tokens, ac_losses) and, for scale, the same run in fp32 (fp32_losses). And the STEPS-step run in float64
(f64_step_losses, f64_final.<name>): how far PyTorch's own fp32 run is from exact, to size the final-weight
bar (as scripts/gen_family_parity.py).
  pip install torch transformers safetensors
  python3 scripts/gen_llama_parity.py [--out tests/fixtures/hf/llama_train.safetensors]
"""
import argparse
import os
import sys

import torch
import torch.nn.functional as F
from transformers import LlamaConfig, LlamaForCausalLM

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import parity_common as pc  # noqa: E402

L, NH, NKV, C, I, V, T, B = 2, 4, 2, 64, 96, 128, 32, 4
RMS_EPS, THETA = 1e-5, 10000.0
AC_STEPS, AC_WARMUP = 100, 10


def loss_of(model, tk):
    logits = model(tk[:, :-1]).logits
    return logits, F.cross_entropy(logits.reshape(-1, V), tk[:, 1:].reshape(-1))


def autocast_run(cfg, init, ac_tokens, bf16):
    """AC_STEPS steps (no accumulation) from the weights `init`, under torch.autocast bf16 or in fp32."""
    m2 = LlamaForCausalLM(cfg)
    with torch.no_grad():
        for n, p in m2.named_parameters():
            p.copy_(init["param." + n])
    o2 = pc.adamw(m2)
    ls = []
    for it in range(AC_STEPS):
        for grp in o2.param_groups:
            grp["lr"] = pc.lr_at(it, AC_STEPS, AC_WARMUP)
        o2.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            logits = m2(ac_tokens[it, :, :-1]).logits
        l = F.cross_entropy(logits.float().reshape(-1, V), ac_tokens[it, :, 1:].reshape(-1))
        l.backward()
        torch.nn.utils.clip_grad_norm_(m2.parameters(), pc.CLIP)
        o2.step()
        ls.append(l.item())
    print("bf16" if bf16 else "fp32", "losses", [round(x, 4) for x in ls[::10]])
    return torch.tensor(ls, dtype=torch.float32)


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
    out = {}
    g = torch.Generator().manual_seed(99)
    loss = pc.forward_backward(model, loss_of, g, B, T, V, out)
    train_tokens = pc.learnable_tokens(g, (pc.STEPS, pc.ACCUM, B, T + 1), V)
    losses = pc.train(model, loss_of, train_tokens, out)
    m64 = LlamaForCausalLM(cfg).double()
    with torch.no_grad():
        for n, p in m64.named_parameters():
            p.copy_(out["param." + n].double())
    o64 = {}
    l64 = pc.train(m64, loss_of, train_tokens, o64)
    out["f64_step_losses"] = torch.tensor(l64, dtype=torch.float64).float()
    out.update({"f64_" + k: v.float() for k, v in o64.items() if k.startswith("final.")})
    # autocast-bf16 run (and its fp32 twin) from the initial weights
    ac_tokens = pc.learnable_tokens(g, (AC_STEPS, B, T + 1), V)
    out["ac_tokens"] = ac_tokens.to(torch.int32)
    out["ac_losses"] = autocast_run(cfg, out, ac_tokens, True)
    out["fp32_losses"] = autocast_run(cfg, out, ac_tokens, False)
    meta = dict(n_layer=L, n_head=NH, n_kv_head=NKV, hidden=C, intermediate=I, vocab_size=V, seq_len=T, batch=B,
                **pc.optim_meta(), rms_eps=RMS_EPS, rope_theta=THETA, ac_steps=AC_STEPS, ac_warmup=AC_WARMUP)
    pc.save(out, args.out, meta, loss, losses)


if __name__ == "__main__":
    main()
