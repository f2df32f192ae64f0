#!/usr/bin/env python3
"""bf16 mixed-precision fixtures (issue 19 item 2) for tests/e2e/test_bf16_train.c: the tiny GPT-2 and tiny
Llama of gen_fp16_parity.py (same shapes, eager attention), each run from the same weights on the same data:
  bf16: torch.autocast("cpu", dtype=torch.bfloat16) over fp32 master weights and AdamW (no loss scaling:
        bf16 has fp32's exponent range);
  fp32: the same loop without autocast.
Saved per model (bf16_gpt2.safetensors, bf16_llama.safetensors):
  param.<name>            initial weights (f32)
  tokens                  int32 (B, T+1); loss0_fp32/loss0_bf16 (1,), logits0_fp32/logits0_bf16 (B, T, V; the
                          bf16 logits widened to f32) of the step-0 forward
  train_tokens            int32 (STEPS, ACCUM, B, T+1)
  batch_loss0_fp32/_bf16  (STEPS,) the initial weights' losses on train_tokens[i, 0], forward only
  grad0_bf16.<name>       autocast's gradients of the initial weights for the loss on train_tokens[0, 0];
  grad0_gap.<name>        (1,) sum |fp32 gradient - grad0_bf16| over the tensor
  bf16_losses, fp32_losses (STEPS,) per-step training losses (mean over the ACCUM micro-batches)
--floor measures (and prints; writes nothing) how far from autocast an implementation lands that rounds where
autocast rounds but sums in another fp32 order: GPT-2 with fp32 kernels and explicit bf16 rounding points
(EmuGPT: suanli's rounding model in PyTorch), and autocast's own run with its master weights moved by one
fp32 ulp after the first step (both models). See the header of tests/e2e/test_bf16_train.c.
Requires torch, transformers, safetensors.
The bf16 GEMM's order of summation depends on oneDNN's kernel, so the fixtures are made twice: on a host
whose oneDNN runs bf16 matmuls with vdpbf16ps (AVX512_BF16, Zen 4: bf16_<model>.safetensors) and on an AMX
host (`--suffix _amx`: bf16_<model>_amx.safetensors, made on an Intel Xeon whose oneDNN reported
brg_matmul:avx10_1_512_amx). The test compares each suanli kernel with the fixture of the same kind.
Usage: python3 scripts/gen_bf16_parity.py [--outdir tests/fixtures/bf16] [--only gpt2|llama] [--floor]
       [--suffix _amx]
"""
import argparse
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gen_fp16_parity as g16  # noqa: E402
import parity_common as pc  # noqa: E402

STEPS, ACCUM, WARMUP = 100, 2, 5
BF = torch.bfloat16


def loss_of(model, tk, bf16):
    with torch.autocast("cpu", dtype=BF, enabled=bf16):
        logits = g16.logits_of(model, tk[:, :-1])
        # cross-entropy is on autocast's fp32 list: the bf16 logits are widened
        return logits, F.cross_entropy(logits.reshape(-1, g16.V), tk[:, 1:].reshape(-1))


class R(torch.autograd.Function):
    """a bf16 rounding point: the value and, in backward, the gradient rounded to bf16 (autocast's half
    tensors have half gradients)"""

    @staticmethod
    def forward(ctx, x):
        return x.to(BF).float()

    @staticmethod
    def backward(ctx, g):
        return g.to(BF).float()


class SoftmaxR(torch.autograd.Function):
    """softmax of a bf16 tensor: fp32 inside, bf16 output; backward from the rounded output, gradient
    rounded in and out"""

    @staticmethod
    def forward(ctx, x):
        y = x.softmax(dim=-1).to(BF).float()
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, g):
        (y,) = ctx.saved_tensors
        g = g.to(BF).float()
        return (y * (g - (g * y).sum(-1, keepdim=True))).to(BF).float()


def emu_lin(x, lin):
    b = R.apply(lin.bias) if lin.bias is not None else None
    return R.apply(F.linear(R.apply(x), R.apply(lin.weight), b))


