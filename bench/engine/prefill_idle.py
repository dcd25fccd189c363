"""Where the 20B prefill forward's GPU idle comes from (bench/NOTES.md, session 6 lead).

Three measurements of one 8192-token prefill on the engine's model runner, same model build:
  plain      the bench's timing: CUDA events around ``runner.run`` (host prep + launches + GPU work);
  host_ahead a ``torch.cuda._sleep`` kernel is queued first, so the host enqueues the whole forward while
             the GPU sleeps; events recorded after the sleep then time the GPU work alone, unless the
             forward syncs (then ``host_s`` ~ the sleep and the gain vanishes);
  breakdown  ``OpProfiler`` with the top idle gaps, the host lead before the first kernel and the tail.
Writes JSON (commit, GPU, date from bench/steps.sh's environment) to --json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch

from dayzero.bench import _kv, random_model
from dayzero.bench_breakdown import OpProfiler
from dayzero.config import preset
from dayzero.runtime.model_runner import ModelRunner, SeqChunk


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="20b")
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--sleep-ms", type=float, default=300.0)
    ap.add_argument("--json", required=True)
    a = ap.parse_args()
    cfg = preset(a.model)
    model = random_model(cfg, "fp8", "triton", "cuda", 0, a.tokens + 16)
    kv = _kv(model, 1, a.tokens)
    runner = ModelRunner(model, kv)
    ids = torch.randint(0, cfg.vocab_size, (a.tokens,), generator=torch.Generator().manual_seed(0)).tolist()
    clock_hz = 1.98e9    # H200 boost clock: the sleep only needs to outlast the host's enqueueing

    def once(sleep_ms: float) -> dict:
        kv.ensure("p", a.tokens)
        torch.cuda.synchronize()
        if sleep_ms:
            torch.cuda._sleep(int(sleep_ms * 1e-3 * clock_hz))
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        t0 = time.perf_counter()
        runner.run([SeqChunk("p", ids, 0, "last")])
        host = time.perf_counter() - t0
        e1.record()
        torch.cuda.synchronize()
        kv.free("p")
        return {"gpu_s": e0.elapsed_time(e1) / 1e3, "host_s": host}

    once(0)
    res: dict = {"meta": {"commit": os.environ.get("DAYZERO_COMMIT", "unknown"), "gpu": torch.cuda.get_device_name(0),
                          "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())},
                 "model": a.model, "tokens": a.tokens}
    for name, sl in (("plain", 0.0), ("host_ahead", a.sleep_ms), ("plain_again", 0.0)):
        rows = [once(sl) for _ in range(a.repeat)]
        res[name] = {"gpu_s": statistics.median(r["gpu_s"] for r in rows),
                     "host_s": statistics.median(r["host_s"] for r in rows), "sleep_ms": sl, "rows": rows}
        print(name, {k: v for k, v in res[name].items() if k != "rows"}, flush=True)
    bd = OpProfiler(model, "profile").run(lambda: once(0))
    res["breakdown_ms"], res["breakdown_check"] = bd.to_json(), bd.summary(res["plain"]["gpu_s"] * 1e3)
    from dayzero.bench_breakdown import print_breakdown
    print_breakdown(res["breakdown_ms"], res["breakdown_check"])
    with open(a.json, "w", encoding="utf-8") as f:
        json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
