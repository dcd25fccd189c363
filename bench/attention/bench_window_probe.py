"""Window prefill probe: the window kernel's variants (pointer loads, gather branch, TMA)
timed three ways at prompts and chunks of several sizes: GPU time (CUDA-graph replay), host time per
call (enqueue only) and do_bench (what an eager caller sees), with the fp32 error of the last rows."""

from __future__ import annotations

import time

import torch

from attn_common import D, graph_time_ms, single_sequence, sink_reference_rows, time_ms

from dayzero.kernels.triton_attention import attention

SCALE = D ** -0.5
WINDOW = 128


def bench_window_probe(rows):
    """The window kernel's variants: GPU time (graph replay), host time
    per call (enqueue only) and do_bench time, for prompts and chunks of several sizes."""
    res = []
    plan = [(4096, 0), (8192, 0), (32768, 0), (512, 24576)]
    cfgs = {"window_ptr": dict(KERNEL="window", TMA=False),
            "window_branch": dict(KERNEL="window", TMA=False, GATHER_BRANCH=True),
            "window_tma": dict(KERNEL="window", TMA=True, TMA_MIN_TOKENS=0)}
    for n, cached in plan:
        c = single_sequence(n, cached=cached, seed=n + 1)
        args = (c["q"], c["k"], c["v"], c["k_cache"], c["v_cache"], c["block_tables"], c["cu_seqlens_q"],
                c["cached_lens"], c["sinks"], SCALE, WINDOW)
        out = torch.empty_like(c["q"])
        line = []
        for name, cfg in cfgs.items():
            fn = lambda cfg=cfg: attention(*args, max_seqlen_q=n, config=cfg, out=out)  # noqa: E731
            try:
                gpu_ms = graph_time_ms([fn])
                fn()
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                for _ in range(50):
                    fn()
                host_us = (time.perf_counter() - t0) / 50 * 1e6
                torch.cuda.synchronize()
                bench_ms = time_ms(fn)
            except Exception as e:
                res.append(dict(kind="error", section="window_probe", config=name, n=n, error=f"{type(e).__name__}: {e}"))
                continue
            r = dict(kind="window_probe", n=n, cached=cached, config=name, gpu_us=gpu_ms * 1e3, host_us=host_us,
                     do_bench_us=bench_ms * 1e3)
            if cached == 0:
                ref_rows = slice(max(0, n - 256), n)
                ref = sink_reference_rows(c["q"], c["k"], c["v"], c["sinks"], ref_rows, WINDOW, SCALE)
                r["rel_err"] = float((out[ref_rows].float() - ref).norm() / ref.norm())
            res.append(r)
            line.append(f"{name} gpu {r['gpu_us']:7.1f} host {host_us:6.1f} bench {r['do_bench_us']:7.1f}")
        rows.append(f"window probe N={n:>6} cached={cached:>5}: " + " | ".join(line))
        del c, out
        torch.cuda.empty_cache()
    return res
