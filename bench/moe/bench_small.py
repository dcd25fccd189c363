"""Decode-sized MoE (1-64 tokens): the split-K path (``triton_moe_small_split``, every candidate in
``VARIANTS``) vs the aligned small-M path of ``triton_moe`` (``MoeRun(small=True)``: 3 align launches,
gate_up, down, combine). (Runs 1-4 also timed session 2's two-launch path, removed after run 4.)

    PYTHONPATH=shared python bench/moe/bench_small.py --out DIR [--quick] [--jobs N] [--floor] [--shipped]
    (MOE_SMALL_VARIANTS=bn64,bn128 times only those split-K candidates at T <= 8,
     MOE_SMALL_BIG_VARIANTS those at T >= 16: default every candidate at every T; --shipped: only what the
     registered op runs at each T and E, beside the aligned path)

``--floor`` first measures what a T = 1 call cannot beat here (``floor_small.py``: two empty launches,
pure reads of the same weight bytes with the same grid shape), rows ``section=floor``.

Compiling every (variant, T) takes minutes one by one, so ``--jobs`` worker processes first run
each configuration once (filling Triton's on-disk cache) and the timing process then loads them.

What counts for decode is GPU time inside a CUDA graph (the engine replays decode in graphs), so
each case captures R calls with R different routings (each call its own buffers) in one graph,
replays it and divides the event time by R. Consecutive calls at T <= 2 touch disjoint experts, and
larger T touch >= 300 MB per call, so the 60 MB L2 does not serve the weights. Bandwidth is on the
bytes of the distinct experts each call touches (FP8 gate_up + down, block scales, biases). Eager
``do_bench`` rows (``section=small_eager``) are host-bound launch costs, reported as such.
Writes DIR/moe-small.json after every section.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import COPY_TBS, Results, graph_us, median_ms, random_experts  # noqa: E402

from dayzero.kernels.triton_moe import MoeRun  # noqa: E402
from dayzero.kernels.triton_moe_small_split import VARIANTS, MoeSplit  # noqa: E402
from dayzero.kernels.triton_moe_small_split import default_tiles as split_default  # noqa: E402
from dayzero.kernels.triton_moe_small_split import takes_split  # noqa: E402

H = I = 2880
K_TOP = 4
LIMIT = 7.0
R = 8  # calls per graph
DEV = "cuda"


def expert_bytes(ex) -> int:
    return (ex.gate_up[0].numel() + ex.down[0].numel() + 4 * (ex.gate_up_scale[0].numel() + ex.down_scale[0].numel())
            + 2 * (ex.gate_up_bias[0].numel() + ex.down_bias[0].numel()))


def routings(T: int, E: int, seed: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """R (weights [T,k] bf16, ids [T,k]) routings: random top-k; when few pairs, each call avoids
    the experts of the call before it (and the last avoids the first's: the graph loops)."""
    g = torch.Generator(device=DEV).manual_seed(seed)
    out, prev = [], None
    first = None
    for r in range(R):
        logits = torch.randn(T, E, device=DEV, generator=g).float()
        if 2 * T * K_TOP <= E and prev is not None:
            logits[:, prev] = float("-inf")
            if r == R - 1:
                logits[:, first] = float("-inf")
        top, ids = logits.bfloat16().topk(K_TOP, dim=1)
        out.append((torch.softmax(top, dim=1, dtype=torch.bfloat16), ids))
        prev = torch.unique(ids)
        first = prev if first is None else first
    return out


def shipped_variant(T: int, E: int) -> str:
    """The bench name of what the registered op runs for T tokens over E local experts."""
    if not takes_split(T * K_TOP, E):
        return "old_small"
    tiles = split_default(T * K_TOP, E)
    return "split_" + next(n for n, t in VARIANTS.items() if t == tiles)


def makers(T: int, E: int, ex) -> dict:
    """name -> (x, weights, ids) -> a call object with ``__call__`` (and stage methods).
    ``MOE_SMALL_VARIANTS_T<T>`` (e.g. MOE_SMALL_VARIANTS_T4) names the candidates at that T alone."""
    pick = os.environ.get(f"MOE_SMALL_VARIANTS_T{T}",
                          os.environ.get("MOE_SMALL_VARIANTS" if T <= 8 else "MOE_SMALL_BIG_VARIANTS", ""))
    m = {f"split_{name}": (lambda x, w, i, t=t: MoeSplit(x, w, i, ex, LIMIT, t)) for name, t in VARIANTS.items()
         if not pick or name in pick.split(",")}
    m["old_small"] = lambda x, w, i: MoeRun(x, w, i, ex, LIMIT, small=True)
    return m


def _compile_job(job: tuple) -> str:
    """Worker: run every configuration of (E, T) once, or the one named third (Triton compiles and caches
    its kernels)."""
    E, T, only = job if len(job) == 3 else (*job, None)
    try:
        ex = random_experts(E, H, I, seed=E + 3)
        if T == 0:  # the floor kernels (floor_small.py)
            from floor_small import compile_all

            compile_all(ex, routings(1, E, seed=1)[0][1])
            torch.cuda.synchronize()
            return f"E{E} floor ok"
        x = torch.randn(T, H, device=DEV).bfloat16()
        w, ids = routings(T, E, seed=T)[0]
        for name, make in makers(T, E, ex).items():
            if only is None or name == only:
                make(x, w, ids)()
        torch.cuda.synchronize()
        return f"E{E} T{T} {only or ''} ok"
    except Exception as exc:  # noqa: BLE001 - the timing pass records it again
        return f"E{E} T{T} {exc!r}"[:300]


def precompile(res: Results, jobs: list, n: int, limit_s: float = 70.0) -> None:
    """Run ``_compile_job`` over ``jobs`` in ``n`` spawned processes; after ``limit_s`` the rest is
    left to the timing pass (stragglers are terminated)."""
    import concurrent.futures as cf
    import multiprocessing as mp
    import time

    t0 = time.time()
    ex = cf.ProcessPoolExecutor(n, mp_context=mp.get_context("spawn"))
    futs = [ex.submit(_compile_job, j) for j in jobs]
    done, pending = cf.wait(futs, timeout=limit_s)
    msgs = [f.result() if not f.exception() else repr(f.exception())[:200] for f in done]
    procs = list(getattr(ex, "_processes", {}).values())
    ex.shutdown(wait=False, cancel_futures=True)
    for p in procs:
        if p.is_alive():
            p.terminate()
    res.add(section="precompile", jobs=len(jobs), workers=n, s=round(time.time() - t0, 1), unfinished=len(pending),
            msgs=msgs)


def sweep(res: Results, E: int, Ts, out_dir: str) -> None:
    ex = random_experts(E, H, I, seed=E + 3)
    per_expert = expert_bytes(ex)
    for T in Ts:
        xs = [torch.randn(T, H, device=DEV).bfloat16() for _ in range(R)]
        routes = routings(T, E, seed=T)
        touched = statistics.mean(int(torch.unique(ids).numel()) for _, ids in routes)
        mb = touched * per_expert / 1e6
        base = dict(E=E, T=T, experts_touched=touched, mb_touched=round(mb, 1),
                    floor_us=mb / COPY_TBS, target_us=mb / (0.7 * COPY_TBS))
        shipped = shipped_variant(T, E)
        for name, make in makers(T, E, ex).items():
            try:
                runs = [make(x, w, i) for x, (w, i) in zip(xs, routes)]
                us = graph_us(runs)
            except Exception as exc:  # noqa: BLE001 - record and go on with the other variants
                res.add(section="small_graph", variant=name, error=repr(exc)[:300], **base)
                continue
            extra = dict(splits=[runs[0].s1, runs[0].s2], fused=runs[0].fused) if name.startswith("split_") else {}
            res.add(section="small_graph", variant=name, us=us, tbs=mb / us, frac_copy=mb / us / COPY_TBS,
                    shipped=name == shipped, **extra, **base)
            if name in (shipped, "old_small"):
                res.add(section="small_eager", variant=name, us_host_bound=median_ms(runs[0]) * 1e3, **base)
            if name.startswith("split_") and T <= 2:  # per-stage GPU time, each stage alone in its graph
                for stage in ("plan", "gate_up", "down", "combine"):
                    if stage in ("gate_up", "down") or not runs[0].fused:
                        res.add(section="small_stage", variant=name, stage=stage,
                                us=graph_us([getattr(r, stage) for r in runs]), **base)
            del runs
        res.write(out_dir)


def run_floor(res: Results) -> None:
    """The T = 1 floor on 20B-shaped experts with the sweep's T = 1 routings (floor_small.py)."""
    from floor_small import floor

    ex = random_experts(32, H, I, seed=35)
    floor(res, ex, routings(1, 32, seed=1), graph_us, COPY_TBS)
    del ex


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--ts", default="", help="token counts to time, e.g. 1,2 (default: all, or --quick's)")
    ap.add_argument("--jobs", type=int, default=14, help="compile worker processes (0: compile while timing)")
    ap.add_argument("--floor", action="store_true", help="first the T = 1 floor (floor_small.py)")
    ap.add_argument("--shipped", action="store_true",
                    help="time only the tiles the registered op picks (at E = 32 and 128) beside the aligned path")
    args = ap.parse_args()
    res = Results("moe-small")
    a = torch.empty(1 << 30, dtype=torch.uint8, device=DEV)
    b = torch.empty_like(a)
    ms = median_ms(lambda: b.copy_(a))
    res.add(section="ceiling", name="copy_1GiB", ms=ms, tbs=2 * a.numel() / ms / 1e9)
    del a, b
    Ts = tuple(int(t) for t in args.ts.split(",")) if args.ts else (1, 4, 16, 64) if args.quick else \
        (1, 2, 4, 8, 16, 32, 64)
    if args.shipped:   # through the environment, so the compile workers (spawned) see the same selection
        for T in Ts:
            os.environ[f"MOE_SMALL_VARIANTS_T{T}"] = ",".join(
                sorted({shipped_variant(T, E).removeprefix("split_") for E in (32, 128)}))
    if args.jobs:
        # E = 128 launches the same kernels as E = 32 (no constexpr depends on E): compiled once
        jobs = [(32, 0)] if args.floor else []
        # one job per (T, configuration): the workers compile in parallel (one per T took ~25 s for 10 variants)
        jobs += [(32, T, name) for T in Ts for name in makers(T, 32, None)]
        res.section("precompile", precompile, jobs, args.jobs)
    if args.floor:
        res.section("floor", run_floor)
    res.section("sweep_E32", sweep, 32, Ts, args.out)
    res.section("sweep_E128", sweep, 128, Ts, args.out)
    print("wrote", res.write(args.out), "errors:", len(res.errors))
    return 0


if __name__ == "__main__":
    sys.exit(main())
