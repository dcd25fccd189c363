"""Decode at batch 1 and 8 (the latency-bound end of issue 5's decode target): every config x split
count around the heuristic's, each timed as the whole op (split + combine) and as the split kernel
alone, from CUDA-graph replay over rotating page tables (distinct KV memory per replayed call, so
L2 cannot serve repeats). The difference of the two is what the combine launch costs in a graph.
"""

from __future__ import annotations

import torch
import triton

from attn_common import BS, D, HKV, HQ, graph_time_ms

from dayzero.kernels.triton_attention_decode import DecodePlan, choose_num_splits, launch_split
from dayzero.kernels.triton_attention import attention

SCALE = D ** -0.5
CFGS = {
    "n128w4s3": dict(BLOCK_N=128, num_warps=4, num_stages=3),
    "n128w4s3_pdl": dict(BLOCK_N=128, num_warps=4, num_stages=3, PDL=True),
    "n64w4s3": dict(BLOCK_N=64, num_warps=4, num_stages=3),
    "n64w4s3_pdl": dict(BLOCK_N=64, num_warps=4, num_stages=3, PDL=True),
    "n256w8s3_pdl": dict(BLOCK_N=256, num_warps=8, num_stages=3, PDL=True),
}
PLAN = [(1, 1024), (1, 8192), (1, 32768), (1, 131072), (8, 1024), (8, 8192), (8, 32768)]


def bench_decode_small(rows, ceil_bw):
    res = []
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    pool_blocks = 8 * 131072 // BS + 1024
    g = torch.Generator(device="cuda").manual_seed(17)
    k_pool = torch.randn(pool_blocks, BS, HKV, D, device="cuda", dtype=torch.bfloat16, generator=g)
    v_pool = torch.randn(pool_blocks, BS, HKV, D, device="cuda", dtype=torch.bfloat16, generator=g)
    sinks = torch.randn(HQ, device="cuda", generator=g) * 2
    for B, L in PLAN:
        nb = triton.cdiv(L, BS)
        kv_bytes = B * L * HKV * D * 2 * 2
        R = int(max(1, min(64, pool_blocks // (B * nb), triton.cdiv(1 << 29, kv_bytes))))
        tables = torch.randperm(pool_blocks, device="cuda", generator=g)[:R * B * nb].view(R, B, nb).to(torch.int32)
        q = torch.randn(B, HQ, D, device="cuda", dtype=torch.bfloat16, generator=g)
        k = torch.randn(B, HKV, D, device="cuda", dtype=torch.bfloat16, generator=g)
        v = torch.randn(B, HKV, D, device="cuda", dtype=torch.bfloat16, generator=g)
        cu = torch.arange(B + 1, device="cuda", dtype=torch.int32)
        cl = torch.full((B,), L, device="cuda", dtype=torch.int32)
        out = torch.empty_like(q)
        heur = choose_num_splits(B, HKV, L, 0, num_sms=sms)
        splits = sorted({s for s in (heur // 2, heur, 2 * heur, 96, 132) if 2 <= s <= triton.cdiv(L, 64)})
        line = []
        for name, cfg in CFGS.items():
            for ns in splits:
                if ns not in (heur, 2 * heur) and not name.startswith("n128w4s3"):
                    continue
                whole = [lambda t=tables[r], cfg=cfg, ns=ns: attention(
                    q, k, v, k_pool, v_pool, t, cu, cl, sinks, SCALE, 0, max_seqlen_q=1, num_splits=ns,
                    config=cfg, out=out) for r in range(R)]
                plan = DecodePlan.make(q, k, cl, ns, 0, cfg)
                split_only = [lambda t=tables[r], plan=plan: launch_split(
                    plan, q, k, v, k_pool, v_pool, t, cu, cl, sinks, SCALE, 0, out) for r in range(R)]
                try:
                    us = graph_time_ms(whole) * 1e3
                    us_split = graph_time_ms(split_only) * 1e3
                except Exception as e:  # a variant that fails is reported, the rest still run
                    res.append(dict(kind="error", section="decode1", config=name, batch=B, context=L,
                                    num_splits=ns, error=f"{type(e).__name__}: {str(e)[:300]}"))
                    continue
                r = dict(kind="decode1", batch=B, context=L, config=name, num_splits=ns, heuristic_splits=heur,
                         rotations=R, us=us, split_only_us=us_split, kv_bytes=kv_bytes,
                         tbps=kv_bytes / (us * 1e-6) / 1e12, frac_copy_bw=kv_bytes / (us * 1e-6) / ceil_bw)
                res.append(r)
        here = [r for r in res if r["kind"] == "decode1" and (r["batch"], r["context"]) == (B, L)]
        if here:
            top = min(here, key=lambda r: r["us"])
            d = [r for r in here if r["config"] == "n128w4s3" and r["num_splits"] == heur]
            d_txt = (f"default {d[0]['us']:6.1f} us (split alone {d[0]['split_only_us']:6.1f}) | " if d else "")
            line.append(f"decode1 B={B} ctx={L:>6}: {d_txt}best {top['config']}/s{top['num_splits']} "
                        f"{top['us']:6.1f} us (split alone {top['split_only_us']:6.1f}) {top['frac_copy_bw']:.0%} of copy")
        rows.extend(line)
        del tables, q, k, v, out
    del k_pool, v_pool
    torch.cuda.empty_cache()
    return res
