#!/usr/bin/env python3
"""Reference fixtures for issue 7 (HF formats, Llama family), from transformers.

    pip install torch transformers tokenizers safetensors
    python3 scripts/gen_hf_fixtures.py            # writes tests/fixtures/hf/

For each architecture: a tiny random model (fixed seed, every parameter randomised, norms around 1,
biases non-zero) saved with save_pretrained (one sharded with an index, some in bf16/fp16 on disk),
and ref.safetensors with
    ids     I32 (1, T)     prompt
    logits  F32 (1, T, V)  transformers fp32 forward (eager attention) of the weights as stored on disk
    greedy  I32 (32,)      greedy continuation: argmax of a full transformers forward at every step
    gap     F32 (32,)      top1 - top2 logit margin at each greedy step (ties would make the test moot)
    logits_bf16 F32        forward of model.to(torch.bfloat16) (transformers bf16 compute)
Baichuan2 is not in transformers: its fixture is a Llama whose q/k/v are stored fused as W_pack and
whose lm_head is stored raw; the reference is the Llama with lm_head = F.normalize(raw) (NormHead).
"""
import json
import os
import shutil
import sys

import torch
import torch.nn.functional as F
from safetensors.torch import save_file, load_file
import transformers
from transformers import (GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM, MistralConfig,
                          MistralForCausalLM, MixtralConfig, MixtralForCausalLM)

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "hf")
V, T, NEW = 320, 12, 32


def randomise(model, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or ".ln_" in name:
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(0.15 * torch.randn(p.shape, generator=g))


def greedy(model, ids):
    seq = ids.clone()
    out, gaps = [], []
    with torch.no_grad():
        for _ in range(NEW):
            lg = model(seq).logits[0, -1].float()
            top = torch.topk(lg, 2).values
            t = int(lg.argmax())
            out.append(t)
            gaps.append(float(top[0] - top[1]))
            seq = torch.cat([seq, torch.tensor([[t]])], dim=1)
    return torch.tensor(out, dtype=torch.int32), torch.tensor(gaps, dtype=torch.float32)


def reference(model, d, extra=None):
    g = torch.Generator().manual_seed(1234)
    ids = torch.randint(0, V, (1, T), generator=g)
    with torch.no_grad():
        logits = model(ids).logits.float()
    gr, gaps = greedy(model, ids)
    ref = {"ids": ids.to(torch.int32), "logits": logits.contiguous(), "greedy": gr, "gap": gaps}
    if extra:
        ref.update(extra(model, ids))
    save_file(ref, os.path.join(d, "ref.safetensors"))
    print(f"{os.path.basename(d)}: max|logit| {logits.abs().max():.3f}, min greedy gap {gaps.min():.2e}")


def reload_fp32(cls, d):
    m = cls.from_pretrained(d, dtype=torch.float32, attn_implementation="eager")
    m.eval()
    return m


def make(name, cls, cfg, seed, dtype=torch.float32, shard=None, extra=None):
    extra = extra or bf16_logits
    d = os.path.join(ROOT, name)
    shutil.rmtree(d, ignore_errors=True)
    torch.manual_seed(seed)
    cfg._attn_implementation = "eager"
    m = cls(cfg)
    randomise(m, seed)
    m = m.to(dtype)
    kw = {"max_shard_size": shard} if shard else {}
    m.save_pretrained(d, **kw)
    m = reload_fp32(cls, d)  # the reference sees exactly the weights on disk
    reference(m, d, extra)


def bf16_logits(model, ids):
    mb = model.to(torch.bfloat16)
    with torch.no_grad():
        lg = mb(ids).logits.float()
    model.to(torch.float32)
    return {"logits_bf16": lg.contiguous()}


def common(**kw):
    base = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, vocab_size=V, max_position_embeddings=128, rms_norm_eps=1e-5,
                tie_word_embeddings=False, bos_token_id=1, eos_token_id=2)
    base.update(kw)
    return base


def baichuan(seed):
    d = os.path.join(ROOT, "baichuan")
    shutil.rmtree(d, ignore_errors=True)
    cfg = LlamaConfig(**common(num_key_value_heads=4))
    cfg._attn_implementation = "eager"
    torch.manual_seed(seed)
    m = LlamaForCausalLM(cfg)
    randomise(m, seed)
    m.eval()
    sd = {k: v.clone().contiguous() for k, v in m.state_dict().items()}
    out = {}
    for k, v in sd.items():
        if ".self_attn.q_proj." in k:
            pre = k.split(".self_attn.")[0]
            out[pre + ".self_attn.W_pack.weight"] = torch.cat(
                [sd[pre + ".self_attn.q_proj.weight"], sd[pre + ".self_attn.k_proj.weight"],
                 sd[pre + ".self_attn.v_proj.weight"]], 0).contiguous()
        elif ".self_attn.k_proj." in k or ".self_attn.v_proj." in k:
            continue
        else:
            out[k] = v
    os.makedirs(d)
    save_file(out, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
    conf = {"architectures": ["BaichuanForCausalLM"], "model_type": "baichuan", "hidden_size": 64,
            "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": V,
            "model_max_length": 128, "rms_norm_eps": 1e-5, "hidden_act": "silu", "tie_word_embeddings": False,
            "bos_token_id": 1, "eos_token_id": 2, "torch_dtype": "float32"}
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(conf, f, indent=2)
    with torch.no_grad():  # NormHead
        m.lm_head.weight.copy_(F.normalize(m.lm_head.weight, dim=-1))
    reference(m, d, bf16_logits)


CORPUS = [
    "The quick brown fox jumps over the lazy dog. It's a test; they'll see what we've done, isn't it?",
    "Large language models are trained on text. Training needs compute, data and patience!",
    "def train(model, data):\n    for step, batch in enumerate(data):\n        loss = model(batch)\n        loss.backward()\n",
    "int main(void) { printf(\"hello, world\\n\"); return 0; }",
    "机器学习是人工智能的一个分支。大型语言模型需要大量的计算资源和数据。我们在中文文本上训练。",
    "自然语言处理 中文分词 测试 你好世界 你好，世界！",
    "Emoji: 😀😃😄 🚀🔥 👍🏽 — numbers 1234567890 3.14159 2024-11-30",
    "Ünïcödé façade naïve café résumé, Straße, Ελληνικά, русский язык, العربية, 日本語のテキスト。",
    "    indented    with    spaces\t\ttabs\n\n\nnewlines   ",
] * 3

TEXT = ("Hello world! It's 2024, and we're testing the TOKENIZER's edge-cases: don't, I'LL, we've.\n"
        "中文测试：大型语言模型（LLM）在机器学习中很重要。你好，世界！\n"
        "def f(x):\n\treturn x**2  # square\n    if x >= 10: print(\"big\")\n"
        "Emoji 🚀🔥👍🏽😀 and café vs cafe\u0301 (combining), ß, Ελληνικά, русский.\n"
        "Whitespace runs:      five spaces,\t\ttabs,\n\n\n\nnewlines, trailing   \n"
        "Numbers 1234567 3.14159 and <|im_start|>special<|im_end|> tokens.   ")

LLAMA3_RE = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
             r"\s*[\r\n]+|\s+(?!\S)|\s+")


