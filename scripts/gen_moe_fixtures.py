#!/usr/bin/env python3
"""MoE fixtures (issue 17), from transformers:

  tests/fixtures/hf/qwen2_moe/    Qwen2MoeForCausalLM, tiny and random: config.json + model.safetensors in
                                  the Hub's per-expert layout (mlp.experts.<e>.{gate,up,down}_proj.weight,
                                  which transformers 5's save_pretrained also writes, though it keeps the
                                  experts fused as gate_up_proj / down_proj in memory) + ref.safetensors
                                  (ids, logits, greedy, gap) as gen_hf_fixtures.py
  tests/fixtures/hf/deepseek_v3/  DeepSeek-V3's MoE block (transformers' DeepseekV3MoE: sigmoid router with
                                  e_score_correction_bias, n_group / topk_group, routed_scaling_factor, a
                                  shared expert, first_k_dense_replace dense layers) inside a Llama model
                                  (LlamaAttention: suanli has no MLA); config.json says DeepseekV3ForCausalLM
                                  with kv_lora_rank / q_lora_rank null and rope_interleave false
  tests/fixtures/hf/qwen2_moe_train.safetensors
                                  training parity (tests/hf/test_moe_parity.c): the layout of
                                  scripts/parity_common.py (param./grad./final.<name>, step_losses, ...) with
                                  per-expert names, for CE + per-layer Switch load-balancing and z losses
                                  (Megatron's form, Note [Router losses] in src/device/cpu/kernels/moe.c), and
                                  the same run in float64 (f64_step_losses, f64_final.<name>) to size the
                                  tolerances by how far the fp32 reference itself moves.

    python3 -m venv /tmp/venv && /tmp/venv/bin/pip install torch transformers safetensors
    /tmp/venv/bin/python scripts/gen_moe_fixtures.py
"""
import json
import os
import shutil
import sys

import torch
import torch.nn.functional as F
from safetensors.torch import save_file
import transformers
from transformers import (DeepseekV3Config, LlamaConfig, LlamaForCausalLM, Qwen2MoeConfig,
                          Qwen2MoeForCausalLM)
from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3MoE

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gen_hf_fixtures as hf  # noqa: E402
import parity_common as pc  # noqa: E402

ROOT = hf.ROOT


def per_expert(sd):
    """transformers' fused experts -> the Hub's per-expert tensors"""
    out = {}
    for k, v in sd.items():
        if k.endswith("mlp.experts.gate_up_proj"):
            pre, I = k[: -len("gate_up_proj")], v.shape[1] // 2
            for e in range(v.shape[0]):
                out[f"{pre}{e}.gate_proj.weight"] = v[e, :I].contiguous()
                out[f"{pre}{e}.up_proj.weight"] = v[e, I:].contiguous()
        elif k.endswith("mlp.experts.down_proj"):
            pre = k[: -len("down_proj")]
            for e in range(v.shape[0]):
                out[f"{pre}{e}.down_proj.weight"] = v[e].contiguous()
        else:
            out[k] = v.contiguous()
    return out


def qwen2_moe_config(**kw):
    base = hf.common(intermediate_size=128, moe_intermediate_size=32, shared_expert_intermediate_size=48,
                     num_experts=8, num_experts_per_tok=2, norm_topk_prob=False)
    base.update(kw)
    cfg = Qwen2MoeConfig(**base)
    cfg.architectures = ["Qwen2MoeForCausalLM"]
    cfg._attn_implementation = "eager"
    cfg._experts_implementation = "eager"  # the per-expert loop (grouped_mm has no float64)
    return cfg


