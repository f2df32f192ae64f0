"""Shared pieces of the training-parity fixture generators (gen_gpt2_parity.py, gen_llama_parity.py).

Both fixtures have one layout (read by tests/parity_fixture.h): param.<name>, tokens, logits, loss,
grad.<name>, train_tokens, step_losses, step_grad_norms, step_lrs, final.<name>, and the optimizer settings
in the metadata. The training run is AdamW (decay only on >= 2-d weights), gradient accumulation with the
loss divided by ACCUM, global-norm clipping, linear warmup then cosine to MIN_LR.
"""
import math

import torch
from safetensors.torch import save_file

LR, MIN_LR, WARMUP, WD, CLIP = 1e-3, 1e-4, 3, 0.1, 1.0
BETA1, BETA2, EPS = 0.9, 0.95, 1e-8
STEPS, ACCUM = 10, 2


def optim_meta():
    return dict(steps=STEPS, accum=ACCUM, lr=LR, min_lr=MIN_LR, warmup=WARMUP, weight_decay=WD, clip=CLIP,
                beta1=BETA1, beta2=BETA2, eps=EPS)


def lr_at(it, steps=STEPS, warmup=WARMUP):
    if it < warmup:
        return LR * (it + 1) / warmup
    ratio = (it - warmup) / (steps - warmup)
    return MIN_LR + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (LR - MIN_LR)


def adamw(model):
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": WD}, {"params": no_decay, "weight_decay": 0.0}],
                             lr=LR, betas=(BETA1, BETA2), eps=EPS, foreach=False, fused=False)


def learnable_tokens(g, shape, vocab):
    """Random int64 tokens of `shape` (last dim T+1) made learnable: an affine recurrence with 10% noise, so
    the loss visibly falls over a few steps."""
    tk = torch.randint(0, vocab, shape, generator=g)
    noise = torch.rand(shape, generator=g) < 0.1
    for t in range(1, shape[-1]):
        nxt = (tk[..., t - 1] * 5 + 1) % vocab
        tk[..., t] = torch.where(noise[..., t], tk[..., t], nxt)
    return tk


def forward_backward(model, loss_of, g, batch, seq, vocab, out):
    """One forward/backward on random tokens: tokens, logits, loss, param.* and grad.* into `out`."""
    out.update({"param." + n: p.detach().clone() for n, p in model.named_parameters()})
    tokens = torch.randint(0, vocab, (batch, seq + 1), generator=g)
    logits, loss = loss_of(model, tokens)
    loss.backward()
    out["tokens"] = tokens.to(torch.int32)
    out["logits"] = logits.detach().clone()
    out["loss"] = loss.detach().reshape(1).clone()
    for n, p in model.named_parameters():
        out["grad." + n] = p.grad.detach().clone()
    model.zero_grad(set_to_none=True)
    return loss.item()


def train(model, loss_of, train_tokens, out):
    """STEPS optimizer steps of ACCUM micro-batches each: train_tokens, step_* and final.* into `out`."""
    opt = adamw(model)
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
    out["step_losses"] = torch.tensor(losses, dtype=torch.float32)
    out["step_grad_norms"] = torch.tensor(norms, dtype=torch.float32)
    out["step_lrs"] = torch.tensor(lrs, dtype=torch.float32)
    for n, p in model.named_parameters():
        out["final." + n] = p.detach().clone()
    return losses


def save(out, path, meta, loss, losses):
    meta = {k: str(v) for k, v in dict(meta, torch=torch.__version__).items()}
    save_file({k: v.contiguous() for k, v in out.items()}, path, metadata=meta)
    print(f"wrote {path}: loss {loss:.6f}, step losses {[round(x, 5) for x in losses]}")
