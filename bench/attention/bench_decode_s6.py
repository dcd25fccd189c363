"""Decode attention, session 6: the shipped op beside decode presets (``--configs``: "default" and any name in
triton_attention_decode.DECODE_PRESETS; call 2 compared grid (S, Hkv, B) ``kernel_strided_n64`` with grid
(Hkv, S, B) ``kernel_strided_n64_hm``, the default since, and 128-key tiles) at the latency-bound batches
(B = 1 / 8), split counts around the heuristic's. Every call is the registered op (split kernel + merge, PDL
where the KV is split, as shipped). Timings per row, all on
distinct KV memory per call (rotating page tables over a pool larger than L2):
  * ``us``: R calls captured back to back in one CUDA graph, replayed; time per call (the session-5 figures);
  * ``one_us`` (heuristic split count): up to 16 graphs of ONE call each, replayed one after another with
    events around each replay; median per replay (one call from an idle stream, graph launch included);
  * ``writer_us`` (heuristic split count): R calls, each behind a plain kernel that writes q (as rope does
    in the engine), back to back in one graph, minus that kernel alone;
  * ``split_us`` (heuristic split count, split-KV configs): the split kernel alone (no merge), back to back.
Prints one line per row and writes ``$OUT/decode-s6.json`` (run metadata from attn_common.run_meta).

    PYTHONPATH=shared python3 bench/attention/bench_decode_s6.py [--plan 1:32768,8:1024] [--configs a,b]
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys

import torch
import triton

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from attn_common import BS, D, HKV, HQ, copy_bandwidth, decode_problem, graph_time_ms, run_meta  # noqa: E402

from dayzero.kernels.triton_attention import attention  # noqa: E402
from dayzero.kernels.triton_attention_decode import DECODE_PRESETS, choose_num_splits, default_decode_config  # noqa: E402,E501
from dayzero.kernels.triton_attention_prefill import LOG2E  # noqa: E402
from dayzero.kernels.triton_attention_splitkv import splitkv_decode  # noqa: E402
from dayzero.kernels.triton_attention_decode_tma import tma_decode  # noqa: E402

SCALE = D ** -0.5
PLAN = [(1, 1024), (1, 8192), (1, 32768), (1, 131072), (8, 1024), (8, 8192)]
CFGS = {"default": None}   # the shipped op (split kernel + merge, PDL where split)
# --configs may name any preset: spelled out in full, as DAYZERO_DECODE_ATTENTION=<name> would run it (a config
# passed to the op only overrides the keys it names; the rest come from the default preset)
_BASE = dict(BLOCK_N=128, num_warps=4, num_stages=3, MERGE="combine", STRIDED=False, HEAD_MAJOR=False,
             EARLY_NEW=False, PART_BF16=False)
CFGS.update({name: dict(_BASE, **preset) for name, preset in DECODE_PRESETS.items() if not preset.get("TMA")})
CFGS.update({name: dict(preset) for name, preset in DECODE_PRESETS.items() if preset.get("TMA")})   # own keys
# without --configs: the shipped op, the grid before session 6, and the next candidate
DEFAULT_CONFIGS = ("default", "kernel_strided_n64", "kernel_strided_n64_hm_en")


def one_call_ms(fns: list, samples: int = 3) -> float:
    """Median ms of one call replayed from its own CUDA graph (``fns``: one call per rotation)."""
    graphs = []
    for f in fns:
        f()
    torch.cuda.synchronize()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for f in fns:
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, stream=s):
                f()
            graphs.append(g)
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    times = []
    for _ in range(samples):
        ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in graphs]
        for g, (a, b) in zip(graphs, ev):
            a.record()
            g.replay()
            b.record()
        torch.cuda.synchronize()
        times += [a.elapsed_time(b) for a, b in ev]
    times.sort()
    return times[len(times) // 2]


def _splits(B: int, heur: int, L: int) -> list[int]:
    if heur == 1:
        return [1]
    want = {heur // 2, heur, 2 * heur}
    # from 8 sequences also one split (one launch, no merge: B x 8 KV heads = 64+ programs; session 7)
    return sorted(s for s in want if 2 <= s <= min(64, triton.cdiv(L, 64))) + ([1] if B >= 8 else [])


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--plan", default="", help="batch:context,... (default: the module's PLAN)")
    ap.add_argument("--configs", default="", help="names from CFGS (default: all)")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    a = ap.parse_args()
    plan = [tuple(int(x) for x in p.split(":")) for p in a.plan.split(",")] if a.plan else PLAN
    cfgs = {n: CFGS[n] for n in (a.configs.split(",") if a.configs else DEFAULT_CONFIGS)}
    ceil_bw = copy_bandwidth()
    meta = dict(run_meta(), copy_tbps=ceil_bw / 1e12)
    print(f"copy {ceil_bw / 1e12:.2f} TB/s; {meta['gpu']}", flush=True)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    pool_blocks = 8 * 131072 // BS + 1024
    g = torch.Generator(device="cuda").manual_seed(29)
    k_pool = torch.randn(pool_blocks, BS, HKV, D, device="cuda", dtype=torch.bfloat16, generator=g)
    v_pool = torch.randn(pool_blocks, BS, HKV, D, device="cuda", dtype=torch.bfloat16, generator=g)
    sinks = torch.randn(HQ, device="cuda", generator=g) * 2
    res = []
    for B, L in plan:
        R, tables, q, k, v, cu, cl, out, kv_bytes = decode_problem(B, L, pool_blocks, g, max_rotations=64)
        heur = choose_num_splits(B, HKV, L, 0, num_sms=sms)
        writer_alone = graph_time_ms([lambda: q.mul_(1.0)] * 8) * 1e3
        best = None
        for name, cfg in cfgs.items():
            for ns in _splits(B, heur, L):
                calls = [lambda t=tables[r], cfg=cfg, ns=ns: attention(
                    q, k, v, k_pool, v_pool, t, cu, cl, sinks, SCALE, 0, max_seqlen_q=1, num_splits=ns,
                    config=cfg, out=out) for r in range(R)]
                row = dict(kind="decode_s6", batch=B, context=L, config=name, num_splits=ns, heuristic_splits=heur,
                           rotations=R, kv_bytes=kv_bytes, one_us=None, writer_us=None, split_us=None)
                try:
                    row["us"] = graph_time_ms(calls) * 1e3
                    if ns == heur:
                        row["one_us"] = one_call_ms(calls[:16]) * 1e3
                        behind = [lambda f=f: (q.mul_(1.0), f()) for f in calls]
                        row["writer_us"] = graph_time_ms(behind) * 1e3 - writer_alone
                    kcfg = dict(default_decode_config(D, 0, split=True), PDL=None)
                    kcfg.update(cfg or {})
                    if ns == heur and ns > 1 and kcfg["MERGE"] == "kernel":   # the split kernel alone
                        for key in ("MERGE", "PDL"):
                            kcfg.pop(key)
                        if kcfg.pop("TMA", False):   # the TMA candidate's split kernel (its own keys only)
                            tcfg = {k_: kcfg[k_] for k_ in ("PAGES", "num_warps", "num_stages") if k_ in kcfg}
                            split = [lambda t=tables[r], tcfg=tcfg, ns=ns: tma_decode(
                                tcfg, ns, q, k, v, k_pool, v_pool, t, cu, cl, sinks, SCALE * LOG2E, out, pdl=True,
                                merge=False) for r in range(R)]
                        else:
                            split = [lambda t=tables[r], kcfg=kcfg, ns=ns: splitkv_decode(
                                kcfg, ns, q, k, v, k_pool, v_pool, t, cu, cl, sinks, SCALE * LOG2E, 0, out, pdl=True,
                                merge=False) for r in range(R)]
                        row["split_us"] = graph_time_ms(split) * 1e3
                except Exception as e:  # a failing variant is reported, the rest still run
                    res.append(dict(kind="error", config=name, batch=B, context=L, num_splits=ns,
                                    error=f"{type(e).__name__}: {str(e)[:300]}"))
                    print(f"  {name} s{ns}: ERROR {type(e).__name__}: {str(e)[:200]}", flush=True)
                    continue
                row["tbps"] = kv_bytes / (row["us"] * 1e-6) / 1e12
                row["frac_copy_bw"] = row["tbps"] * 1e12 / ceil_bw
                res.append(row)
                extra = "".join(f" {k_} {row[k_]:6.2f}" for k_ in ("one_us", "writer_us", "split_us")
                                if row[k_] is not None)
                print(f"  B={B} ctx={L:>6} {name:>13} s{ns:<3} {row['us']:7.2f} us{extra}"
                      f" {row['tbps']:.2f} TB/s {row['frac_copy_bw']:.0%}", flush=True)
                if best is None or row["us"] < best["us"]:
                    best = row
        dflt = [r for r in res if r.get("kind") == "decode_s6" and (r["batch"], r["context"]) == (B, L)
                and r["config"] == "default" and r["num_splits"] == heur]
        if best is not None:
            base = f"default s{heur} {dflt[0]['us']:.2f} us | " if dflt else ""
            print(f"decode_s6 B={B} ctx={L}: {base}best {best['config']}/s{best['num_splits']} {best['us']:.2f} us "
                  f"({best['tbps']:.2f} TB/s, {best['frac_copy_bw']:.0%} of copy, {best['tbps'] / 4.26:.0%} of 4.26)",
                  flush=True)
        del tables, q, k, v, out
    pathlib.Path(a.out).mkdir(parents=True, exist_ok=True)
    (pathlib.Path(a.out) / "decode-s6.json").write_text(json.dumps(dict(meta=meta, results=res), indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
