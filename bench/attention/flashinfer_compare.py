"""FlashInfer's attention-sink wrapper beside our Triton attention, same run, same shapes (issue 5).

    source bench/peers_install.sh   # FlashInfer 0.7.2.post1 from the carried wheels
    PYTHONPATH=shared:$PYTHONPATH python3 bench/attention/flashinfer_compare.py --out DIR [--budget-s 240]
    python3 bench/attention/flashinfer_compare.py --save DIR/flashinfer.json   # -> bench/results/

Shapes of bench/attention (bf16, head dim 64, 64 query / 8 KV heads, page 16, sinks N(0, 2), shuffled
pages). FlashInfer: ``BatchAttentionWithAttentionSinkWrapper`` (backend fa2 and fa3), ``plan(qo_indptr,
kv_indptr, kv_indices, last_page_len, 64, 8, 64, 16, causal=True, window_left=W-1)`` then
``run(q, (k_cache, v_cache), sinks_fp32, 1/8)``; it reads every key from the paged cache. Ours: the
registered Triton ``attention`` (shipped default config) on the same data.

1. JIT builds of the four FlashInfer variants (fa2/fa3 x full/sliding) in parallel processes sharing
   FlashInfer's JIT cache (``--jit-workers``); timing starts after them.
2. Check on small ragged cases (prefill and decode): FlashInfer and ours vs the torch reference op.
   The window convention is taken from the check (``window_left`` W-1, else W).
3. Causal prefill at 8k / 32k (then 128k last), window 128 at 8k / 32k: ms and TFLOP/s (useful FLOPs,
   as bench_attention), do_bench median. Decode B in {1, 8, 64, 256} x ctx {1k, 8k, 32k}: us and TB/s
   on the KV bytes, CUDA-graph replay rotating over distinct KV memory (FlashInfer: planned once with
   ``use_cuda_graph=True``; eager do_bench if its capture fails, recorded as ``method``).
``--budget-s`` (and $DAYZERO_DEADLINE) stop it gracefully: cases not reached are listed in
``skipped``. Every part records its own failure and the rest goes on. JSON (rewritten after each part):
``<out>/flashinfer.json`` with meta (commit, GPU, date, FlashInfer version).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys
import time
import traceback

import torch

HERE = pathlib.Path(__file__).resolve().parent
HQ, HKV, D, BS, WINDOW = 64, 8, 64, 16, 128
SCALE = D ** -0.5
VARIANTS = [(b, w) for b in ("fa2", "fa3") for w in (0, WINDOW)]


def paged_args(tables: list[torch.Tensor], kv_lens: list[int], page: int = BS):
    """Per-sequence page lists -> FlashInfer's (kv_indptr, kv_indices, last_page_len), int32."""
    nblk = [-(-n // page) for n in kv_lens]
    if any(n <= 0 for n in kv_lens) or any(len(t) < b for t, b in zip(tables, nblk)):
        raise ValueError("every sequence needs >= 1 token and a page per 16 of them")
    indptr = torch.tensor([0] + nblk, dtype=torch.int32).cumsum(0, dtype=torch.int32)
    indices = torch.cat([t[:b].to(torch.int32).cpu() for t, b in zip(tables, nblk)])
    last = torch.tensor([n - page * (b - 1) for n, b in zip(kv_lens, nblk)], dtype=torch.int32)
    return indptr, indices, last


def make_wrapper(fi, backend: str, window: int, workspace: torch.Tensor, graph_bufs: dict | None = None):
    kw = dict(use_cuda_graph=True, **graph_bufs) if graph_bufs else {}
    return fi.BatchAttentionWithAttentionSinkWrapper(
        workspace, "NHD", backend=backend, q_data_type=torch.bfloat16, kv_data_type=torch.bfloat16,
        head_dim_qk=D, head_dim_vo=D, window_left=(WINDOW - 1) if window else -1, **kw)


def plan(wrapper, qo_lens: list[int], tables: list[torch.Tensor], kv_lens: list[int], window_left: int,
         dev: str = "cuda") -> None:
    qo = torch.tensor([0] + qo_lens, dtype=torch.int32).cumsum(0, dtype=torch.int32)
    indptr, indices, last = paged_args(tables, kv_lens)
    wrapper.plan(qo.to(dev), indptr.to(dev), indices.to(dev), last.to(dev), HQ, HKV, D, BS, causal=True,
                 window_left=window_left, q_data_type=torch.bfloat16, kv_data_type=torch.bfloat16)


def ragged_batch(qo_lens: list[int], kv_lens: list[int], seed: int, device: str = "cuda") -> dict:
    """A paged batch: per sequence ``kv_lens[b]`` cached tokens on shuffled pages, the last ``qo_lens[b]``
    of them new; returns the tensors of both calling conventions."""
    g = torch.Generator(device=device).manual_seed(seed)
    nblk = [-(-n // BS) for n in kv_lens]
    pool = sum(nblk) + 5
    kc = torch.randn(pool, BS, HKV, D, device=device, generator=g).bfloat16()
    vc = torch.randn(pool, BS, HKV, D, device=device, generator=g).bfloat16()
    perm = torch.randperm(pool, device=device, generator=g)
    tables, o = [], 0
    for b in nblk:
        tables.append(perm[o:o + b].to(torch.int32))
        o += b
    bt = torch.zeros(len(nblk), max(nblk), dtype=torch.int32, device=device)
    k_new, v_new = [], []
    for i, (t, L, n) in enumerate(zip(tables, kv_lens, qo_lens)):
        bt[i, :len(t)] = t
        pos = torch.arange(L - n, L, device=device)
        k_new.append(kc[t.long()[pos // BS], pos % BS])
        v_new.append(vc[t.long()[pos // BS], pos % BS])
    q = torch.randn(sum(qo_lens), HQ, D, device=device, generator=g).bfloat16()
    sinks = torch.randn(HQ, device=device, generator=g) * 2
    cu = torch.tensor([0] + qo_lens, dtype=torch.int32, device=device).cumsum(0, dtype=torch.int32)
    cached = torch.tensor([L - n for L, n in zip(kv_lens, qo_lens)], dtype=torch.int32, device=device)
    return dict(q=q, k=torch.cat(k_new), v=torch.cat(v_new), kc=kc, vc=vc, tables=tables, bt=bt, cu=cu,
                cached=cached, sinks=sinks)


def _build_variant(variant: tuple[str, int], jobs: int = 0) -> dict:
    """Child process: construct one wrapper, which JIT-builds (or loads) its module (``jobs`` nvcc jobs)."""
    backend, window = variant
    t0 = time.perf_counter()
    if jobs:
        os.environ.setdefault("MAX_JOBS", str(jobs))   # the parallel builds share the host's cores
    try:
        import flashinfer

        make_wrapper(flashinfer, backend, window, torch.empty(1 << 20, dtype=torch.uint8, device="cuda"))
        torch.cuda.synchronize()
        return dict(backend=backend, window=window, ok=True, seconds=time.perf_counter() - t0)
    except Exception as e:  # noqa: BLE001 - reported to the parent
        return dict(backend=backend, window=window, ok=False, seconds=time.perf_counter() - t0,
                    error=f"{type(e).__name__}: {str(e)[-1500:]}")


class Run:
    """Results, errors and the deadline of one comparison; ``part`` isolates failures."""

    def __init__(self, out: pathlib.Path, deadline: float) -> None:
        self.out, self.deadline = out, deadline
        self.doc: dict = dict(meta={}, builds=[], checks=[], results=[], errors=[], skipped=[], table=[])

    def left(self) -> float:
        return self.deadline - time.time()

    def row(self, **r) -> None:
        self.doc["results"].append(r)

    def say(self, line: str) -> None:
        self.doc["table"].append(line)
        print(line, flush=True)

    def part(self, name: str, fn, *a) -> None:
        try:
            fn(*a)
        except Exception as e:  # noqa: BLE001 - keep every other part's numbers
            self.doc["errors"].append(dict(part=name, error=f"{type(e).__name__}: {e}",
                                           trace=traceback.format_exc()[-2500:]))
            self.say(f"[{name}] FAILED: {type(e).__name__}: {str(e)[:300]}")
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        self.write()

    def write(self) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / "flashinfer.json").write_text(json.dumps(self.doc, indent=1))


def build_all(run: Run, workers: int, build_s: float | None = None) -> None:
    """JIT-build the variants in parallel processes; each finished build counts even if others run
    out of time (``build_s`` caps the builds, else the run's budget minus 60 s for the timings)."""
    import multiprocessing as mp

    t0 = time.perf_counter()
    stop = time.time() + (build_s if build_s is not None else max(10.0, run.left() - 60))
    try:
        n = max(1, min(workers, len(VARIANTS)))
        jobs = max(2, (os.cpu_count() or 8) // n)
        pool = mp.get_context("spawn").Pool(n)
        try:
            pending = [(v, pool.apply_async(_build_variant, (v, jobs))) for v in VARIANTS]
            res = []
            for (b, w), job in pending:
                try:
                    res.append(job.get(timeout=max(0.1, stop - time.time())))
                except mp.TimeoutError:
                    res.append(dict(backend=b, window=w, ok=False, seconds=time.perf_counter() - t0,
                                    error="build timed out (budget)"))
        finally:
            pool.terminate()
            pool.join()
    except Exception as e:  # noqa: BLE001 - no worker processes: build here, one by one, while budget lasts
        run.doc["errors"].append(dict(part="build pool", error=f"{type(e).__name__}: {e}"))
        res = [_build_variant(v) if run.left() > 180 else
               dict(backend=v[0], window=v[1], ok=False, error="not built (budget)") for v in VARIANTS]
    run.doc["builds"] = res
    run.doc["build_wall_s"] = time.perf_counter() - t0
    for r in res:
        run.say(f"build {r['backend']} window={r['window']}: {'ok' if r['ok'] else 'FAILED'} "
                f"{r.get('seconds', 0):.1f} s {r.get('error', '')[:200]}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--budget-s", type=float, default=420.0, help="stop starting new cases after this long")
    ap.add_argument("--jit-workers", type=int, default=4)
    ap.add_argument("--backends", default="fa2,fa3")
    ap.add_argument("--no-128k", action="store_true")
    ap.add_argument("--decode", default="all",
                    help="decode cases: all, or B:ctx pairs (e.g. 1:32768,256:131072); a short list runs 128k prefill first")
    ap.add_argument("--build-s", type=float, default=None, help="cap of the JIT builds (default: budget - 60 s)")
    ap.add_argument("--build-only", action="store_true",
                    help="JIT-build the variants and stop (a later run loads them from FlashInfer's cache)")
    ap.add_argument("--save", metavar="JSON", help="copy a device run's flashinfer.json into --results-dir")
    ap.add_argument("--results-dir", default=str(HERE.parent / "results"))
    a = ap.parse_args()
    if a.save:
        doc = json.loads(pathlib.Path(a.save).read_text())
        stamp = doc["meta"]["date_utc"].replace(":", "").replace("+0000", "Z").replace("+00:00", "Z")
        dst = pathlib.Path(a.results_dir) / f"flashinfer-{stamp}.json"
        dst.write_text(json.dumps(doc, indent=1) + "\n")
        print(dst)
        return 0
    deadline = time.time() + a.budget_s
    if os.environ.get("DAYZERO_DEADLINE", "").isdigit():
        deadline = min(deadline, int(os.environ["DAYZERO_DEADLINE"]) - 5)
    run = Run(pathlib.Path(a.out), deadline)
    sys.path.insert(0, str(HERE))
    import fi_cases  # noqa: E402 - needs CUDA, triton and the project on the path

    run.part("meta", fi_cases.meta, run)
    run.part("build", build_all, run, a.jit_workers, a.build_s)
    if a.build_only:
        (run.out / "flashinfer.json").rename(run.out / "flashinfer-build.json")
        return 0 if all(b.get("ok") for b in run.doc["builds"]) else 1
    backends = [b for b in a.backends.split(",") if b]
    run.part("check", fi_cases.check, run, backends)
    grid = fi_cases.DECODE_GRID if a.decode == "all" else \
        [tuple(int(v) for v in c.split(":")) for c in a.decode.split(",") if c]
    fi_cases.timings(run, backends, with_128k=not a.no_128k, decode_grid=grid)
    run.write()
    print(f"wrote {run.out / 'flashinfer.json'} ({len(run.doc['errors'])} errors, {len(run.doc['skipped'])} skipped)")
    return 0 if not run.doc["errors"] else 1


if __name__ == "__main__":
    sys.exit(main())
