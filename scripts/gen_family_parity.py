#!/usr/bin/env python3
"""Training parity fixtures for every model family against transformers (issue 19 item 3), read by
tests/hf/test_family_parity.c. One fixture per family, the layout of scripts/parity_common.py
(param./grad./final.<name>, tokens, logits, loss, train_tokens, step_losses, step_grad_norms, step_lrs), with
suanli's parameter names, plus the same 10-step run in float64 (f64_step_losses, f64_final.<name>) so the test
can size the final-weight bars by how far PyTorch's own fp32 run moves (as scripts/gen_moe_fixtures.py):

  qwen2_train         Qwen2ForCausalLM, q/k/v biases, tied embeddings
  qwen2_untied_train  the same, untied
  mistral_train       MistralForCausalLM with sliding_window 8 < T = 32 (the full-sequence graph's window)
  mixtral_train       MixtralForCausalLM: softmax router, top-2 renormalised, 4 experts (transformers' fused
                      experts renamed to suanli's block_sparse_moe.experts.<e>.w1/w2/w3)
  baichuan2_train     Baichuan2 (not in transformers): LlamaForCausalLM whose q/k/v are one W_pack parameter
                      and whose lm_head is NormHead (rows L2-normalised in every forward, as Baichuan2 trains)
  gpt2_hf_train       GPT2LMHeadModel (Conv1D weights transposed to suanli's (out, in), tied head)

Each Llama-family fixture has a config directory tests/fixtures/hf/<name>/config.json the test builds the
architecture from (sl_hf_load_config); GPT-2's shape is in the fixture's metadata.
Tiny random models (fixed seeds), fp32, eager attention, no dropout, the AdamW settings of parity_common.

    /tmp/venv/bin/pip install torch transformers safetensors
    /tmp/venv/bin/python scripts/gen_family_parity.py [names...]
"""
import json
import os
import shutil
import sys

import torch
import torch.nn.functional as F
import transformers
from transformers import (GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM, MistralConfig,
                          MistralForCausalLM, MixtralConfig, MixtralForCausalLM, Qwen2Config, Qwen2ForCausalLM)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import parity_common as pc  # noqa: E402

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "hf")
L, NH, NKV, C, I, V, T, B = 2, 4, 2, 64, 96, 128, 32, 4
WINDOW = 8


def common(**kw):
    base = dict(hidden_size=C, intermediate_size=I, num_hidden_layers=L, num_attention_heads=NH,
                num_key_value_heads=NKV, vocab_size=V, max_position_embeddings=T, rms_norm_eps=1e-5,
                rope_theta=10000.0, tie_word_embeddings=False, bos_token_id=None, eos_token_id=None,
                attention_dropout=0.0)
    base.update(kw)
    return base


def identity(n, t):
    return {n: t}


def mixtral_names(n, t):
    """transformers 5's fused experts -> suanli's (the Hub's) block_sparse_moe.experts.<e>.w1/w2/w3"""
    n = n.replace(".mlp.gate.", ".block_sparse_moe.gate.")
    if n.endswith("mlp.experts.gate_up_proj"):
        pre, half = n[: -len("mlp.experts.gate_up_proj")] + "block_sparse_moe.experts.", t.shape[1] // 2
        out = {}
        for e in range(t.shape[0]):
            out[f"{pre}{e}.w1.weight"] = t[e, :half]
            out[f"{pre}{e}.w3.weight"] = t[e, half:]
        return out
    if n.endswith("mlp.experts.down_proj"):
        pre = n[: -len("mlp.experts.down_proj")] + "block_sparse_moe.experts."
        return {f"{pre}{e}.w2.weight": t[e] for e in range(t.shape[0])}
    return {n: t}


def gpt2_names(n, t):
    """GPT2LMHeadModel -> suanli's GPT-2 (src/nn/gpt2.c): no "transformer." prefix, wte/wpe without
    ".weight", Conv1D (in, out) weights transposed to (out, in)"""
    n = n[len("transformer."):] if n.startswith("transformer.") else n
    if n in ("wte.weight", "wpe.weight"):
        n = n[:-len(".weight")]
    if any(s in n for s in ("c_attn.weight", "c_proj.weight", "c_fc.weight")):
        t = t.t()
    return {n: t}


def baichuan_names(n, t):
    return {n + ".weight" if n.endswith("self_attn.W_pack") else n: t}


class NormHead(torch.nn.Module):
    """Baichuan2's head in training mode: logits = x W_n^T, W_n = rows of W divided by their L2 norm"""

    def __init__(self, w):
        super().__init__()
        self.weight = torch.nn.Parameter(w)

    def forward(self, x):
        return F.linear(x, F.normalize(self.weight, dim=-1))


def baichuan_pack(model):
    """q/k/v_proj -> one W_pack parameter per layer (rows q | k | v), lm_head -> NormHead"""
    for layer in model.model.layers:
        a = layer.self_attn
        w = torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight], 0).detach().clone()
        del a.q_proj, a.k_proj, a.v_proj
        a.W_pack = torch.nn.Parameter(w)
        qd = a.config.num_attention_heads * a.head_dim
        kd = a.config.num_key_value_heads * a.head_dim
        a.q_proj = lambda x, a=a: F.linear(x, a.W_pack[:qd])
        a.k_proj = lambda x, a=a: F.linear(x, a.W_pack[qd:qd + kd])
        a.v_proj = lambda x, a=a: F.linear(x, a.W_pack[qd + kd:])
    model.lm_head = NormHead(model.lm_head.weight.detach().clone())
    return model


