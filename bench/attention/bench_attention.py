"""Attention benchmark on one GPU (GPT-OSS shapes: 64/8 heads, head dim 64, page 16, bf16, sinks).

Measures, in one run: the copy-bandwidth and bf16 GEMM ceilings; causal prefill TFLOP/s (useful
FLOPs 2*N^2*D per head) at 8k/32k/128k for several tile configs, beside torch SDPA (no sinks);
sliding-window (128) prefill time vs the time to move Q, K, V and O once; chunked prefill over a
paged prefix; decode KV bandwidth at batch 1..256 x context 1k..128k (CUDA-graph replay, rotating
over distinct pages so L2 cannot serve repeats) for several configs and split counts; store_kv.
Prints a table, writes ``attention.json`` into ``--out`` (default $OUT or .).
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
from attn_common import BS, D, HKV, HQ, bf16_gemm_tflops, copy_bandwidth, graph_time_ms, run_meta  # noqa: E402
from attn_common import decode_problem, single_sequence, sink_reference_rows, time_ms  # noqa: E402

from bench_decode_big import bench_decode_big  # noqa: E402
from bench_decode_small import bench_decode_small  # noqa: E402
from bench_window_probe import bench_window_probe  # noqa: E402

from dayzero.kernels.triton_attention import attention, store_kv  # noqa: E402
from dayzero.kernels.triton_attention_decode import choose_num_splits  # noqa: E402
from dayzero.kernels.triton_attention_window import window_attention  # noqa: E402

SCALE = D ** -0.5
def _pcfg(m, n, w, s, pack, tma):
    return dict(KERNEL="flash", BLOCK_M=m, BLOCK_N=n, num_warps=w, num_stages=s, PACK=pack, TMA=tma)


def _wcfg(rows, w, tma=True, s=1, maxnreg=None, branch=False):
    cfg = dict(KERNEL="window", ROWS=rows, num_warps=w, num_stages=s, TMA=tma, GATHER_BRANCH=branch)
    if maxnreg:
        cfg["maxnreg"] = maxnreg
    return cfg


# name -> config; the first entry is the shipped default (default_prefill_config), the rest are
# alternatives measured in the same run so the default can be re-chosen from data
PREFILL_CFGS = {
    "m128n64w4s3_tma": _pcfg(128, 64, 4, 3, False, True),
    "m128n64w4s3": _pcfg(128, 64, 4, 3, False, False),
    "m64n64w4s3_pack_tma": _pcfg(64, 64, 4, 3, True, True),
    "m128n128w8s3_pack_tma": _pcfg(128, 128, 8, 3, True, True),
    "m128n64w4s4_tma": _pcfg(128, 64, 4, 4, False, True),
    "m128n128w8s3_tma": _pcfg(128, 128, 8, 3, False, True),
    "m128n64w8s3_tma": _pcfg(128, 64, 8, 3, False, True),
}
WINDOW_CFGS = {
    "win_r64w4_tma": _wcfg(64, 4),
    "win_r64w4": _wcfg(64, 4, tma=False),
    "m64n32w4s3_pack_tma": _pcfg(64, 32, 4, 3, True, True),
    "win_r64w4_branch": _wcfg(64, 4, tma=False, branch=True),
    "win_r64w4_tma_reg96": _wcfg(64, 4, maxnreg=96),
    "win_r128w8_tma": _wcfg(128, 8),
}
DECODE_CFGS = {  # the shipped split-KV kernel (strided BLOCK_N 64, PDL where split: run 10) first; then PDL off
    "kernel_strided_n64_pdl": dict(BLOCK_N=64, num_warps=4, num_stages=3, MERGE="kernel", STRIDED=True, PDL=None),
    "kernel_strided_n64": dict(BLOCK_N=64, num_warps=4, num_stages=3, MERGE="kernel", STRIDED=True, PDL=False),
    "n128w4s3": dict(BLOCK_N=128, num_warps=4, num_stages=3, MERGE="combine", PDL=False),   # version 1
    "kernel_strided_n64_s4": dict(BLOCK_N=64, num_warps=4, num_stages=4, MERGE="kernel", STRIDED=True, PDL=False),
}
# run 8 also timed a folded merge (one launch, atomic ticket: slower at every split count); run 9
# strided BLOCK_N 32 (no faster; failed the engine's graph-vs-eager test)
SWEPT = {"n128w4s3"}  # also timed at every split count at B = 1 (besides the default)
WINDOW_DECODE_CFGS = {  # the second entry of each table is the quick mode's alternative
    "n64w4s2_pdl": dict(BLOCK_N=64, num_warps=4, num_stages=2, PDL=None),   # shipped since run 10
    "n64w4s2": dict(BLOCK_N=64, num_warps=4, num_stages=2, PDL=False),
    "n64w4s2_kernel": dict(BLOCK_N=64, num_warps=4, num_stages=2, MERGE="kernel", PDL=False),
}
WINDOW = 128


def causal_flops(n: int, window: int = 0, cached: int = 0) -> float:
    i = torch.arange(n, dtype=torch.float64)
    keys = cached + i + 1
    if window:
        keys = keys.clamp(max=window)
    return float(4 * D * HQ * keys.sum())


def qkvo_bytes(n: int) -> int:
    return 2 * n * D * (2 * HQ + 2 * HKV)


def bench_prefill(sizes, rows, ceil_bw, quick, windows, only=None):
    res = []
    for window, cfgs in ((0, PREFILL_CFGS), (WINDOW, WINDOW_CFGS)):
        if window not in windows:
            continue
        best = None
        # window tiles are cheap (< 3 ms at 128k): every config, and 128k, even in quick mode
        for n in (sizes if not window else sorted(set(sizes) | {131072})):
            c = single_sequence(n, seed=n)
            args = (c["q"], c["k"], c["v"], c["k_cache"], c["v_cache"], c["block_tables"], c["cu_seqlens_q"],
                    c["cached_lens"], c["sinks"], SCALE, window)
            names = list(cfgs) if (n <= 32768 and (window or not quick)) else [best or next(iter(cfgs))]
            if only and n <= 32768:  # --prefill-cfgs: the default and the named alternatives
                names = [nm for nm in cfgs if nm == next(iter(cfgs)) or nm in only]
            for name in names:
                out = torch.empty_like(c["q"])
                fn = lambda cfg=cfgs[name]: attention(*args, max_seqlen_q=n, config=cfg, out=out)  # noqa: E731
                try:
                    ms = time_ms(fn, rep=200 if n < 100000 else 50)
                except Exception as e:  # a variant that fails to build is reported, the rest still run
                    res.append(dict(kind="error", section="prefill", config=name, n=n, window=window,
                                    error=f"{type(e).__name__}: {str(e)[:300]}"))
                    rows.append(f"prefill W={window} N={n} config {name} FAILED: {type(e).__name__}")
                    continue
                r = dict(kind="prefill", window=window, n=n, config=name, ms=ms,
                         tflops=causal_flops(n, window) / (ms * 1e-3) / 1e12,
                         floor_ms=qkvo_bytes(n) / ceil_bw * 1e3)
                r["x_floor"] = ms / r["floor_ms"]
                if cfgs[name].get("KERNEL") == "window":  # registers / spills / smem of the launch
                    k = window_attention(*args, max_seqlen_q=n, out=out, config=cfgs[name])
                    r["launch"] = dict(regs=k.n_regs, spills=k.n_spills, smem=k.metadata.shared)
                res.append(r)
            here = [r for r in res if r["kind"] == "prefill" and r["window"] == window and r["n"] == n]
            top = min(here, key=lambda r: r["ms"])
            dflt = [r for r in here if r["config"] == next(iter(cfgs))]
            if n <= 32768:
                best = top["config"]
            # accuracy of the best config on the first and last 256 rows (fp32 reference)
            out = attention(*args, max_seqlen_q=n, config=cfgs[top["config"]])
            errs = []
            for sl in (slice(0, 256), slice(n - 256, n)):
                ref = sink_reference_rows(c["q"], c["k"], c["v"], c["sinks"], sl, window, SCALE)
                errs.append(float((out[sl].float() - ref).norm() / ref.norm()))
            top["rel_err"] = max(errs)
            del c, out, ref
            torch.cuda.empty_cache()
            d_txt = f" | default {dflt[0]['ms']:8.3f} ms {dflt[0]['tflops']:6.1f} TFLOP/s" if dflt else ""
            rows.append(f"prefill W={window or 'full':>4} N={n:>6}  best {top['config']:<22} {top['ms']:8.3f} ms "
                        f"{top['tflops']:6.1f} TFLOP/s {top['x_floor']:6.1f}x QKVO floor err {top['rel_err']:.1e}"
                        + d_txt)
    return res


def bench_sdpa(sizes, rows):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    res = []
    for n in sizes:
        g = torch.Generator(device="cuda").manual_seed(1)
        q = torch.randn(1, HQ, n, D, device="cuda", dtype=torch.bfloat16, generator=g)
        k = torch.randn(1, HKV, n, D, device="cuda", dtype=torch.bfloat16, generator=g)
        v = torch.randn(1, HKV, n, D, device="cuda", dtype=torch.bfloat16, generator=g)
        variant = "gqa"
        try:
            with sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION, SDPBackend.EFFICIENT_ATTENTION]):
                fn = lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)  # noqa: E731
                fn()
                ms = time_ms(fn, rep=200 if n < 100000 else 50)
        except RuntimeError:
            variant = "expanded"
            k, v = (t.repeat_interleave(HQ // HKV, 1) for t in (k, v))
            with sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION, SDPBackend.EFFICIENT_ATTENTION]):
                fn = lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)  # noqa: E731
                ms = time_ms(fn, rep=200 if n < 100000 else 50)
        r = dict(kind="sdpa", n=n, variant=variant, ms=ms, tflops=causal_flops(n) / (ms * 1e-3) / 1e12)
        res.append(r)
        rows.append(f"torch SDPA causal (no sinks, {variant}) N={n:>6} {ms:8.3f} ms {r['tflops']:6.1f} TFLOP/s")
        del q, k, v
        torch.cuda.empty_cache()
    return res


def bench_chunked(rows, windows):
    """Default kernel per row; window rows also with the flash kernel forced (KERNEL=flash)."""
    res = []
    cached = 24576
    plan = [(0, 8192, None), (WINDOW, 8192, None), (WINDOW, 8192, "flash"), (WINDOW, 512, None),
            (WINDOW, 512, "flash")]
    for window, n, kernel in plan:
        if window not in windows:
            continue
        c = single_sequence(n, cached=cached, seed=3)
        args = (c["q"], c["k"], c["v"], c["k_cache"], c["v_cache"], c["block_tables"], c["cu_seqlens_q"],
                c["cached_lens"], c["sinks"], SCALE, window)
        cfg = {"KERNEL": kernel} if kernel else None
        ms = time_ms(lambda: attention(*args, max_seqlen_q=n, config=cfg))
        r = dict(kind="chunked_prefill", window=window, cached=cached, n=n, kernel=kernel or "default", ms=ms,
                 tflops=causal_flops(n, window, cached) / (ms * 1e-3) / 1e12)
        res.append(r)
        rows.append(f"chunked prefill W={window or 'full':>4} {n} new after {cached} paged ({kernel or 'default'}): "
                    f"{ms:8.3f} ms {r['tflops']:6.1f} TFLOP/s")
    return res


def bench_decode(rows, ceil_bw, quick, sweep, only_batches=None):
    res = []
    max_tokens = 8 * 1024 * 1024
    pool_blocks = max_tokens // BS + 4096
    g = torch.Generator(device="cuda").manual_seed(7)
    k_pool = torch.randn(pool_blocks, BS, HKV, D, device="cuda", dtype=torch.bfloat16, generator=g)
    v_pool = torch.randn(pool_blocks, BS, HKV, D, device="cuda", dtype=torch.bfloat16, generator=g)
    sinks = torch.randn(HQ, device="cuda", generator=g) * 2
    batches = (1, 8, 16, 64, 256) if sweep else (1, 8, 64, 256)
    grid = [(b, L, 0) for b in batches for L in (1024, 8192, 32768, 131072) if b * L <= max_tokens]
    grid += [(b, L, WINDOW) for b in (1, 8, 64, 256) for L in (8192, 32768)]
    if only_batches:
        grid = [p for p in grid if p[0] in only_batches]
    for B, L, window in grid:
        R, tables, q, k, v, cu, cl, out, kv_bytes = decode_problem(B, L, pool_blocks, g, window)
        heur = choose_num_splits(B, HKV, L, window, num_sms=torch.cuda.get_device_properties(0).multi_processor_count)
        splits = {heur}
        if (B == 1 or sweep) and B <= 16 and (sweep or (not quick and not window)):
            wide = (1, 2, 4, 8, 16, 32, 64, 128) if sweep else (16, 32, 64)
            splits |= {s for s in wide if s <= triton.cdiv(min(L, window or L), 64)}
        table = WINDOW_DECODE_CFGS if window else DECODE_CFGS
        first = next(iter(table))
        # alternatives at B <= 8 only (from B = 64 on the heuristic picks one split: one kernel for all)
        second = list(table)[1]
        cfgs = list(table) if not quick and B <= 8 else [first, second]
        if splits == {1}:
            cfgs = [first]  # one split: the same single kernel whatever the merge config
        for name in cfgs:
            for ns in sorted(splits):
                if ns != heur and not (name == first or (B == 1 and name in SWEPT)):
                    continue
                fns = [lambda t=tables[r], cfg=table[name], ns=ns: attention(
                    q, k, v, k_pool, v_pool, t, cu, cl, sinks, SCALE, window, max_seqlen_q=1, num_splits=ns,
                    config=cfg, out=out) for r in range(R)]
                try:
                    ms = graph_time_ms(fns)
                except Exception as e:
                    res.append(dict(kind="error", section="decode", config=name, batch=B, context=L,
                                    error=f"{type(e).__name__}: {str(e)[:300]}"))
                    continue
                res.append(dict(kind="decode", batch=B, context=L, window=window, config=name, num_splits=ns,
                                heuristic_splits=heur, rotations=R, us=ms * 1e3, kv_bytes=kv_bytes,
                                tbps=kv_bytes / (ms * 1e-3) / 1e12, frac_copy_bw=kv_bytes / (ms * 1e-3) / ceil_bw))
        eager_us = time_ms(lambda: attention(q, k, v, k_pool, v_pool, tables[0], cu, cl, sinks, SCALE, window,
                                             max_seqlen_q=1, out=out)) * 1e3
        here = [r for r in res if r["kind"] == "decode" and (r["batch"], r["context"], r["window"]) == (B, L, window)]
        top = min(here, key=lambda r: r["us"])
        dflt = [r for r in here if r["config"] == first and r["num_splits"] == heur][0]
        dflt["eager_us"] = eager_us
        two = [r for r in here if r["config"] == second and r["num_splits"] == heur]
        pdl_txt = f"{second} {two[0]['us']:7.1f} us | " if two else ""
        rows.append(f"decode B={B:>3} ctx={L:>6} W={window or 'full':>4}: default {dflt['us']:7.1f} us "
                    f"{dflt['tbps']:5.2f} TB/s | {pdl_txt}best {top['config']}/s{top['num_splits']} {top['us']:7.1f} us "
                    f"{top['tbps']:5.2f} TB/s ({top['frac_copy_bw']:.0%} of copy) | eager {eager_us:6.1f} us")
        del tables, q, k, v, out
    del k_pool, v_pool
    torch.cuda.empty_cache()
    return res


def bench_store(rows, ceil_bw):
    T, nb = 8192, 8192 // BS + 64
    k = torch.randn(T, HKV, D, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    kc = torch.empty(nb, BS, HKV, D, device="cuda", dtype=torch.bfloat16)
    vc = torch.empty_like(kc)
    slots = torch.randperm(nb * BS, device="cuda")[:T]
    ms = graph_time_ms([lambda: store_kv(k, v, kc, vc, slots)])
    b = 4 * k.numel() * 2
    rows.append(f"store_kv T={T}: {ms * 1e3:.1f} us, {b / (ms * 1e-3) / 1e12:.2f} TB/s (read + write)")
    return [dict(kind="store_kv", tokens=T, us=ms * 1e3, tbps=b / (ms * 1e-3) / 1e12)]


def _write(out: str, meta, bw, tf, results, rows) -> pathlib.Path:
    doc = dict(meta=meta, ceilings=dict(copy_bytes_per_s=bw, bf16_gemm_tflops=tf), results=results, table=rows)
    path = pathlib.Path(out) / "attention.json"
    path.write_text(json.dumps(doc, indent=1))
    return path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--quick", action="store_true", help="one config per kernel, no 128k")
    ap.add_argument("--skip", default="", help="comma list of sections to skip: prefill,sdpa,chunked,probe,decode1,decode,decode_big,store")
    ap.add_argument("--windows", default="0,128", help="prefill/chunked rows to run: 0 (full causal), 128")
    ap.add_argument("--decode-sweep", action="store_true", help="split counts 1..128 at B <= 16")
    ap.add_argument("--decode-batches", default="", help="comma list: only these decode batch sizes")
    ap.add_argument("--decode1", action="store_true", help="batch 1/8 decode: configs x splits, split kernel alone")
    ap.add_argument("--decode-big", action="store_true", help="B=64/256 at 128k: 1 / 2 / 4 splits, fold vs two kernels")
    ap.add_argument("--prefill-cfgs", default="", help="comma list: prefill/window configs to time besides the default")
    a = ap.parse_args()
    skip = set(filter(None, a.skip.split(",")))
    torch.backends.cuda.matmul.allow_tf32 = False
    meta = run_meta()
    bw, tf = copy_bandwidth(), bf16_gemm_tflops()
    rows = [f"{meta['gpu']} commit {meta['commit'][:12]} {meta['date_utc']} | copy {bw / 1e12:.2f} TB/s, "
            f"bf16 GEMM {tf:.0f} TFLOP/s"]
    sizes = [8192, 32768] if a.quick else [8192, 32768, 131072]
    results = []
    windows = {int(w) for w in a.windows.split(",") if w}
    only = set(filter(None, a.prefill_cfgs.split(",")))
    sections = [("prefill", lambda: bench_prefill(sizes, rows, bw, a.quick, windows, only)),
                ("sdpa", lambda: bench_sdpa(sizes, rows)), ("chunked", lambda: bench_chunked(rows, windows)),
                ("probe", lambda: bench_window_probe(rows)),
                ("decode1", lambda: bench_decode_small(rows, bw) if a.decode1 else []),
                ("decode", lambda: bench_decode(rows, bw, a.quick, a.decode_sweep,
                                                {int(b) for b in a.decode_batches.split(",") if b})),
                ("decode_big", lambda: bench_decode_big(rows, bw) if a.decode_big else []),
                ("store", lambda: bench_store(rows, bw))]
    for name, fn in sections:
        if name in skip:
            continue
        try:
            results += fn()
        except Exception as e:  # keep the other sections' numbers; the failure is reported, not hidden
            rows.append(f"SECTION {name} FAILED: {type(e).__name__}: {e}")
            results.append(dict(kind="error", section=name, error=f"{type(e).__name__}: {e}"))
        print(f"[section {name} done]", flush=True)
        _write(a.out, meta, bw, tf, results, rows)  # after every section: a cut-off run keeps what finished
    path = _write(a.out, meta, bw, tf, results, rows)
    print("\n".join(rows))
    print(f"wrote {path}")
    return 0 if not any(r["kind"] == "error" for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
