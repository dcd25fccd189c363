"""Decode at batch 1 and 8 (the latency-bound end of issue 5's decode target): every config x split
count around the heuristic's, timed as the whole op from CUDA-graph replay over rotating page tables
(distinct KV memory per replayed call, so L2 cannot serve repeats); for the shipped kernels and their
PDL twins at the heuristic's count also behind a plain kernel that writes q (as rope does in the
engine), and the version-1 split kernel alone (what its combine launch costs in a graph).
"""

from __future__ import annotations

import os

import torch
import triton

from attn_common import BS, D, HKV, HQ, decode_problem, graph_time_ms

from dayzero.kernels.triton_attention_decode import DecodePlan, choose_num_splits, launch_split
from dayzero.kernels.triton_attention import attention

SCALE = D ** -0.5
CFGS = {  # the split-KV kernel + merge (shipped) and version 1 (split + combine), PDL forced off / on
    "strided_n64": dict(BLOCK_N=64, num_warps=4, num_stages=3, PDL=False, MERGE="kernel", STRIDED=True),
    "strided_n64_pdl": dict(BLOCK_N=64, num_warps=4, num_stages=3, PDL=True, MERGE="kernel", STRIDED=True),
    "n128w4s3": dict(BLOCK_N=128, num_warps=4, num_stages=3, PDL=False, MERGE="combine"),
    "n128w4s3_pdl": dict(BLOCK_N=128, num_warps=4, num_stages=3, PDL=True, MERGE="combine"),
}
KEYED = {"strided_n64", "strided_n64_pdl", "n128w4s3", "n128w4s3_pdl"}  # timed behind a q writer too
V1 = {"n128w4s3", "n128w4s3_pdl"}  # DecodePlan kernels: the split kernel alone is timed too
PLAN = [(1, 1024), (1, 8192), (1, 32768), (1, 131072), (8, 1024), (8, 8192)]
if os.environ.get("DECODE1_PLAN"):  # e.g. "1:2048,1:4096" (batch:context)
    PLAN = [tuple(int(x) for x in p.split(":")) for p in os.environ["DECODE1_PLAN"].split(",")]


def _splits(name: str, heur: int, L: int) -> list[int]:
    """Split counts to time for one config: around the heuristic's (96 too at long contexts)."""
    if name.startswith("strided"):
        want = {heur // 2, heur, 2 * heur}
    else:
        want = {heur}
    return sorted(s for s in want if 2 <= s <= triton.cdiv(L, 64))


def _us(rs: list) -> str:
    r = rs[0]
    if r["with_writer_us"] is None:
        return f"{r['us']:6.1f} us"
    alone = "" if r["split_only_us"] is None else f"split alone {r['split_only_us']:6.1f}; "
    return f"{r['us']:6.1f} us ({alone}after a q writer {r['with_writer_us'] - r['writer_alone_us']:6.1f})"


def bench_decode_small(rows, ceil_bw):
    res = []
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    pool_blocks = 8 * 131072 // BS + 1024
    g = torch.Generator(device="cuda").manual_seed(17)
    k_pool = torch.randn(pool_blocks, BS, HKV, D, device="cuda", dtype=torch.bfloat16, generator=g)
    v_pool = torch.randn(pool_blocks, BS, HKV, D, device="cuda", dtype=torch.bfloat16, generator=g)
    sinks = torch.randn(HQ, device="cuda", generator=g) * 2
    for B, L in PLAN:
        R, tables, q, k, v, cu, cl, out, kv_bytes = decode_problem(B, L, pool_blocks, g, max_rotations=64)
        heur = choose_num_splits(B, HKV, L, 0, num_sms=sms)
        line = []
        for name, cfg in CFGS.items():
            for ns in _splits(name, heur, L):
                whole = [lambda t=tables[r], cfg=cfg, ns=ns: attention(
                    q, k, v, k_pool, v_pool, t, cu, cl, sinks, SCALE, 0, max_seqlen_q=1, num_splits=ns,
                    config=cfg, out=out) for r in range(R)]
                plan = DecodePlan.make(q, k, cl, ns, 0, cfg) if name in V1 else None
                split_only = [lambda t=tables[r], plan=plan: launch_split(
                    plan, q, k, v, k_pool, v_pool, t, cu, cl, sinks, SCALE, 0, out) for r in range(R)]
                # engine-like: a plain kernel that writes q (as rope does) before each call; timed with
                # and without it, so the PDL gain is not only attention calls overlapping each other
                sep = [lambda f=f: (q.mul_(1.0), f()) for f in whole]
                key = name in KEYED and ns == heur
                try:
                    us = graph_time_ms(whole) * 1e3
                    # the version-1 split kernel alone and its PDL twin at the heuristic's count
                    us_split = graph_time_ms(split_only) * 1e3 if key and plan is not None else None
                    us_sep = graph_time_ms(sep) * 1e3 if key else None
                    us_mul = graph_time_ms([lambda: q.mul_(1.0)] * 8) * 1e3 if key else None
                except Exception as e:  # a variant that fails is reported, the rest still run
                    res.append(dict(kind="error", section="decode1", config=name, batch=B, context=L,
                                    num_splits=ns, error=f"{type(e).__name__}: {str(e)[:300]}"))
                    continue
                r = dict(kind="decode1", batch=B, context=L, config=name, num_splits=ns, heuristic_splits=heur,
                         rotations=R, us=us, split_only_us=us_split, with_writer_us=us_sep, writer_alone_us=us_mul,
                         kv_bytes=kv_bytes,
                         tbps=kv_bytes / (us * 1e-6) / 1e12, frac_copy_bw=kv_bytes / (us * 1e-6) / ceil_bw)
                res.append(r)
        here = [r for r in res if r["kind"] == "decode1" and (r["batch"], r["context"]) == (B, L)]
        if here:
            top = min(here, key=lambda r: r["us"])
            d = [r for r in here if r["config"] == "strided_n64" and r["num_splits"] == heur]
            p = [r for r in here if r["config"] == "strided_n64_pdl" and r["num_splits"] == heur]
            d_txt = f"no PDL s{heur} {_us(d)} | " if d else ""
            p_txt = f"pdl {_us(p)} | " if p else ""
            line.append(f"decode1 B={B} ctx={L:>6}: {d_txt}{p_txt}best {top['config']}/s{top['num_splits']} "
                        f"{top['us']:6.1f} us {top['frac_copy_bw']:.0%} of copy")
        rows.extend(line)
        del tables, q, k, v, out
    del k_pool, v_pool
    torch.cuda.empty_cache()
    return res
