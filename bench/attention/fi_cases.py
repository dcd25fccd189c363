"""The cases of flashinfer_compare.py (needs CUDA, triton, the project and FlashInfer on the path)."""

from __future__ import annotations

import importlib.metadata

import torch
import triton

from attn_common import graph_time_ms, run_meta, sink_reference_rows, time_ms
from flashinfer_compare import BS, D, HKV, HQ, SCALE, WINDOW, make_wrapper, plan, ragged_batch

from dayzero.kernels import torch_attention
from dayzero.kernels.triton_attention import attention as ours

DEV = "cuda"                # the CPU unit test points this at "cpu" (with test doubles for the GPU parts)
WS_BYTES = 512 << 20
POOL_TOKENS = 32 * 1024 * 1024
DECODE_GRID = [(b, L) for L in (1024, 8192, 32768, 131072) for b in (1, 8, 64, 256)]


def _fi():
    import flashinfer

    return flashinfer


def meta(run) -> None:
    m = run_meta()
    for pkg in ("flashinfer-python", "apache-tvm-ffi", "cuda-tile"):
        try:
            m[pkg] = importlib.metadata.version(pkg)
        except importlib.metadata.PackageNotFoundError:
            m[pkg] = None
    try:
        m["flashinfer_import"] = getattr(_fi(), "__version__", "?")
    except Exception as e:  # noqa: BLE001 - ours is still timed; every FlashInfer row reports the failure
        m["flashinfer_import"] = f"FAILED: {type(e).__name__}: {str(e)[:300]}"
    run.doc["meta"] = m
    run.say(f"{m['gpu']} commit {m['commit'][:12]} {m['date_utc']} flashinfer {m['flashinfer_import']}")


def _built(run, backend: str, window: int) -> bool:
    return any(b.get("ok") and b["backend"] == backend and b["window"] == window for b in run.doc["builds"]) \
        or not run.doc["builds"]


def _rel(a, b) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


def check(run, backends) -> None:
    """Small ragged prefill (incl. a chunk after a cached prefix) and decode batches vs the torch op."""
    fi = _fi() if any(_built(run, b, w) for b in backends for w in (0, WINDOW)) else None
    ws = torch.empty(WS_BYTES, dtype=torch.uint8, device=DEV)
    run.doc["window_left"] = {}
    cases = [("prefill", [300, 77, 100], [300, 77, 500]), ("decode", [1, 1, 1], [1000, 17, 300])]
    for kind, qo, kv in cases:
        for window in (0, WINDOW):
            c = ragged_batch(qo, kv, seed=len(run.doc["checks"]), device=DEV)
            args = (c["q"], c["k"], c["v"], c["kc"], c["vc"], c["bt"], c["cu"], c["cached"], c["sinks"], SCALE, window)
            ref = torch_attention.attention(*args)
            try:
                err = _rel(ours(*args), ref)
                run.doc["checks"].append(dict(impl="ours", kind=kind, window=window, rel_err=err, ok=err < 1e-2))
            except Exception as e:  # noqa: BLE001
                run.doc["checks"].append(dict(impl="ours", kind=kind, window=window, ok=False,
                                              error=f"{type(e).__name__}: {str(e)[:500]}"))
            for b in backends:
                if not _built(run, b, window):
                    continue
                cands = [WINDOW - 1, WINDOW] if window else [-1]
                for wl in cands:
                    try:
                        w = make_wrapper(fi, b, window, ws)
                        plan(w, qo, c["tables"], kv, wl, DEV)
                        err = _rel(w.run(c["q"], (c["kc"], c["vc"]), c["sinks"], SCALE), ref)
                        r = dict(impl=b, kind=kind, window=window, window_left=wl, rel_err=err, ok=err < 1e-2)
                    except Exception as e:  # noqa: BLE001 - one variant failing leaves the others
                        r = dict(impl=b, kind=kind, window=window, window_left=wl, ok=False,
                                 error=f"{type(e).__name__}: {str(e)[:500]}")
                    run.doc["checks"].append(r)
                    if r["ok"]:
                        run.doc["window_left"].setdefault(f"{b}/{window}", wl)
                        break
    for r in run.doc["checks"]:
        run.say(f"check {r['impl']:4} {r['kind']:7} W={r['window']:3} window_left={r.get('window_left', '-')}: "
                f"{'ok' if r['ok'] else 'FAILED'} rel_err {r.get('rel_err', float('nan')):.2e} {r.get('error', '')[:150]}")


def _wl(run, b, window) -> int:
    return run.doc.get("window_left", {}).get(f"{b}/{window}", (WINDOW - 1) if window else -1)


