"""Time the Gluon sliding-window prefill (``gluon_attention_window``, opt-in) beside the shipped Triton window
kernel (``triton_attention_window.window_attention``, its default config) in one process (issue 5).

    PYTHONPATH=shared python3 bench/attention/gluon_window_bench.py --out DIR [--n 8192,32768] [--configs w2,w3]

Shape: one sequence of n new tokens, no cached prefix, 64 query / 8 KV heads, head dim 64, window 128, sinks
N(0, 2), bf16 (``attn_common.single_sequence``). Each implementation's output is NaN-poisoned, checked finite
everywhere and against the fp32 reference on its first and last 256 rows, then timed twice: ``ms`` (do_bench
median, L2 flushed: host enqueue included, as the eager op runs) and ``graph_ms`` (one CUDA graph replayed:
GPU time). The floor: Q, K, V read and O written once at the copy bandwidth measured in the same process
(``x_floor`` = graph_ms / floor; issue 5 asks <= 1.5). The Triton kernel runs first and again last
(``triton@end``: drift); ``registered``: the registered op (``triton_attention.attention``, max_seqlen_k 0, as the
engine calls it: its default Gluon configuration, host dispatch included). JSON: ``<out>/gluon_window.json`` (``--json-name``; meta: commit, GPU, date from ``attn_common.run_meta``).
``--diag``: diagnostic configurations (``gluon_attention_window.DIAG_CONFIGS``: wrong output by design, so their
rel_err / all_written say nothing) timed beside the Triton kernel only.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import traceback

import torch

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from attn_common import (D, HKV, HQ, copy_bandwidth, graph_time_ms, prefill_time_ms, run_meta,  # noqa: E402
                         single_sequence, sink_reference_rows)

SCALE = D ** -0.5
WINDOW = 128


def _impl(name: str, p: dict, out: torch.Tensor, n: int):
    """A zero-argument call of ``name`` into ``out``: 'triton' (the shipped window kernel) or a Gluon config."""
    args = (p["q"], p["k"], p["v"], p["k_cache"], p["v_cache"], p["block_tables"], p["cu_seqlens_q"],
            p["cached_lens"], p["sinks"], SCALE, WINDOW, n, out)
    if name.split("@")[0] == "triton":
        from dayzero.kernels.triton_attention_window import window_attention
        return lambda: window_attention(*args)
    if name == "registered":   # the registered op as the engine calls it (its default Gluon configuration)
        from dayzero.kernels.triton_attention import attention
        return lambda: attention(*args[:11], max_seqlen_q=n, max_seqlen_k=0, out=out)
    from dayzero.kernels.gluon_attention_window import CONFIGS, window_attention as gluon_window
    cfg = CONFIGS[name]
    gluon_window(*args, config=cfg, check_prefix=True)     # the prefix check syncs: once here, not timed
    return lambda: gluon_window(*args, config=cfg, check_prefix=False)


def main() -> int:
    from dayzero.kernels.gluon_attention_window import RUN_CONFIGS

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=".")
    ap.add_argument("--n", default="8192,32768")
    ap.add_argument("--configs", default=",".join(RUN_CONFIGS))
    ap.add_argument("--json-name", default="gluon_window.json")
    ap.add_argument("--diag", action="store_true",
                    help="diagnostic configurations (wrong output, timed only): the Triton kernel first, no "
                         "registered / triton@end rows")
    ap.add_argument("--warm", action="store_true",
                    help="only call each configuration once per length (fills the JIT cache beside the tests; "
                         "nothing timed or written)")
    a = ap.parse_args()
    if a.warm:
        for n in (int(x) for x in a.n.split(",")):
            p = single_sequence(n, 0, seed=n)
            for name in a.configs.split(","):
                _impl(name, p, torch.empty_like(p["q"]), n)
            torch.cuda.synchronize()
            del p
        return 0
    out_dir = pathlib.Path(a.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    bw = copy_bandwidth()
    doc = dict(meta=run_meta(), copy_bytes_per_s=bw, shape=dict(hq=HQ, hkv=HKV, d=D, window=WINDOW, sinks=True,
               cached=0), rows=[], errors=[])
    names = ["triton"] + a.configs.split(",") + ([] if a.diag else ["registered", "triton@end"])
    doc["diag"] = a.diag
    for n in (int(x) for x in a.n.split(",")):
        p = single_sequence(n, 0, seed=n)
        floor_ms = n * (2 * HQ + 2 * HKV) * D * 2 / bw * 1e3
        rows = [slice(0, 256), slice(n - 256, n)]
        refs = [(sl, sink_reference_rows(p["q"], p["k"], p["v"], p["sinks"], sl, WINDOW, SCALE)) for sl in rows]
        for name in names:
            out = torch.full_like(p["q"], float("nan"))
            try:
                fn = _impl(name, p, out, n)
                out.fill_(float("nan"))
                fn()
                torch.cuda.synchronize()
                written = bool(torch.isfinite(out).all())
                err = max(float((out[sl].float() - r).norm() / r.norm()) for sl, r in refs)
                ms = prefill_time_ms(fn, n)
                gms = graph_time_ms([fn])
                r = dict(n=n, impl=name, ms=ms, graph_ms=gms, floor_ms=floor_ms, x_floor=gms / floor_ms, rel_err=err,
                         all_written=written)
                doc["rows"].append(r)
                print(f"N={n:>6} {name:<12} {ms * 1e3:8.1f} us eager {gms * 1e3:8.1f} us graph "
                      f"{r['x_floor']:5.2f}x floor ({floor_ms * 1e3:.1f} us) err {err:.2e} written {written}",
                      flush=True)
            except Exception as e:  # noqa: BLE001 - one configuration's failure keeps the others
                doc["errors"].append(dict(n=n, impl=name, error=f"{type(e).__name__}: {str(e)[:400]}",
                                          trace=traceback.format_exc()[-1500:]))
                print(f"N={n:>6} {name:<12} FAILED {type(e).__name__}: {str(e)[:200]}", flush=True)
            (out_dir / a.json_name).write_text(json.dumps(doc, indent=1))
        del p, refs
        torch.cuda.empty_cache()
    return 0 if not doc["errors"] else 1


if __name__ == "__main__":
    sys.exit(main())
