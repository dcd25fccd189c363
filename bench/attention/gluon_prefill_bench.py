"""Time the Gluon ping-pong prefill (``gluon_attention_prefill``, opt-in) beside the shipped Triton
``triton_attention_prefill.prefill_attention`` (its default config) in one process (issue 5).

    PYTHONPATH=shared python3 bench/attention/gluon_prefill_bench.py --out DIR [--n 8192,32768,131072]
        [--configs pp2,pp2_s3,...] [--registered CFG] [--rounds R]

Shape: one sequence of n new tokens, no cached prefix, 64 query / 8 KV heads, head dim 64, sinks N(0, 2),
bf16 (``attn_common.single_sequence``). Each implementation's output is NaN-poisoned, checked finite
everywhere and against the fp32 reference on its first and last 256 rows, then timed (do_bench median,
L2 flushed; 128k: CUDA events, median of 3 after one warm-up). The Triton default runs first and again
last (``triton@end``: drift within the call). A failing configuration is recorded and the others go on.
JSON: ``<out>/gluon_prefill.json`` (meta: commit, GPU, date from ``attn_common.run_meta``).
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
from attn_common import D, HKV, HQ, run_meta, single_sequence, sink_reference_rows, prefill_time_ms  # noqa: E402

SCALE = D ** -0.5
GLUON_ENV = "DAYZERO_PREFILL_GLUON"   # = triton_attention_prefill.GLUON_ENV (imported lazily there)


def _impl(name: str, p: dict, out: torch.Tensor, n: int):
    """A zero-argument call of implementation ``name`` into ``out``: 'triton' (the shipped kernel), a Gluon
    config name, or the registered op (``triton_attention.attention``, as flashinfer_compare.py calls it)
    with DAYZERO_PREFILL_GLUON=cfg: 'reg@cfg' without max_seqlen_k (the host checks cached_lens: one sync
    per call), 'reg0@cfg' with max_seqlen_k=0 (as the engine passes it; no sync). The caller sets the
    environment variable for 'reg' rows."""
    if name.startswith("reg"):
        from dayzero.kernels.triton_attention import attention
        kw = dict(max_seqlen_k=0) if name.startswith("reg0@") else {}
        return lambda: attention(p["q"], p["k"], p["v"], p["k_cache"], p["v_cache"], p["block_tables"],
                                 p["cu_seqlens_q"], p["cached_lens"], p["sinks"], SCALE, 0, max_seqlen_q=n, out=out,
                                 **kw)
    if name.split("@")[0] == "triton":
        from dayzero.kernels.triton_attention_prefill import prefill_attention as triton_prefill
        return lambda: triton_prefill(p["q"], p["k"], p["v"], p["k_cache"], p["v_cache"], p["block_tables"],
                                      p["cu_seqlens_q"], p["cached_lens"], p["sinks"], SCALE, 0, n, out)
    from dayzero.kernels.gluon_attention_prefill import CONFIGS, prefill_attention as gluon_prefill
    cfg = CONFIGS[name.split("#")[0]]
    # the prefix check syncs with the device: done once here, not in the timed call
    gluon_prefill(p["q"], p["k"], p["v"], p["k_cache"], p["v_cache"], p["block_tables"], p["cu_seqlens_q"],
                  p["cached_lens"], p["sinks"], SCALE, 0, n, out, config=cfg, check_prefix=True)
    return lambda: gluon_prefill(p["q"], p["k"], p["v"], p["k_cache"], p["v_cache"], p["block_tables"],
                                 p["cu_seqlens_q"], p["cached_lens"], p["sinks"], SCALE, 0, n, out, config=cfg,
                                 check_prefix=False)


def main() -> int:
    from dayzero.kernels.gluon_attention_prefill import RUN_CONFIGS

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=".")
    ap.add_argument("--n", default="8192,32768,131072")
    ap.add_argument("--configs", default=",".join(RUN_CONFIGS))
    ap.add_argument("--registered", default="", help="Gluon config: also time the registered op with it "
                    "selected (reg@cfg: as flashinfer_compare.py calls it; reg0@cfg: max_seqlen_k=0)")
    ap.add_argument("--rounds", type=int, default=1, help="time every row this many times (spread)")
    a = ap.parse_args()
    out_dir = pathlib.Path(a.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    reg = [f"reg@{a.registered}", f"reg0@{a.registered}"] if a.registered else []
    names = ["triton"]
    for r in range(1, a.rounds + 1):   # round r > 1: the same rows again ('#r'), between Triton rows
        names += [x + (f"#{r}" if r > 1 else "") for x in a.configs.split(",") + reg]
        names.append("triton@end" if r == a.rounds else f"triton@{r}")
    doc = dict(meta=run_meta(), shape=dict(hq=HQ, hkv=HKV, d=D, sinks=True, cached=0), rows=[], errors=[])
    for n in (int(x) for x in a.n.split(",")):
        p = single_sequence(n, 0, seed=n)
        flops = 4 * D * HQ * n * (n + 1) / 2
        rows = [slice(0, 256), slice(n - 256, n)]
        refs = [(sl, sink_reference_rows(p["q"], p["k"], p["v"], p["sinks"], sl, 0, SCALE)) for sl in rows]
        for name in names:
            out = torch.full_like(p["q"], float("nan"))
            # reg rows: the registered op with that Gluon config; every other row calls its kernel directly
            # (the Triton rows with the op's Gluon path off)
            os.environ[GLUON_ENV] = name.split("@")[1].split("#")[0] if name.startswith("reg") else "0"
            try:
                fn = _impl(name, p, out, n)
                out.fill_(float("nan"))
                fn()
                torch.cuda.synchronize()
                written = bool(torch.isfinite(out).all())
                err = max(float((out[sl].float() - r).norm() / r.norm()) for sl, r in refs)
                ms = prefill_time_ms(fn, n)
                r = dict(n=n, impl=name, ms=ms, tflops=flops / (ms * 1e-3) / 1e12, rel_err=err, all_written=written)
                doc["rows"].append(r)
                print(f"N={n:>6} {name:<24} {ms:9.3f} ms {r['tflops']:6.1f} TF/s err {err:.2e} written {written}",
                      flush=True)
            except Exception as e:  # noqa: BLE001 - one configuration's failure keeps the others
                doc["errors"].append(dict(n=n, impl=name, error=f"{type(e).__name__}: {str(e)[:400]}",
                                          trace=traceback.format_exc()[-1500:]))
                print(f"N={n:>6} {name:<24} FAILED {type(e).__name__}: {str(e)[:200]}", flush=True)
            (out_dir / "gluon_prefill.json").write_text(json.dumps(doc, indent=1))
        del p, refs
        torch.cuda.empty_cache()
    return 0 if not doc["errors"] else 1


if __name__ == "__main__":
    sys.exit(main())
