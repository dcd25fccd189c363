"""Decode at the bandwidth-bound end (B = 64 / 256 at 128k context, 17-69 GB of KV per call): the
one-split kernel the heuristic picks there beside 2 / 4 splits, folded merge and two kernels, from
CUDA-graph replay. The KV pool (8M tokens) is smaller than one call's reads: page tables draw pages
at random with repeats across sequences, so L2 (50 MB) serves a negligible share of the reads.
"""

from __future__ import annotations

import torch

from attn_common import BS, D, HKV, HQ, graph_time_ms

from dayzero.kernels.triton_attention import attention
from dayzero.kernels.triton_attention_decode import choose_num_splits

SCALE = D ** -0.5
PLAN = [(64, 131072), (256, 131072)]
CFGS = {"default": None, "combine": dict(MERGE="combine", BLOCK_N=128),
        "n64": dict(BLOCK_N=64)}   # one split: the one-split kernel on the split-KV preset's tiles
SPLITS = (1, 2, 4)


def bench_decode_big(rows, ceil_bw):
    res = []
    pool_blocks = 8 * 1024 * 1024 // BS
    g = torch.Generator(device="cuda").manual_seed(23)
    k_pool = torch.randn(pool_blocks, BS, HKV, D, device="cuda", dtype=torch.bfloat16, generator=g)
    v_pool = torch.randn(pool_blocks, BS, HKV, D, device="cuda", dtype=torch.bfloat16, generator=g)
    sinks = torch.randn(HQ, device="cuda", generator=g) * 2
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for B, L in PLAN:
        nb = L // BS
        tables = torch.randint(0, pool_blocks, (2, B, nb), device="cuda", generator=g, dtype=torch.int32)
        q = torch.randn(B, HQ, D, device="cuda", dtype=torch.bfloat16, generator=g)
        k = torch.randn(B, HKV, D, device="cuda", dtype=torch.bfloat16, generator=g)
        v = torch.randn(B, HKV, D, device="cuda", dtype=torch.bfloat16, generator=g)
        cu = torch.arange(B + 1, device="cuda", dtype=torch.int32)
        cl = torch.full((B,), L - 1, device="cuda", dtype=torch.int32)   # + the new token = L keys
        out = torch.empty_like(q)
        kv_bytes = B * L * HKV * D * 2 * 2
        heur = choose_num_splits(B, HKV, L, 0, num_sms=sms)
        line = []
        for name, cfg in CFGS.items():
            for ns in SPLITS:
                if (ns == 1) == (name == "combine"):
                    continue  # one split: default vs n64; several: default vs combine
                fns = [lambda t=tables[r], cfg=cfg, ns=ns: attention(
                    q, k, v, k_pool, v_pool, t, cu, cl, sinks, SCALE, 0, max_seqlen_q=1, num_splits=ns,
                    config=cfg, out=out) for r in range(2)]
                try:
                    us = graph_time_ms(fns, target_ms=60.0) * 1e3
                except Exception as e:  # reported, the rest still run
                    res.append(dict(kind="error", section="decode_big", config=name, batch=B, context=L,
                                    num_splits=ns, error=f"{type(e).__name__}: {str(e)[:300]}"))
                    continue
                tbps = kv_bytes / (us * 1e-6) / 1e12
                res.append(dict(kind="decode_big", batch=B, context=L, config=name, num_splits=ns,
                                heuristic_splits=heur, us=us, kv_bytes=kv_bytes, tbps=tbps,
                                frac_copy_bw=kv_bytes / (us * 1e-6) / ceil_bw))
                line.append(f"{name}/s{ns} {us:8.1f} us {tbps:5.2f} TB/s")
        rows.append(f"decode_big B={B} ctx={L} (heuristic s{heur}): " + " | ".join(line))
        del tables, q, k, v, out
    del k_pool, v_pool
    torch.cuda.empty_cache()
    return res
