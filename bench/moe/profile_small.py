"""One T = 1 decode MoE call on the split-K path with its default tiles, then with g64_d128 (run 5's
T = 1 default), 20B shapes, for ``ncu`` (bench/moe/run.sh step ``small_ncu`` profiles the first
launch of each gate_up kernel):

    ncu --clock-control none --kernel-name regex:gate_up --launch-count 2 python3 bench/moe/profile_small.py
"""

from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import random_experts  # noqa: E402

from dayzero.kernels.triton_moe_small_split import VARIANTS, MoeSplit  # noqa: E402


def main() -> int:
    ex = random_experts(32, 2880, 2880, seed=35)
    x = torch.randn(1, 2880, device="cuda").bfloat16()
    ids = torch.tensor([[3, 11, 17, 29]], device="cuda")
    w = torch.full((1, 4), 0.25, device="cuda").bfloat16()
    for tiles in (None, VARIANTS["g64_d128"]):
        MoeSplit(x, w, ids, ex, 7.0, tiles)()
    torch.cuda.synchronize()
    print("profiled: default tiles, g64_d128")
    return 0


if __name__ == "__main__":
    sys.exit(main())
