#!/usr/bin/env bash
# Issue 7: a 7B Llama loads and generates on this 24 GiB machine in bf16. Writes a random-weight model with
# Llama-2-7B's shapes (hidden 4096, 32 layers, 32 heads, MLP 11008, vocab 32000; 13.5 GB of bf16 in 7 shards
# + index) to a scratch dir, then runs `suanli generate --dtype bf16` on it under /usr/bin/time and reports
# peak RSS and tokens/s. Needs ~14 GB of disk, torch + safetensors (pip). Usage: bench/llama7b_bf16.sh [DIR]
# Decode against the memory bandwidth without files: `suanli bench generate --size 7b|1b|small --json`
# (bench/bench_generate.c; 1b when memory is short).
set -euo pipefail
[ $# -le 1 ] || { echo "usage: $0 [DIR]" >&2; exit 2; }
dir=$(realpath -m -- "${1:-/tmp/suanli-llama7b}")  # before the cd: DIR may be relative to the caller's cwd
cd "$(dirname "$0")/.."
[ -x build/suanli ] || { echo "llama7b_bf16.sh: build/suanli: no such executable (build first)" >&2; exit 2; }
if [ ! -f "$dir/model.safetensors.index.json" ]; then
python3 - "$dir" <<'PY'
import json, os, sys
import torch
from safetensors.torch import save_file
d = sys.argv[1]; os.makedirs(d, exist_ok=True)
H, L, NH, I, V = 4096, 32, 32, 11008, 32000
cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": H, "intermediate_size": I,
       "num_hidden_layers": L, "num_attention_heads": NH, "num_key_value_heads": NH, "vocab_size": V,
       "max_position_embeddings": 4096, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "hidden_act": "silu",
       "tie_word_embeddings": False, "torch_dtype": "bfloat16", "bos_token_id": 1, "eos_token_id": 2}
json.dump(cfg, open(os.path.join(d, "config.json"), "w"), indent=1)
g = torch.Generator().manual_seed(0)
def w(*shape): return (torch.randn(*shape, generator=g) * 0.02).to(torch.bfloat16)
groups = [["model.embed_tokens.weight"]] + [[f"model.layers.{l}" for l in range(s, min(s + 5, L))] for s in range(0, L, 5)] + [["model.norm.weight", "lm_head.weight"]]
wm, n = {}, len(groups)
for k, grp in enumerate(groups):
    t = {}
    for name in grp:
        if name == "model.embed_tokens.weight": t[name] = w(V, H)
        elif name == "lm_head.weight": t[name] = w(V, H)
        elif name == "model.norm.weight": t[name] = torch.ones(H, dtype=torch.bfloat16)
        else:
            for p, shape in [("self_attn.q_proj", (H, H)), ("self_attn.k_proj", (H, H)), ("self_attn.v_proj", (H, H)),
                             ("self_attn.o_proj", (H, H)), ("mlp.gate_proj", (I, H)), ("mlp.up_proj", (I, H)),
                             ("mlp.down_proj", (H, I))]:
                t[f"{name}.{p}.weight"] = w(*shape)
            t[f"{name}.input_layernorm.weight"] = torch.ones(H, dtype=torch.bfloat16)
            t[f"{name}.post_attention_layernorm.weight"] = torch.ones(H, dtype=torch.bfloat16)
    f = f"model-{k + 1:05d}-of-{n:05d}.safetensors"
    save_file(t, os.path.join(d, f), metadata={"format": "pt"})
    for key in t: wm[key] = f
    print("wrote", f, flush=True)
# the index last and whole (written aside, then renamed): the script's check for a finished model
json.dump({"metadata": {}, "weight_map": wm}, open(os.path.join(d, "index.tmp"), "w"))
os.replace(os.path.join(d, "index.tmp"), os.path.join(d, "model.safetensors.index.json"))
PY
fi
du -sh "$dir"
log=$(mktemp /tmp/suanli-llama7b-log-XXXXXX)
trap 'rm -f "$log"' EXIT
rc=0
/usr/bin/time -v ./build/suanli generate --model "$dir" --dtype bf16 --prompt-ids 1,450,4996,17354 --max-new-tokens 3 \
  --temperature 0 --threads 2 >"$log" 2>&1 || rc=$?
grep -E "tokens/s|Maximum resident|Elapsed|error|suanli" "$log" || true
[ $rc = 0 ] || { echo "llama7b_bf16.sh: suanli generate failed (exit $rc)" >&2; exit 1; }