class EmuGPT(g16.GPT):
    """GPT with autocast-bf16's rounding points made explicit around fp32 kernels (MKL's fp32 GEMMs, not
    oneDNN's bf16 ones): suanli's rounding model (Note [Half autocast] in src/nn/gpt2.c, Note [Eager half
    attention numerics] iparams[2] = 1) with another fp32 summation order"""

    def forward(self, idx):
        t = idx.shape[1]
        x = self.wte[idx] + self.wpe[:t]
        mask = ~torch.tril(torch.ones(t, t, dtype=torch.bool))
        hs = g16.C // g16.NH
        for blk in self.h:
            q, k, v = emu_lin(blk.ln_1(x), blk.attn.c_attn).split(g16.C, dim=2)
            q, k, v = (z.view(z.shape[0], t, g16.NH, hs).transpose(1, 2) for z in (q, k, v))
            att = R.apply(R.apply(q @ k.transpose(-2, -1)) * hs**-0.5).masked_fill(mask, float("-inf"))
            y = R.apply(SoftmaxR.apply(att) @ v).transpose(1, 2).reshape(x.shape)
            x = x + emu_lin(y, blk.attn.c_proj)
            x = x + emu_lin(F.gelu(emu_lin(blk.ln_2(x), blk.mlp.c_fc), approximate="tanh"), blk.mlp.c_proj)
        return R.apply(R.apply(self.ln_f(x)) @ R.apply(self.wte).t())


def run(make, init, tokens, bf16, perturb=False):
    """perturb: after the first optimizer step, move every master weight by one fp32 ulp (random sign): an
    fp32-level difference such as another summation order makes, fed into bf16 training"""
    model = make()
    with torch.no_grad():
        for n, p in model.named_parameters():
            p.copy_(init["param." + n])
    opt = pc.adamw(model)
    losses = []
    for it in range(STEPS):
        for grp in opt.param_groups:
            grp["lr"] = pc.lr_at(it, STEPS, WARMUP)
        opt.zero_grad(set_to_none=True)
        tot = 0.0
        for micro in range(ACCUM):
            _, l = loss_of(model, tokens[it, micro], bf16)
            (l / ACCUM).backward()
            tot += l.item()
        torch.nn.utils.clip_grad_norm_(model.parameters(), pc.CLIP)
        opt.step()
        if perturb and it == 0:
            gp = torch.Generator().manual_seed(7)
            with torch.no_grad():
                for p in model.parameters():
                    up = torch.rand(p.shape, generator=gp) < 0.5
                    p.copy_(torch.where(up, torch.nextafter(p, p + 1), torch.nextafter(p, p - 1)))
        losses.append(tot / ACCUM)
    return torch.tensor(losses, dtype=torch.float32)


def fixture(name, make, path):
    torch.manual_seed(1234)
    model = make()
    out = {"param." + n: p.detach().clone() for n, p in model.named_parameters()}
    g = torch.Generator().manual_seed(99)
    tokens = torch.randint(0, g16.V, (g16.B, g16.T + 1), generator=g)
    with torch.no_grad():
        for bf16, tag in ((False, "fp32"), (True, "bf16")):
            logits, l = loss_of(model, tokens, bf16)
            out["logits0_" + tag] = logits.float().clone()
            out["loss0_" + tag] = l.float().reshape(1).clone()
    out["tokens"] = tokens.to(torch.int32)
    train_tokens = pc.learnable_tokens(g, (STEPS, ACCUM, g16.B, g16.T + 1), g16.V)
    out["train_tokens"] = train_tokens.to(torch.int32)
    with torch.no_grad():
        for bf16, tag in ((False, "fp32"), (True, "bf16")):
            out["batch_loss0_" + tag] = torch.tensor([loss_of(model, train_tokens[i, 0], bf16)[1].item()
                                                      for i in range(STEPS)], dtype=torch.float32)
    grads = {}
    for bf16, tag in ((False, "fp32"), (True, "bf16")):  # step-0 gradients of train_tokens[0, 0]
        model.zero_grad(set_to_none=True)
        loss_of(model, train_tokens[0, 0], bf16)[1].backward()
        grads[tag] = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
    for n, gb in grads["bf16"].items():  # the fp32 gradients only as their distance (keeps the file small)
        out["grad0_bf16." + n] = gb
        out["grad0_gap." + n] = (grads["fp32"][n].double() - gb.double()).abs().sum().float().reshape(1)
    lb = run(make, out, train_tokens, True)
    l32 = run(make, out, train_tokens, False)
    out.update(bf16_losses=lb, fp32_losses=l32)
    meta = dict(n_layer=g16.L, n_head=g16.NH, n_kv_head=g16.NKV, n_embd=g16.C, intermediate=g16.I,
                vocab_size=g16.V, seq_len=g16.T, batch=g16.B, **pc.optim_meta())
    meta.update(steps=STEPS, accum=ACCUM, warmup=WARMUP)
    d0 = abs(out["loss0_bf16"].item() - out["loss0_fp32"].item())
    dg = (out["logits0_bf16"] - out["logits0_fp32"]).abs().mean().item()
    db = (out["batch_loss0_bf16"] - out["batch_loss0_fp32"]).abs().mean().item()
    print(f"{name}: step-0 loss fp32 {out['loss0_fp32'].item():.6f} bf16 {out['loss0_bf16'].item():.6f} "
          f"(|d| {d0:.3g}); logits mean |d| {dg:.3g}; batch losses mean |d| {db:.3g}; "
          f"100-step mean |fp32-bf16| loss {(l32 - lb).abs().mean().item():.4g}")
    pc.save(out, path, meta, lb[0].item(), lb.tolist()[::10])


