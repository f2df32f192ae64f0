#!/usr/bin/env python3
"""Tiny random GPT-2 in Hugging Face format + reference logits, for tests/e2e/test_hf_gpt2.c.

Writes tests/fixtures/hf_gpt2/{config.json, model.safetensors} (GPT2LMHeadModel.save_pretrained) and
tests/fixtures/hf_gpt2/reference.safetensors with `ids` (int32 [2, 12]) and `logits` (fp32 [2, 12, V]).
Usage: python3 scripts/gen_hf_gpt2.py [--check-export DIR]  (--check-export: load a directory written by
`suanli convert` with transformers and compare its logits to the reference).
Requires: torch, transformers, safetensors (pip).
"""
import argparse
import os

import torch
from safetensors.torch import load_file, save_file
from transformers import GPT2Config, GPT2LMHeadModel

OUT = "tests/fixtures/hf_gpt2"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--check-export")
    args = ap.parse_args()
    if args.check_export:
        ref = load_file(os.path.join(OUT, "reference.safetensors"))
        m = GPT2LMHeadModel.from_pretrained(args.check_export).eval()
        with torch.no_grad():
            lg = m(ref["ids"].long()).logits
        d = (lg - ref["logits"]).abs().max().item()
        print(f"exported model logits max|d| = {d:.3g}")
        assert d < 1e-5
        return
    torch.manual_seed(7)
    cfg = GPT2Config(vocab_size=97, n_positions=32, n_embd=48, n_layer=2, n_head=4, resid_pdrop=0.0, embd_pdrop=0.0,
                     attn_pdrop=0.0, activation_function="gelu_new", layer_norm_epsilon=1e-5,
                     bos_token_id=96, eos_token_id=96)  # GPT2Config's default 50256 is past vocab_size: refused
    m = GPT2LMHeadModel(cfg).eval()
    with torch.no_grad():  # non-trivial biases and norms
        for n, p in m.named_parameters():
            if n.endswith("bias") or "ln" in n:
                p.add_(0.05 * torch.randn_like(p))
    os.makedirs(OUT, exist_ok=True)
    m.save_pretrained(OUT, safe_serialization=True)
    ids = torch.randint(0, cfg.vocab_size, (2, 12), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        lg = m(ids).logits
    save_file({"ids": ids.to(torch.int32).contiguous(), "logits": lg.contiguous()}, os.path.join(OUT, "reference.safetensors"))
    for f in os.listdir(OUT):
        if f not in ("config.json", "model.safetensors", "reference.safetensors"):
            os.remove(os.path.join(OUT, f))
    print("wrote", OUT, sorted(os.listdir(OUT)))


if __name__ == "__main__":
    main()