def train_tokenizer(style, vocab_size):
    from tokenizers import Tokenizer, Regex, decoders, models, normalizers, pre_tokenizers, processors, trainers
    specials = ["<|endoftext|>"] if style == "gpt2" else ["<|begin_of_text|>", "<|end_of_text|>", "<|im_start|>", "<|im_end|>"]
    tok = Tokenizer(models.BPE(ignore_merges=(style != "gpt2")))
    if style == "gpt2":
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    else:
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(LLAMA3_RE), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    if style == "qwen2":
        tok.normalizer = normalizers.NFC()
    tok.decoder = decoders.ByteLevel()
    tr = trainers.BpeTrainer(vocab_size=vocab_size, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                             special_tokens=specials, show_progress=False)
    tok.train_from_iterator(CORPUS, tr)
    if style == "llama3":
        bos = tok.token_to_id("<|begin_of_text|>")
        tok.post_processor = processors.Sequence([
            processors.ByteLevel(trim_offsets=False),
            processors.TemplateProcessing(single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A <|begin_of_text|> $B",
                                          special_tokens=[("<|begin_of_text|>", bos)])])
    return tok


def tokenizer_fixtures():
    import tokenizers
    for style in ["gpt2", "llama3", "qwen2"]:
        d = os.path.join(ROOT, "tok_" + style)
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d)
        tok = train_tokenizer(style, 700)
        tok.save(os.path.join(d, "tokenizer.json"))
        tok = tokenizers.Tokenizer.from_file(os.path.join(d, "tokenizer.json"))  # what users load
        ids = tok.encode(TEXT, add_special_tokens=False).ids
        ids_sp = tok.encode(TEXT, add_special_tokens=True).ids
        with open(os.path.join(d, "expected.json"), "w") as f:
            json.dump({"tokenizers": tokenizers.__version__, "text": TEXT, "ids": ids, "ids_special": ids_sp,
                       "decoded": tok.decode(ids, skip_special_tokens=False)}, f, ensure_ascii=False, indent=0)
        print(f"tok_{style}: {len(ids)} ids for {len(TEXT.encode())} bytes")


def model_tokenizer(name, prompt):
    """A small llama3-style tokenizer in the model's directory + the prompt's ids and greedy continuation."""
    d = os.path.join(ROOT, name)
    tok = train_tokenizer("llama3", V)
    tok.save(os.path.join(d, "tokenizer.json"))
    m = reload_fp32(LlamaForCausalLM, d)
    ids = torch.tensor([tok.encode(prompt, add_special_tokens=True).ids])
    gr, gaps = greedy(m, ids)
    text = tok.decode(gr.tolist())
    with open(os.path.join(d, "prompt.json"), "w") as f:
        json.dump({"prompt": prompt, "ids": ids[0].tolist(), "greedy": gr.tolist(), "text": text,
                   "min_gap": float(gaps.min())}, f, ensure_ascii=False)


def main():
    print("torch", torch.__version__, "transformers", transformers.__version__)
    os.makedirs(ROOT, exist_ok=True)
    make("llama", LlamaForCausalLM, LlamaConfig(**common()), 1, shard="150KB", extra=bf16_logits)
    make("llama31", LlamaForCausalLM, LlamaConfig(**common(rope_scaling={
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 32}, rope_theta=10000.0)), 7, dtype=torch.bfloat16)
    make("qwen2", Qwen2ForCausalLM, Qwen2Config(**common(tie_word_embeddings=True)), 2, dtype=torch.bfloat16)
    make("mistral", MistralForCausalLM, MistralConfig(**common(sliding_window=8)), 3, dtype=torch.float16)
    make("mixtral", MixtralForCausalLM,
         MixtralConfig(**common(intermediate_size=48, num_local_experts=4, num_experts_per_tok=2,
                                sliding_window=None)), 4, dtype=torch.bfloat16)
    baichuan(5)
    make("gpt2", GPT2LMHeadModel, GPT2Config(n_embd=64, n_layer=2, n_head=4, n_positions=64, vocab_size=V,
                                             bos_token_id=1, eos_token_id=2), 6)
    model_tokenizer("llama", "Hello world, 你好")
    tokenizer_fixtures()


if __name__ == "__main__":
    sys.exit(main())