def causal_flops(n: int, window: int = 0) -> float:
    keys = torch.arange(1, n + 1, dtype=torch.float64)
    if window:
        keys = keys.clamp(max=window)
    return float(4 * D * HQ * keys.sum())


def prefill_case(run, backends, n: int, window: int) -> None:
    fi = _fi() if any(_built(run, b, window) for b in backends) else None
    c = ragged_batch([n], [n], seed=n, device=DEV)      # all n tokens new; FlashInfer reads them from the pages
    # ours gets max_seqlen_k = 0 (the longest cached prefix) as the engine's model runner passes it
    check_rows = [slice(0, 256), slice(n - 256, n)] if n <= 32768 else []
    refs = [sink_reference_rows(c["q"], c["k"], c["v"], c["sinks"], sl, window, SCALE) for sl in check_rows]
    kc, vc = c["kc"], c["vc"]
    flops = causal_flops(n, window)
    rep = 200 if n < 100000 else 50
    impls = ["ours"] + [b for b in backends if _built(run, b, window)] + ["sdpa"]
    ws = torch.empty(WS_BYTES, dtype=torch.uint8, device=DEV)
    for name in impls:
        out = torch.empty_like(c["q"])
        try:
            if name == "sdpa":   # torch SDPA without sinks (K/V expanded to 64 heads beforehand; window: a mask)
                fn = sdpa_fn(c["q"], c["k"], c["v"], window, out)
            elif name == "ours":
                fn = lambda: ours(c["q"], c["k"], c["v"], kc, vc, c["bt"], c["cu"], c["cached"],  # noqa: E731
                                  c["sinks"], SCALE, window, max_seqlen_q=n, max_seqlen_k=0, out=out)
            else:
                w = make_wrapper(fi, name, window, ws)
                plan(w, [n], c["tables"], [n], _wl(run, name, window), DEV)
                fn = lambda w=w: w.run(c["q"], (kc, vc), c["sinks"], SCALE, out=out)  # noqa: E731
            ms = time_ms(fn, rep=rep)
            fn()
            err = None if name == "sdpa" else max((_rel(out[sl], r) for sl, r in zip(check_rows, refs)), default=None)
            run.row(kind="prefill", impl=name, n=n, window=window, ms=ms, tflops=flops / (ms * 1e-3) / 1e12,
                    rel_err=err)
        except Exception as e:  # noqa: BLE001
            run.row(kind="error", section="prefill", impl=name, n=n, window=window, error=f"{type(e).__name__}: {e}")
    here = [r for r in run.doc["results"] if r["kind"] == "prefill" and (r["n"], r["window"]) == (n, window)]
    run.say(f"prefill N={n:>6} W={window or 'full':>4}: " + " | ".join(
        f"{r['impl']} {r['ms']:8.3f} ms {r['tflops']:6.1f} TF/s" for r in here))


