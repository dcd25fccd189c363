"""Shared by the GPU kernel tests: the device they run on, relative error, and output poisoning."""

from __future__ import annotations

import os

import torch

DEV = os.environ.get("DAYZERO_KERNEL_TEST_DEVICE", "cuda")  # "cpu" only under TRITON_INTERPRET=1


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    """||a - b|| / ||b|| in float64."""
    return ((a.double() - b.double()).norm() / b.double().norm().clamp(min=1e-30)).item()


def poison() -> None:
    """Fill the allocator's cached blocks with NaN: unwritten outputs then read as NaN."""
    if DEV == "cuda":
        free = torch.cuda.mem_get_info()[0]
        blob = torch.full((min(free // 8, 1 << 30),), float("nan"), device=DEV)      # large pool
        small = [torch.full((1 << 16,), float("nan"), device=DEV) for _ in range(64)]  # small pool (<= 1 MB)
        del blob, small
