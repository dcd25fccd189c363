"""Latency floor of a decode attention call on this GPU (what B=8 / 1k context cannot go under).

From CUDA-graph replay, per call:
  * ``empty``: one launch of an empty kernel on the decode grid (64 splits x 8 KV heads), and the
    same with PDL (programmatic dependent launch: the next launch overlaps this one's tail);
  * ``empty x2``: two dependent launches (split + merge) per call;
  * ``chain``: one launch whose programs do the split kernel's dependent loads and nothing else:
    cu -> cl -> page table -> one 64-key K tile (from a pool larger than L2) -> one store;
  * ``chain + empty``: that and a one-warp second launch, the shape of split + merge.
Prints the rows and writes ``$OUT/decode-floor.json``.

    PYTHONPATH=shared python3 bench/attention/bench_floor.py
"""

from __future__ import annotations

import json
import os
import pathlib
import sys

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from attn_common import BS, D, HKV, graph_time_ms, run_meta  # noqa: E402

GRID = (64, HKV, 1)


@triton.jit
def _empty_kernel(x_ptr, PDL: tl.constexpr):
    if PDL:
        gdc_wait()
        gdc_launch_dependents()


@triton.jit
def _chain_kernel(cu_ptr, cl_ptr, bt_ptr, kc_ptr, out_ptr, stride_bt, stride_kcb, stride_kch,
                  BLOCK_N: tl.constexpr, HEAD_D: tl.constexpr, BS_: tl.constexpr, HKV_: tl.constexpr,
                  PDL: tl.constexpr):
    if PDL:
        gdc_wait()
        gdc_launch_dependents()
    s = tl.program_id(0)
    h = tl.program_id(1)
    b = tl.program_id(2)
    q_row = tl.load(cu_ptr + b)
    ctx = tl.load(cl_ptr + b)
    offs_n = tl.arange(0, BLOCK_N)
    pos = (s * BLOCK_N + offs_n) % tl.maximum(ctx, 1)
    blk = tl.load(bt_ptr + b * stride_bt + pos // BS_).to(tl.int64)                       # [BN]
    offs_d = tl.arange(0, HEAD_D)
    kt = tl.load(kc_ptr + blk[:, None] * stride_kcb + h * stride_kch + (pos % BS_)[:, None] * (HKV_ * HEAD_D)
                 + offs_d[None, :])                                                         # [BN, D]
    tl.store(out_ptr + ((q_row * tl.num_programs(1) + h) * tl.num_programs(0) + s), tl.sum(tl.sum(kt.to(tl.float32), 1), 0))


def main() -> int:
    g = torch.Generator(device="cuda").manual_seed(3)
    pool = (1 << 30) // (BS * HKV * D * 2)           # 1 GB of K pages, far beyond L2 (50 MB)
    kc = torch.randn(pool, BS, HKV, D, device="cuda", dtype=torch.bfloat16, generator=g)
    L, R = 1024, 64
    tables = torch.randint(0, pool, (R, 1, L // BS), device="cuda", generator=g, dtype=torch.int32)
    cu = torch.zeros(2, device="cuda", dtype=torch.int32)
    cu[1] = 1
    cl = torch.full((1,), L, device="cuda", dtype=torch.int32)
    out = torch.empty(GRID[0] * GRID[1] * 2, device="cuda")
    x = torch.empty(1, device="cuda")

    def empty(pdl):
        return lambda: _empty_kernel[GRID](x, PDL=pdl, **(dict(launch_pdl=True) if pdl else {}))

    def one_warp(pdl):
        return lambda: _empty_kernel[(64, 1)](x, PDL=pdl, num_warps=1, **(dict(launch_pdl=True) if pdl else {}))

    def chain(t, pdl):
        return lambda: _chain_kernel[GRID](cu, cl, t, kc, out, t.stride(0), kc.stride(0), kc.stride(2), BLOCK_N=64,
                                           HEAD_D=D, BS_=BS, HKV_=HKV, PDL=pdl,
                                           **(dict(launch_pdl=True) if pdl else {}))

    rows, res = [], []
    for pdl in (False, True):
        cases = {
            "empty": [empty(pdl)],
            "empty x2": [empty(pdl), one_warp(pdl)],
            "chain": [chain(tables[r], pdl) for r in range(R)],
            "chain + empty": [f for r in range(R) for f in (chain(tables[r], pdl), one_warp(pdl))],
        }
        for name, fns in cases.items():
            per_call = 2 if "+" in name or "x2" in name else 1
            calls = fns * (32 // len(fns)) if len(fns) < 32 else fns
            us = graph_time_ms(calls) * 1e3 * per_call
            res.append(dict(kind="floor", case=name, pdl=pdl, us=us))
            rows.append(f"floor {name:<14} pdl={int(pdl)}: {us:6.2f} us per call")
    meta = run_meta()
    print(f"{meta['gpu']} {meta['date_utc']}")
    print("\n".join(rows))
    path = pathlib.Path(os.environ.get("OUT", ".")) / "decode-floor.json"
    path.write_text(json.dumps(dict(meta=meta, results=res), indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
