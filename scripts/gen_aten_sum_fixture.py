#!/usr/bin/env python3
"""PyTorch's float32 sums for tests/kernels/test_aten_sum.c (Note [ATen's summation order] in
src/device/cpu/kernels/aten_sum.c). Writes tests/fixtures/aten_sum.safetensors:
    row.<n>   F32 (4, n)   random rows, n in ROW_LENS
    rsum.<n>  F32 (4,)     torch.sum over the last dimension
    col.<R>x<C>  F32 (R, C) random matrices
    csum.<R>x<C> F32 (C,)   torch.sum over dim 0
The values span magnitudes (x * 2^U(-8, 8)) so that the order of additions shows in the rounding.
Usage: python3 scripts/gen_aten_sum_fixture.py (torch from PyPI; the order depends on the build's
reduction kernels: see the Note)"""
import os

import torch
from safetensors.torch import save_file

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "aten_sum.safetensors")
ROW_LENS = [1, 3, 7, 8, 9, 15, 31, 32, 33, 63, 64, 65, 127, 128, 192, 255, 256, 257, 511, 768, 1000, 2048, 4099]
COLS = [(11, 64), (16, 64), (17, 70), (64, 96), (255, 40), (257, 33), (300, 64), (1100, 8), (1030, 5)]


def rnd(*shape, g):
    return (torch.randn(*shape, generator=g) * torch.exp2(torch.randint(-8, 9, shape, generator=g).float())).float()


def main():
    g = torch.Generator().manual_seed(7)
    out = {}
    torch.set_num_threads(1)  # the serial order (below the grain the threads do not split a sum anyway)
    for n in ROW_LENS:
        x = rnd(4, n, g=g)
        out[f"row.{n}"], out[f"rsum.{n}"] = x, x.sum(-1)
    for R, C in COLS:
        x = rnd(R, C, g=g)
        out[f"col.{R}x{C}"], out[f"csum.{R}x{C}"] = x, x.sum(0)
    save_file({k: v.contiguous() for k, v in out.items()}, OUT)
    print(f"{OUT}: {len(out)} tensors, torch {torch.__version__}, cpu capability "
          f"{torch.backends.cpu.get_cpu_capability()}")


if __name__ == "__main__":
    main()