def floor(name, make, path):
    """how far from autocast an implementation lands that rounds at autocast's points but sums in another
    fp32 order: the PyTorch emulation (GPT-2) and a 1-ulp perturbation of autocast's own run (both)"""
    from safetensors.torch import load_file

    fx = load_file(path)
    tt = fx["train_tokens"].long()
    lb, l32 = fx["bf16_losses"], fx["fp32_losses"]
    bar = (l32 - lb).abs().mean().item()
    runs = [("autocast, master weights moved 1 fp32 ulp after step 0", make, True)]
    if name == "gpt2":
        runs.append(("fp32 kernels + explicit bf16 rounding points (suanli's model)", EmuGPT, False))
    for what, mk, pert in runs:
        if mk is EmuGPT:
            m = mk()
            with torch.no_grad():
                for n, p in m.named_parameters():
                    p.copy_(fx["param." + n])
                lg = g16.logits_of(m, fx["tokens"].long()[:, :-1]).float()
                bl = torch.tensor([F.cross_entropy(g16.logits_of(m, tt[i, 0][:, :-1]).reshape(-1, g16.V),
                                                   tt[i, 0][:, 1:].reshape(-1)).item() for i in range(STEPS)])
            ac, f32 = fx["logits0_bf16"], fx["logits0_fp32"]
            d = (lg - ac).abs().mean().item() / (f32 - ac).abs().mean().item()
            bb, b32 = fx["batch_loss0_bf16"], fx["batch_loss0_fp32"]
            db = (bl - bb).abs().mean().item() / (b32 - bb).abs().mean().item()
            print(f"{name} {what}: step-0 logits ratio {d:.3f}, step-0 batch losses ratio {db:.3f}")
        le = run(mk, fx, tt, mk is not EmuGPT, perturb=pert)
        r = (le - lb).abs().mean().item() / bar
        print(f"{name} {what}: 100-step mean |run - autocast| / mean |fp32 - autocast| = {r:.3f}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--outdir", default="tests/fixtures/bf16")
    ap.add_argument("--only", choices=["gpt2", "llama"])
    ap.add_argument("--floor", action="store_true", help="measure the floor (fixtures must exist; no write)")
    ap.add_argument("--suffix", default="", help="appended to the fixture names (_amx on an AMX host)")
    args = ap.parse_args()
    torch.use_deterministic_algorithms(True)
    if args.floor:
        for name, make in (("gpt2", g16.GPT), ("llama", g16.llama)):
            if args.only in (None, name):
                floor(name, make, os.path.join(args.outdir, f"bf16_{name}{args.suffix}.safetensors"))
        return
    if args.only != "llama":
        fixture("gpt2", g16.GPT, os.path.join(args.outdir, f"bf16_gpt2{args.suffix}.safetensors"))
    if args.only != "gpt2":
        fixture("llama", g16.llama, os.path.join(args.outdir, f"bf16_llama{args.suffix}.safetensors"))


if __name__ == "__main__":
    main()
