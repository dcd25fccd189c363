"""Causal prefill variants timed beside the shipped default in one process (issue 5: >= FlashInfer fa3).

    PYTHONPATH=shared python3 bench/attention/prefill_exp.py --out DIR [--n 8192,32768,131072]
    PYTHONPATH=shared python3 bench/attention/prefill_exp.py --warmup-only   # compile every variant first

Variants: ``prefill_variants.VARIANTS`` (configs of triton_attention_prefill.py: tile shapes, stages,
register caps; session 4's run 1 also timed exp / rescale variants since removed). Shape: one sequence, 64 query /
8 KV heads, head dim 64, sinks, bf16; plus a chunked row (new tokens after a paged prefix). Each variant's
output is NaN-poisoned, checked finite everywhere and against the fp32 reference on its first and last
256 rows, then timed (do_bench median, L2 flushed; 128k: CUDA events, median of 3 after one warm-up).
The default is timed first and again last (``default@end``: drift within the call).
``--warmup-only`` compiles every variant for the timed shapes in parallel processes (Triton's on-disk
cache), so the timing run compiles nothing. JSON: ``<out>/prefill_exp.json`` (meta: commit, GPU, date).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys
import traceback

import torch

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from attn_common import HQ, D, run_meta, single_sequence, sink_reference_rows, prefill_time_ms  # noqa: E402
from prefill_variants import VARIANTS  # noqa: E402

SCALE = D ** -0.5
CHUNKED = (4096, 28672)  # new tokens, paged prefix


def _call(p: dict, cfg: dict, out: torch.Tensor, n: int):
    from dayzero.kernels.triton_attention import attention
    os.environ["DAYZERO_PREFILL_GLUON"] = "0"   # the Triton kernel's variants, not the Gluon path of the op
    return attention(p["q"], p["k"], p["v"], p["k_cache"], p["v_cache"], p["block_tables"], p["cu_seqlens_q"],
                     p["cached_lens"], p["sinks"], SCALE, 0, max_seqlen_q=n, out=out,
                     config=dict(KERNEL="flash", **cfg))


def _warm(name: str) -> str:
    """Compile one variant for both timed specialisations (no prefix: table stride 1; paged prefix)."""
    try:
        for n, cached in ((1024, 0), (256, 4096)):
            p = single_sequence(n, cached)
            _call(p, VARIANTS[name], torch.empty_like(p["q"]), n)
        torch.cuda.synchronize()
        return f"{name}: ok"
    except Exception as e:  # noqa: BLE001 - reported, the timing run reports it again
        return f"{name}: {type(e).__name__}: {str(e)[:200]}"


def warmup(names: list[str], workers: int) -> None:
    import multiprocessing as mp
    with mp.get_context("spawn").Pool(workers) as pool:
        for line in pool.imap_unordered(_warm, names):
            print("warmup", line, flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=".")
    ap.add_argument("--n", default="8192,32768,131072")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--no-chunked", action="store_true")
    ap.add_argument("--warmup-only", action="store_true")
    ap.add_argument("--workers", type=int, default=6)
    a = ap.parse_args()
    names = a.variants.split(",")
    if a.warmup_only:
        warmup(names, a.workers)
        return 0
    out_dir = pathlib.Path(a.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    doc = dict(meta=run_meta(), variants={k: VARIANTS[k] for k in names}, rows=[], errors=[])
    cases = [(int(x), 0) for x in a.n.split(",")] + ([] if a.no_chunked else [CHUNKED])
    for n, cached in cases:
        p = single_sequence(n, cached, seed=n)
        flops = 4 * D * HQ * (n * cached + n * (n + 1) / 2)
        refs = []
        if cached == 0:
            rows = [slice(0, 256), slice(n - 256, n)]
            refs = [(sl, sink_reference_rows(p["q"], p["k"], p["v"], p["sinks"], sl, 0, SCALE)) for sl in rows]
        for name in names + ["default@end"]:
            cfg = VARIANTS[name.split("@")[0]]
            out = torch.full_like(p["q"], float("nan"))
            try:
                _call(p, cfg, out, n)
                torch.cuda.synchronize()
                written = bool(torch.isfinite(out).all())
                err = max((float((out[sl].float() - r).norm() / r.norm()) for sl, r in refs), default=float("nan"))
                fn = lambda: _call(p, cfg, out, n)  # noqa: E731
                ms = prefill_time_ms(fn, n)
                r = dict(n=n, cached=cached, impl=name, ms=ms, tflops=flops / (ms * 1e-3) / 1e12, rel_err=err,
                         all_written=written)
                doc["rows"].append(r)
                print(f"N={n:>6} cached={cached:>5} {name:<18} {ms:9.3f} ms {r['tflops']:6.1f} TF/s "
                      f"err {err:.2e} written {written}", flush=True)
            except Exception as e:  # noqa: BLE001 - one variant's failure keeps the others
                doc["errors"].append(dict(n=n, impl=name, error=f"{type(e).__name__}: {str(e)[:400]}",
                                          trace=traceback.format_exc()[-1500:]))
                print(f"N={n:>6} {name:<18} FAILED {type(e).__name__}: {str(e)[:200]}", flush=True)
            (out_dir / "prefill_exp.json").write_text(json.dumps(doc, indent=1))
        del p
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