def save_dir(d, model, conf=None, cfg=None):
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    sd = per_expert({k: v.detach().float() for k, v in model.state_dict().items()})
    save_file(sd, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
    if cfg is not None:
        cfg.save_pretrained(d)
    else:
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(conf, f, indent=2)


def qwen2_moe_logits(seed):
    torch.manual_seed(seed)
    m = Qwen2MoeForCausalLM(qwen2_moe_config())
    hf.randomise(m, seed)
    m.eval()
    d = os.path.join(ROOT, "qwen2_moe")
    save_dir(d, m, cfg=m.config)
    hf.reference(m, d)


DS = dict(moe_intermediate_size=32, n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=1, n_group=4,
          topk_group=2, routed_scaling_factor=2.5, norm_topk_prob=True, first_k_dense_replace=1)


def deepseek_v3_logits(seed, L=3):
    """Llama attention + transformers' DeepseekV3MoE for layers >= first_k_dense_replace"""
    torch.manual_seed(seed)
    lcfg = LlamaConfig(**hf.common(num_hidden_layers=L))
    lcfg._attn_implementation = "eager"
    m = LlamaForCausalLM(lcfg)
    dcfg = DeepseekV3Config(hidden_size=64, intermediate_size=128, hidden_act="silu", **DS)
    dcfg._experts_implementation = "eager"
    for l in range(DS["first_k_dense_replace"], L):
        m.model.layers[l].mlp = DeepseekV3MoE(dcfg)
    hf.randomise(m, seed)
    g = torch.Generator().manual_seed(seed + 100)
    with torch.no_grad():  # a non-zero selection bias (a buffer, not a parameter)
        for l in range(DS["first_k_dense_replace"], L):
            b = m.model.layers[l].mlp.gate.e_score_correction_bias
            b.copy_(0.1 * torch.randn(b.shape, generator=g))
    m.eval()
    conf = dict(hf.common(num_hidden_layers=L), architectures=["DeepseekV3ForCausalLM"], model_type="deepseek_v3",
                head_dim=16, hidden_act="silu", rope_theta=10000.0, scoring_func="sigmoid", topk_method="noaux_tc",
                kv_lora_rank=None, q_lora_rank=None, rope_interleave=False, torch_dtype="float32", **DS)
    d = os.path.join(ROOT, "deepseek_v3")
    save_dir(d, m, conf=conf)
    hf.reference(m, d)


# ---------------- training parity ----------------
PL, PC, PV, PT, PB = 2, 64, 128, 32, 4
AUX, ZC = 0.01, 0.001


def parity_loss(model, tk):
    out = model(tk[:, :-1], output_router_logits=True)
    logits = out.logits
    loss = F.cross_entropy(logits.reshape(-1, PV), tk[:, 1:].reshape(-1))
    cfg = model.config
    E, k = cfg.num_experts, cfg.num_experts_per_tok
    for rl in out.router_logits:  # one (N, E) per layer: Megatron's per-layer losses, summed
        N = rl.shape[0]
        p = torch.softmax(rl, dim=-1)
        idx = torch.topk(p, k, dim=-1).indices
        cnt = torch.zeros(E, dtype=rl.dtype).scatter_add_(0, idx.reshape(-1), torch.ones(N * k, dtype=rl.dtype))
        aux = E / (N * N * k) * (cnt.detach() * p.sum(0)).sum()
        z = (torch.logsumexp(rl, dim=-1) ** 2).mean()
        loss = loss + AUX * aux + ZC * z
    return logits, loss


def parity():
    torch.manual_seed(1234)
    torch.use_deterministic_algorithms(True)
    cfg = qwen2_moe_config(hidden_size=PC, num_hidden_layers=PL, vocab_size=PV, max_position_embeddings=PT,
                           num_experts=4, norm_topk_prob=True, bos_token_id=None, eos_token_id=None)
    model = Qwen2MoeForCausalLM(cfg)
    with torch.no_grad():
        for n, p in model.named_parameters():
            p.copy_(1.0 + 0.1 * torch.randn(p.shape) if "norm" in n else 0.1 * torch.randn(p.shape))
    init = {n: p.detach().clone() for n, p in model.named_parameters()}
    out = {}
    g = torch.Generator().manual_seed(99)
    loss = pc.forward_backward(model, parity_loss, g, PB, PT, PV, out)
    train_tokens = pc.learnable_tokens(g, (pc.STEPS, pc.ACCUM, PB, PT + 1), PV)
    losses = pc.train(model, parity_loss, train_tokens, out)
    # the same run in float64: how far the fp32 reference itself is from exact
    m64 = Qwen2MoeForCausalLM(cfg).double()
    with torch.no_grad():
        for n, p in m64.named_parameters():
            p.copy_(init[n].double())
    o64 = {}
    l64 = pc.train(m64, parity_loss, train_tokens, o64)
    flat = {}
    for k, v in out.items():
        pre = next((p for p in ("param.", "grad.", "final.") if k.startswith(p)), None)
        if pre:
            flat.update({pre + n: t for n, t in per_expert({k[len(pre):]: v}).items()})
        else:
            flat[k] = v
    flat["f64_step_losses"] = torch.tensor(l64, dtype=torch.float64).float()
    for k, v in o64.items():
        if k.startswith("final."):
            flat.update({"f64_final." + n: t.float() for n, t in per_expert({k[6:]: v}).items()})
    meta = dict(n_layer=PL, hidden=PC, vocab_size=PV, seq_len=PT, batch=PB, **pc.optim_meta(), aux_coeff=AUX,
                z_coeff=ZC)
    print("f64 step losses", [round(x, 6) for x in l64])
    pc.save(flat, os.path.join(ROOT, "qwen2_moe_train.safetensors"), meta, loss, losses)
    # the model directory the parity test builds its architecture from (weights: the fixture's param.*)
    d = os.path.join(ROOT, "qwen2_moe_train")
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    cfg.save_pretrained(d)


def ds_parity_loss(model, tk):
    logits = model(tk[:, :-1]).logits
    return logits, F.cross_entropy(logits.reshape(-1, PV), tk[:, 1:].reshape(-1))


def ds_model(L, dtype):
    lcfg = LlamaConfig(**hf.common(hidden_size=PC, num_hidden_layers=L, vocab_size=PV, max_position_embeddings=PT,
                                   bos_token_id=None, eos_token_id=None))
    lcfg._attn_implementation = "eager"
    m = LlamaForCausalLM(lcfg)
    dcfg = DeepseekV3Config(hidden_size=PC, intermediate_size=128, hidden_act="silu", **DS)
    dcfg._experts_implementation = "eager"
    for l in range(DS["first_k_dense_replace"], L):
        m.model.layers[l].mlp = DeepseekV3MoE(dcfg)
    return m.to(dtype), lcfg


def ds_parity(L=3):
    """DeepSeek-V3-style training parity: CE only (its balancing is the bias, not a loss); the bias is a
    buffer (no gradient), saved as param./grad. (zero)/final. so the C test finds every parameter."""
    torch.manual_seed(4321)
    torch.use_deterministic_algorithms(True)
    model, lcfg = ds_model(L, torch.float32)
    g0 = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for n, p in model.named_parameters():
            p.copy_(1.0 + 0.1 * torch.randn(p.shape) if "norm" in n else 0.1 * torch.randn(p.shape))
        for l in range(DS["first_k_dense_replace"], L):
            b = model.model.layers[l].mlp.gate.e_score_correction_bias
            b.copy_(0.05 * torch.randn(b.shape, generator=g0))
    init = {n: p.detach().clone() for n, p in model.named_parameters()}
    bufs = {n: b.detach().clone() for n, b in model.named_buffers() if "e_score_correction_bias" in n}
    out = {}
    g = torch.Generator().manual_seed(98)
    loss = pc.forward_backward(model, ds_parity_loss, g, PB, PT, PV, out)
    train_tokens = pc.learnable_tokens(g, (pc.STEPS, pc.ACCUM, PB, PT + 1), PV)
    losses = pc.train(model, ds_parity_loss, train_tokens, out)
    m64, _ = ds_model(L, torch.float64)
    with torch.no_grad():
        for n, p in m64.named_parameters():
            p.copy_(init[n].double())
        for n, b in m64.named_buffers():
            if n in bufs:
                b.copy_(bufs[n].double())
    o64 = {}
    l64 = pc.train(m64, ds_parity_loss, train_tokens, o64)
    flat = {}
    for k, v in out.items():
        pre = next((p for p in ("param.", "grad.", "final.") if k.startswith(p)), None)
        if pre:
            flat.update({pre + n: t for n, t in per_expert({k[len(pre):]: v}).items()})
        else:
            flat[k] = v
    for n, b in bufs.items():
        flat["param." + n], flat["grad." + n], flat["final." + n] = b, torch.zeros_like(b), b.clone()
        o64["final." + n] = b.double()
    flat["f64_step_losses"] = torch.tensor(l64, dtype=torch.float64).float()
    for k, v in o64.items():
        if k.startswith("final."):
            flat.update({"f64_final." + n: t.float() for n, t in per_expert({k[6:]: v}).items()})
    meta = dict(n_layer=L, hidden=PC, vocab_size=PV, seq_len=PT, batch=PB, **pc.optim_meta(), aux_coeff=0, z_coeff=0)
    print("deepseek f64 step losses", [round(x, 6) for x in l64])
    pc.save(flat, os.path.join(ROOT, "deepseek_v3_train.safetensors"), meta, loss, losses)
    conf = dict(hf.common(hidden_size=PC, num_hidden_layers=L, vocab_size=PV, max_position_embeddings=PT,
                          bos_token_id=None, eos_token_id=None),
                architectures=["DeepseekV3ForCausalLM"], model_type="deepseek_v3", head_dim=PC // 4,
                hidden_act="silu", rope_theta=lcfg.rope_parameters["rope_theta"] if getattr(lcfg, "rope_parameters", None)
                else 10000.0, scoring_func="sigmoid", kv_lora_rank=None, q_lora_rank=None, rope_interleave=False,
                torch_dtype="float32", **DS)
    d = os.path.join(ROOT, "deepseek_v3_train")
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(conf, f, indent=2)


def main():
    print("torch", torch.__version__, "transformers", transformers.__version__)
    qwen2_moe_logits(11)
    deepseek_v3_logits(12)
    parity()
    ds_parity()


if __name__ == "__main__":
    sys.exit(main())
