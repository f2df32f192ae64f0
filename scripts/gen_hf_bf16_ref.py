#!/usr/bin/env python3
"""bf16 inference references (issue 19 item 2) for tests/hf/test_hf_models.c, beside each model of
tests/fixtures/hf/ that gen_hf_fixtures.py wrote: transformers loaded as HF documents a bf16 model,
from_pretrained(dir, dtype=torch.bfloat16) (eager attention; the fp32 weights on disk rounded to bf16 as
suanli's bf16 load does). Writes <model>/ref_bf16.safetensors:
    logits_bf16  F32 (1, T, V) the prompt's logits
    logits_to    F32 (1, T, V) the same from from_pretrained(fp32).to(torch.bfloat16), which also rounds the
                             RoPE inv_freq buffer to bf16 (from_pretrained(dtype=bf16) keeps it fp32): a
                             different model at the positions' angles; suanli follows from_pretrained
                             (ref.safetensors' logits_bf16, from gen_hf_fixtures.py, are .to()'s too)
    greedy_bf16  I32 (NEW,)  greedy continuation of ref.safetensors' prompt, argmax of a full bf16 forward
    top_bf16     F32 (NEW,)  the top logit at each greedy step (its bf16 ulp is the resolution of the margin)
    gap_bf16     F32 (NEW,)  top1 - top2 logit margin at each step
    gap_mean     F32 (1,)    mean |bf16 - fp32| of the prompt's logits (transformers' own bf16-vs-fp32 gap)
    logits_autocast F32 (1, T, V) the fp32 model's prompt logits under torch.autocast("cpu", bfloat16)
    gap_autocast F32 (1,)    mean |autocast - fp32| of them
    gradac.<name>, grad32.<name>  F32  step-0 gradients under autocast and in fp32 of the mean cross-entropy of
                             ids[:, 1:] given ids[:, :-1] (no router losses), for layer 0's q_proj, layer 1's
                             attention projections and post-attention norm, every MoE layer's router, shared
                             expert and shared-expert gate, under suanli's parameter names
DeepSeek-V3's fixture (gen_moe_fixtures.py: transformers' DeepseekV3MoE inside a Llama model, since suanli
has no MLA) has no class that from_pretrained can load (its config has kv_lora_rank None), so it is built the
way that script builds it and loaded the way from_pretrained(dtype=bf16) loads a DeepseekV3 model: every
parameter bf16 except DeepseekV3PreTrainedModel._keep_in_fp32_modules_strict (the router weight and
e_score_correction_bias), RoPE's inv_freq fp32, the experts on grouped_mm (transformers 5's default).
Baichuan2 (not in transformers) is left out. Usage: python3 scripts/gen_hf_bf16_ref.py [model ...]
"""
import json
import os
import re
import sys

import torch
import torch.nn.functional as F
import transformers
from safetensors.torch import load_file, save_file
from transformers import (DeepseekV3Config, LlamaConfig, LlamaForCausalLM, MistralForCausalLM, MixtralForCausalLM,
                          Qwen2ForCausalLM, Qwen2MoeForCausalLM)
from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3MoE, DeepseekV3PreTrainedModel

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "hf")
NEW = 32
MODELS = {"llama": LlamaForCausalLM, "llama31": LlamaForCausalLM, "qwen2": Qwen2ForCausalLM,
          "mistral": MistralForCausalLM, "mixtral": MixtralForCausalLM, "qwen2_moe": Qwen2MoeForCausalLM,
          "deepseek_v3": None}
LLAMA_KEYS = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
              "vocab_size", "max_position_embeddings", "rms_norm_eps", "tie_word_embeddings", "bos_token_id",
              "eos_token_id", "head_dim", "rope_theta")
DS_KEYS = ("moe_intermediate_size", "n_routed_experts", "num_experts_per_tok", "n_shared_experts", "n_group",
           "topk_group", "routed_scaling_factor", "norm_topk_prob")


def fused_experts(sd):
    """the Hub's per-expert tensors -> transformers' fused gate_up_proj / down_proj (gen_moe_fixtures.per_expert
    backwards)"""
    out, groups = {}, {}
    for k, v in sd.items():
        m = re.match(r"(.*mlp\.experts\.)(\d+)\.(gate|up|down)_proj\.weight$", k)
        if m:
            groups.setdefault(m.group(1), {})[(int(m.group(2)), m.group(3))] = v
        else:
            out[k] = v
    for pre, g in groups.items():
        E = 1 + max(e for e, _ in g)
        out[pre + "gate_up_proj"] = torch.stack([torch.cat([g[(e, "gate")], g[(e, "up")]]) for e in range(E)])
        out[pre + "down_proj"] = torch.stack([g[(e, "down")] for e in range(E)])
    return out