def eager(cfg):
    cfg._attn_implementation = "eager"
    if hasattr(cfg, "_experts_implementation"):
        cfg._experts_implementation = "eager"  # the per-expert loop (grouped_mm has no float64)
    return cfg


def build(name):
    """(model constructor, parameter renamer, config.json dict or None)"""
    if name in ("qwen2_train", "qwen2_untied_train"):
        cfg = eager(Qwen2Config(**common(tie_word_embeddings=name == "qwen2_train")))
        cfg.architectures = ["Qwen2ForCausalLM"]
        return (lambda: Qwen2ForCausalLM(cfg)), identity, cfg
    if name == "mistral_train":
        cfg = eager(MistralConfig(**common(sliding_window=WINDOW)))
        cfg.architectures = ["MistralForCausalLM"]
        return (lambda: MistralForCausalLM(cfg)), identity, cfg
    if name == "mixtral_train":
        cfg = eager(MixtralConfig(**common(intermediate_size=48, num_local_experts=4, num_experts_per_tok=2,
                                           sliding_window=None, router_jitter_noise=0.0)))
        cfg.architectures = ["MixtralForCausalLM"]
        return (lambda: MixtralForCausalLM(cfg)), mixtral_names, cfg
    if name == "baichuan2_train":
        cfg = eager(LlamaConfig(**common(num_key_value_heads=NH)))
        conf = {"architectures": ["BaichuanForCausalLM"], "model_type": "baichuan", "hidden_size": C,
                "intermediate_size": I, "num_hidden_layers": L, "num_attention_heads": NH, "vocab_size": V,
                "model_max_length": T, "rms_norm_eps": 1e-5, "hidden_act": "silu", "tie_word_embeddings": False,
                "torch_dtype": "float32"}
        return (lambda: baichuan_pack(LlamaForCausalLM(cfg))), baichuan_names, conf
    if name == "gpt2_hf_train":
        cfg = eager(GPT2Config(n_embd=C, n_layer=L, n_head=NH, n_positions=T, vocab_size=V, resid_pdrop=0.0,
                               embd_pdrop=0.0, attn_pdrop=0.0, layer_norm_epsilon=1e-5, bos_token_id=None,
                               eos_token_id=None))
        return (lambda: GPT2LMHeadModel(cfg)), gpt2_names, None
    raise SystemExit(f"unknown family {name}")


FAMILIES = ["qwen2_train", "qwen2_untied_train", "mistral_train", "mixtral_train", "baichuan2_train",
            "gpt2_hf_train"]


def loss_of(model, tk):
    logits = model(tk[:, :-1]).logits
    return logits, F.cross_entropy(logits.reshape(-1, V), tk[:, 1:].reshape(-1))


def renamed(out, rename):
    flat = {}
    for k, v in out.items():
        pre = next((p for p in ("param.", "grad.", "final.") if k.startswith(p)), None)
        if pre:
            flat.update({pre + n: t.float().contiguous() for n, t in rename(k[len(pre):], v).items()})
        else:
            flat[k] = v
    return flat


def family(name, seed):
    torch.manual_seed(seed)
    torch.use_deterministic_algorithms(True)
    make, rename, conf = build(name)
    model = make()
    g0 = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "norm" in n or ".ln_" in n:
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g0))
            else:
                p.copy_(0.1 * torch.randn(p.shape, generator=g0))
    init = {n: p.detach().clone() for n, p in model.named_parameters()}
    out = {}
    g = torch.Generator().manual_seed(seed + 1)
    loss = pc.forward_backward(model, loss_of, g, B, T, V, out)
    train_tokens = pc.learnable_tokens(g, (pc.STEPS, pc.ACCUM, B, T + 1), V)
    losses = pc.train(model, loss_of, train_tokens, out)
    # the same run in float64: how far the fp32 reference itself is from exact
    m64 = make().double()
    with torch.no_grad():
        for n, p in m64.named_parameters():
            p.copy_(init[n].double())
    o64 = {}
    l64 = pc.train(m64, loss_of, train_tokens, o64)
    flat = renamed(out, rename)
    flat["f64_step_losses"] = torch.tensor(l64, dtype=torch.float64).float()
    flat.update({"f64_" + k: v for k, v in renamed({k: v for k, v in o64.items() if k.startswith("final.")},
                                                   rename).items()})
    meta = dict(family=name, n_layer=L, n_head=NH, hidden=C, vocab_size=V, seq_len=T, batch=B, **pc.optim_meta(),
                sliding_window=WINDOW if name == "mistral_train" else 0, transformers=transformers.__version__)
    print(f"{name}: f64 step losses", [round(x, 6) for x in l64])
    pc.save(flat, os.path.join(ROOT, name + ".safetensors"), meta, loss, losses)
    if conf is None:
        return
    d = os.path.join(ROOT, name)
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    if isinstance(conf, dict):
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(conf, f, indent=2)
    else:
        conf.save_pretrained(d)


def main():
    print("torch", torch.__version__, "transformers", transformers.__version__)
    names = sys.argv[1:] or FAMILIES
    for i, name in enumerate(FAMILIES):
        if name in names:
            family(name, 2000 + 10 * i)


if __name__ == "__main__":
    sys.exit(main())