def sdpa_fn(q, k, v, window: int, out):
    """torch SDPA (no sinks) on [1, 64, N, 64] tensors; returns a closure writing ``out`` [N, 64, 64]."""
    n = q.shape[0]
    qh = q.transpose(0, 1).unsqueeze(0).contiguous()
    kh, vh = (t.repeat_interleave(HQ // HKV, dim=1).transpose(0, 1).unsqueeze(0).contiguous() for t in (k, v))
    mask = None
    if window:
        i = torch.arange(n, device=q.device)
        mask = (i[None, :] <= i[:, None]) & (i[:, None] - i[None, :] < window)

    def fn():
        o = torch.nn.functional.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask, is_causal=mask is None,
                                                             scale=SCALE)
        out.copy_(o[0].transpose(0, 1))
    return fn


def decode_case(run, backends, pool, B: int, L: int) -> None:
    fi = _fi() if any(_built(run, b, 0) for b in backends) else None
    k_pool, v_pool = pool
    nb = triton.cdiv(L, BS)
    kv_bytes = B * L * HKV * D * 2 * 2
    R = int(max(1, min(128, k_pool.shape[0] // (B * nb), triton.cdiv(1 << 29, kv_bytes))))
    views = [(k_pool[r * B * nb:(r + 1) * B * nb], v_pool[r * B * nb:(r + 1) * B * nb]) for r in range(R)]
    tables = torch.randperm(B * nb, device=DEV).to(torch.int32).view(B, nb)
    q = torch.randn(B, HQ, D, device=DEV, dtype=torch.bfloat16)
    k = torch.randn(B, HKV, D, device=DEV, dtype=torch.bfloat16)
    v = torch.randn_like(k)
    sinks = torch.randn(HQ, device=DEV) * 2
    cu = torch.arange(B + 1, device=DEV, dtype=torch.int32)
    cl = torch.full((B,), L - 1, device=DEV, dtype=torch.int32)   # + the new token = L keys, as FlashInfer
    out = torch.empty_like(q)
    fns = [lambda kc=kc, vc=vc: ours(q, k, v, kc, vc, tables, cu, cl, sinks, SCALE, 0, max_seqlen_q=1,
                                      max_seqlen_k=L - 1, out=out) for kc, vc in views]
    rows = []
    try:
        rows.append(dict(impl="ours", us=graph_time_ms(fns) * 1e3, method="graph"))
    except Exception as e:  # noqa: BLE001
        run.row(kind="error", section="decode", impl="ours", batch=B, context=L, error=f"{type(e).__name__}: {e}")
    ws = torch.empty(WS_BYTES, dtype=torch.uint8, device=DEV)
    for b in backends:
        if not _built(run, b, 0):
            continue
        try:
            bufs = dict(qo_indptr_buf=cu.clone(), paged_kv_indptr_buf=torch.zeros(B + 1, dtype=torch.int32, device=DEV),
                        paged_kv_indices_buf=torch.zeros(B * nb, dtype=torch.int32, device=DEV),
                        paged_kv_last_page_len_buf=torch.zeros(B, dtype=torch.int32, device=DEV))
            w = make_wrapper(fi, b, 0, ws, bufs)
            plan(w, [1] * B, list(tables.cpu()), [L] * B, -1, DEV)
            fi_fns = [lambda w=w, kc=kc, vc=vc: w.run(q, (kc, vc), sinks, SCALE, out=out) for kc, vc in views]
            try:
                rows.append(dict(impl=b, us=graph_time_ms(fi_fns) * 1e3, method="graph"))
            except Exception as e:  # noqa: BLE001 - capture refused: eager, L2-warm when the KV fits
                if DEV == "cuda":
                    torch.cuda.synchronize()
                w = make_wrapper(fi, b, 0, ws)
                plan(w, [1] * B, list(tables.cpu()), [L] * B, -1, DEV)
                rows.append(dict(impl=b, us=time_ms(lambda: w.run(q, (views[0][0], views[0][1]), sinks, SCALE,
                                                                  out=out)) * 1e3,
                                 method="eager", graph_error=f"{type(e).__name__}: {str(e)[:300]}"))
        except Exception as e:  # noqa: BLE001
            run.row(kind="error", section="decode", impl=b, batch=B, context=L, error=f"{type(e).__name__}: {e}")
    for r in rows:
        run.row(kind="decode", batch=B, context=L, rotations=R, kv_bytes=kv_bytes,
                tbps=kv_bytes / (r["us"] * 1e-6) / 1e12, **r)
    run.say(f"decode B={B:>3} ctx={L:>6}: " + " | ".join(
        f"{r['impl']} {r['us']:7.1f} us {kv_bytes / (r['us'] * 1e-6) / 1e12:5.2f} TB/s ({r['method']})" for r in rows))


def timings(run, backends, with_128k: bool, decode_grid=DECODE_GRID) -> None:
    """Every case in its own part, cheapest first (128k prefill before the decode grid when
    ``decode_grid`` is shortened); cases the budget cannot reach are listed as skipped."""
    plan_ = [("prefill", n, w, 15) for w in (0, WINDOW) for n in (8192, 32768)]
    late = [("prefill", 131072, 0, 40)] if with_128k else []
    decode = [("decode", B, L, 6) for B, L in decode_grid]
    plan_ += late + decode if len(decode_grid) < len(DECODE_GRID) else decode + late
    held: dict = {}

    def alloc_pool() -> None:
        blocks = POOL_TOKENS // BS + 4096
        held["pool"] = tuple(torch.randn(blocks, BS, HKV, D, device=DEV, dtype=torch.bfloat16) for _ in range(2))

    for kind, x, y, need_s in plan_:
        if run.left() < need_s:
            run.doc["skipped"].append(dict(kind=kind, a=x, b=y, reason="budget"))
            continue
        if kind == "prefill":
            if held.pop("pool", None) is not None and DEV == "cuda":
                torch.cuda.empty_cache()
            run.part(f"prefill {x} W={y}", prefill_case, run, backends, x, y)
            continue
        if "pool" not in held and not held.get("pool_failed"):
            run.part("decode KV pool", alloc_pool)
            held["pool_failed"] = "pool" not in held
        if "pool" in held:
            run.part(f"decode B={x} ctx={y}", decode_case, run, backends, held["pool"], x, y)
        else:
            run.doc["skipped"].append(dict(kind=kind, a=x, b=y, reason="no KV pool"))
    held.clear()
    if run.doc["skipped"]:
        run.say(f"skipped: {run.doc['skipped']}")