def deepseek_v3(d, dtype):
    """gen_moe_fixtures.deepseek_v3_logits' model with the fixture's weights; dtype bf16 follows
    from_pretrained(dtype=bf16) for DeepseekV3 (see the docstring)"""
    conf = json.load(open(os.path.join(d, "config.json")))
    lcfg = LlamaConfig(**{k: conf[k] for k in LLAMA_KEYS})
    lcfg._attn_implementation = "eager"
    m = LlamaForCausalLM(lcfg)
    dcfg = DeepseekV3Config(hidden_size=conf["hidden_size"], intermediate_size=conf["intermediate_size"],
                            hidden_act="silu", first_k_dense_replace=conf["first_k_dense_replace"],
                            **{k: conf[k] for k in DS_KEYS})
    dcfg._experts_implementation = "grouped_mm"
    for l in range(conf["first_k_dense_replace"], conf["num_hidden_layers"]):
        m.model.layers[l].mlp = DeepseekV3MoE(dcfg)
    missing, unexpected = m.load_state_dict(fused_experts(load_file(os.path.join(d, "model.safetensors"))),
                                            strict=False)
    assert not unexpected and all("rotary_emb" in k for k in missing), (missing, unexpected)
    if dtype == torch.bfloat16:
        keep = DeepseekV3PreTrainedModel._keep_in_fp32_modules_strict
        with torch.no_grad():
            for n, p in m.named_parameters():
                if not any(k in n for k in keep):
                    p.data = p.data.to(dtype)
        assert m.model.layers[1].mlp.gate.weight.dtype == torch.float32
        assert m.model.layers[1].mlp.gate.e_score_correction_bias.dtype == torch.float32
    return m.eval()


def load(name, cls, d, dtype):
    if cls is None:
        return deepseek_v3(d, dtype)
    return cls.from_pretrained(d, dtype=dtype, attn_implementation="eager").eval()


def main():
    for name in sys.argv[1:] or MODELS:
        cls = MODELS[name]
        d = os.path.join(ROOT, name)
        ref = load_file(os.path.join(d, "ref.safetensors"))
        m = load(name, cls, d, torch.bfloat16)
        mt = load(name, cls, d, torch.float32).to(torch.bfloat16)
        assert m.model.rotary_emb.inv_freq.dtype == torch.float32 and mt.model.rotary_emb.inv_freq.dtype == torch.bfloat16
        ids = ref["ids"].long()
        with torch.no_grad():
            lg = m(ids).logits.float()
            lt = mt(ids).logits.float()
            m32 = load(name, cls, d, torch.float32)
            with torch.autocast("cpu", dtype=torch.bfloat16):
                la = m32(ids).logits.float()
            same = torch.equal(lt, ref["logits_bf16"]) if "logits_bf16" in ref else None
            seq, out, tops, gaps = ids.clone(), [], [], []
            for _ in range(NEW):
                last = m(seq).logits[0, -1].float()
                top = torch.topk(last, 2).values
                t = int(last.argmax())
                out.append(t)
                tops.append(float(top[0]))
                gaps.append(float(top[0] - top[1]))
                seq = torch.cat([seq, torch.tensor([[t]])], dim=1)
        gap_mean = (lg - ref["logits"]).abs().mean()
        with torch.no_grad():
            d32 = (m32(ids).logits.float() - ref["logits"]).abs().max()
        assert d32 <= 1e-5 * ref["logits"].abs().max(), f"{name}: the fp32 model is not ref.safetensors' ({d32})"
        grads = {}
        want = {"model.layers.0.self_attn.q_proj.weight"} | {
            n for n, _ in m32.named_parameters()
            if n.endswith("mlp.gate.weight") or "shared_expert" in n or "layers.1.self_attn" in n or "layers.1.post" in n}
        for mode in ("ac", "32"):
            m32.zero_grad()
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=mode == "ac"):
                lo = m32(ids[:, :-1]).logits
            F.cross_entropy(lo.float().reshape(-1, lo.shape[-1]), ids[:, 1:].reshape(-1)).backward()
            for n, p in m32.named_parameters():
                if n in want:
                    key = n.replace("mlp.gate.", "block_sparse_moe.gate.") if name == "mixtral" else n
                    grads[f"grad{mode}.{key}"] = p.grad.detach().float().contiguous()
        save_file({"logits_bf16": lg.contiguous(), "logits_to": lt.contiguous(), "greedy_bf16": torch.tensor(out, dtype=torch.int32), "top_bf16": torch.tensor(tops),
                   "gap_bf16": torch.tensor(gaps), "gap_mean": gap_mean.reshape(1).float(),
                   "logits_autocast": la.contiguous(), "gap_autocast": (la - ref["logits"]).abs().mean().reshape(1).float(),
                   **grads},
                  os.path.join(d, "ref_bf16.safetensors"))
        print(f"{name}: ref.safetensors' .to() logits reproduced: {same}; mean |bf16-fp32| {gap_mean:.4g}; "
              f"mean |from_pretrained - .to()| {(lg - lt).abs().mean():.4g}; greedy {out[:8]}...; "
              f"min margin {min(gaps):.3g}; transformers {transformers.__version__}")


if __name__ == "__main__":
    main()
