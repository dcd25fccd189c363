"""One host-to-device copy for an eager step's integer metadata.

The eager (prefill / mixed) forward needs a handful of small integer tensors on the device: token ids,
positions, cu_seqlens, cached lengths, two block tables, two slot mappings, the logits rows. Copied one by
one from pageable memory, each ``.to(device)`` blocks the host until the stream reaches it, and the GPU
waits for the host between them (~5 ms at the start of a 20B prefill of 8192 tokens, bench/NOTES.md
session 6). ``pack`` lays them out in one pinned byte buffer (16-byte aligned pieces) and issues a single
non-blocking copy; the device tensors are views of one device buffer. The caching host allocator keeps the
pinned block alive until the copy that reads it is done.
"""

from __future__ import annotations

import torch

ALIGN = 16


def pack(tensors: dict[str, torch.Tensor], device: torch.device) -> dict[str, torch.Tensor]:
    """CPU tensors (any shapes, integer or float dtypes) -> the same tensors on ``device`` after one copy
    (non-blocking from pinned memory on CUDA; on the CPU the packed buffer itself)."""
    device = torch.device(device)
    offs, size = {}, 0
    for k, t in tensors.items():
        if t.device.type != "cpu":
            raise ValueError(f"staging.pack: {k!r} must be a CPU tensor, got {t.device}")
        offs[k] = size
        size += (t.numel() * t.element_size() + ALIGN - 1) // ALIGN * ALIGN
    host = torch.empty(max(size, ALIGN), dtype=torch.uint8, pin_memory=device.type == "cuda")
    for k, t in tensors.items():
        n = t.numel() * t.element_size()
        if n:
            host[offs[k]:offs[k] + n].view(t.dtype).view(t.shape).copy_(t)
    dev = host.to(device, non_blocking=True) if device.type != "cpu" else host
    out = {}
    for k, t in tensors.items():
        n = t.numel() * t.element_size()
        out[k] = dev[offs[k]:offs[k] + n].view(t.dtype).view(t.shape)
    return out
