"""``dayzero bench prefill|decode``: end-to-end timings of the engine's forward pass on this device.

    dayzero bench prefill --model 20b --tokens 8192 [--backend triton --dtype fp8 --repeat 5 --breakdown]
    dayzero bench decode  --model 20b --batch 1,64 --context 1024 --steps 32 [--graphs on|off|both]

``--model`` is a preset name (``tiny``, ``20b``, ``120b``: random weights generated directly on the
device with the magnitudes of ``dayzero make-checkpoint``, then quantized by the parameters' own
loaders) or a checkpoint directory. Prefill = one batch-1 forward over the prompt plus the logits of
its last token, timed with CUDA events after a warm-up, median of ``--repeat``; reported with the
cost of 1M input tokens at ``--usd-per-gpu-hour``. Decode = steps of one new token for each of
``batch`` sequences after a ``--context``-token prefill (host-side batch building and greedy
argmax included), tokens/s over ``--steps`` steps; ``--graphs on`` (the default where the engine
uses them: FP8 on a GPU backend) replays the engine's CUDA graph of the step (captured in the
untimed warm-up step, for the batch's bucket), ``off`` runs eagerly, ``both`` gives a row of each.
``--breakdown`` profiles one extra eager run/step (``dayzero.bench_breakdown``): per kernel op (keyed by
op and, for ``linear``, by weight shape) the GPU time of the kernels it launched (torch.profiler,
correct however far the host runs ahead), the host time of the call and the call count, plus the
GPU time outside every op; the sum is printed beside the untimed forward (prefill: the median run;
decode: the timed step, graph or eager). ``--breakdown-mode sync`` times each op between device
syncs instead (a fallback).
Prints a table and writes JSON (``--json PATH``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import statistics
import sys
import time

import torch


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("mode", choices=("prefill", "decode", "all"), help="all: prefill then decode on one model build")
    p.add_argument("--model", default="20b", help="preset (tiny, 20b, 120b: random weights) or checkpoint dir")
    p.add_argument("--backend", default="triton")
    p.add_argument("--dtype", choices=("float32", "bfloat16", "fp8"), default="fp8")
    p.add_argument("--device", default="cuda")
    p.add_argument("--tokens", type=int, default=8192, help="prefill: prompt length")
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--batch", default="1,64", help="decode: comma-separated batch sizes")
    p.add_argument("--context", type=int, default=1024, help="decode: prompt tokens per sequence")
    p.add_argument("--steps", type=int, default=32, help="decode: timed steps")
    p.add_argument("--breakdown", action="store_true", help="per-op time breakdown (one extra eager run)")
    p.add_argument("--breakdown-mode", choices=("profile", "sync"), default="profile",
                   help="profile: kernel time per op from torch.profiler; sync: device sync around each op")
    p.add_argument("--graphs", choices=("auto", "on", "off", "both"), default="auto",
                   help="decode: CUDA graphs (auto: where the engine would use them)")
    p.add_argument("--qkv", choices=("stacked", "three", "both"), default="stacked",
                   help="decode: q/k/v as one stacked GEMM (the engine's default), three GEMMs, or both rows")
    p.add_argument("--usd-per-gpu-hour", type=float, default=3.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None, help="write the results here")


def random_model(cfg, dtype: str, backend: str, device: str, seed: int, max_positions: int):
    """GptOssForEngine on ``device`` with random weights drawn there (magnitudes of random_checkpoint)."""
    from dayzero.model.transformer import GptOssForEngine
    from dayzero.weights import random_checkpoint as rc
    from dayzero.weights.names import engine_scale_param, is_fp8_weight

    model = GptOssForEngine(cfg, dtype=dtype, backend=backend, device=device, max_positions=max_positions)
    H, I = cfg.hidden_size, cfg.intermediate_size
    params = dict(model.named_parameters())
    scales = {engine_scale_param(n) for n in params if is_fp8_weight(n)}
    gen = torch.Generator(device=device).manual_seed(seed)
    for name, p in params.items():
        if name in scales:
            continue  # filled by the weight's loader when it quantizes
        if p.dtype == torch.float8_e4m3fn and p.dim() == 3:  # experts: one expert at a time (120B fits)
            from dayzero.weights import fp8

            std = (rc.GATE_UP_STD / math.sqrt(H)) if name.endswith("gate_up_proj") else rc.DOWN_STD / math.sqrt(I)
            sp = params[engine_scale_param(name)]
            for e in range(p.shape[0]):
                q, s = fp8.quantize_weight_block(torch.randn(p.shape[1:], device=device, generator=gen) * std)
                p.data[e].copy_(q)
                sp.data[e].copy_(s)
            continue
        full = list(p.shape)
        if "mlp.experts." in name:
            full[0] = cfg.num_local_experts
        if name.endswith("gate_up_proj"):
            std, mean = rc.GATE_UP_STD / math.sqrt(H), 0.0
        elif name.endswith("down_proj"):
            std, mean = rc.DOWN_STD / math.sqrt(I), 0.0
        elif name.endswith("layernorm.weight") or name == "model.norm.weight":
            std, mean = 0.1, 1.0
        elif name == "model.embed_tokens.weight" or name.endswith("sinks"):
            std, mean = 1.0, 0.0
        elif name == "lm_head.weight":
            std, mean = rc.LM_HEAD_STD / math.sqrt(H), 0.0
        elif name.endswith("bias"):
            std, mean = 0.1, 0.0
        elif name.endswith("o_proj.weight"):
            std, mean = rc.O_PROJ_STD / math.sqrt(full[-1]), 0.0
        else:
            std, mean = 1.0 / math.sqrt(full[-1]), 0.0
        t = (torch.randn(full, device=device, generator=gen) * std + mean).to(torch.bfloat16)
        p.weight_loader(t, None)
        del t
    return model


def build_model(args, max_positions: int):
    if os.path.isdir(args.model):
        from dayzero.weights.loader import load_model

        return load_model(args.model, dtype=args.dtype, backend=args.backend, device=args.device,
                          max_positions=max_positions)
    from dayzero.config import preset

    return random_model(preset(args.model), args.dtype, args.backend, args.device, args.seed, max_positions)


def _kv(model, seqs: int, tokens: int):
    from dayzero.kvcache import KVCacheManager
    from dayzero.kvcache.pool import KVCacheSpec

    spec = KVCacheSpec.from_model(model.cfg, 16, model.act_dtype)
    return KVCacheManager(spec, seqs * math.ceil(tokens / 16) + 8, max_seqs=seqs, device=model.device)


def _breakdown(model, run_once, untimed_ms: float, mode: str) -> dict:
    """Per-op breakdown of one ``run_once()``; a failure is recorded in the row, not raised."""
    from dayzero.bench_breakdown import OpProfiler

    try:
        bd = OpProfiler(model, mode).run(run_once)
        return {"breakdown_ms": bd.to_json(), "breakdown_check": bd.summary(untimed_ms)}
    except Exception as e:  # noqa: BLE001 - the timing rows stay useful without the breakdown
        return {"breakdown_error": f"{type(e).__name__}: {e}"}


def bench_prefill(model, tokens: int, repeat: int, breakdown: bool | str, usd: float, seed: int) -> dict:
    from dayzero.runtime.model_runner import ModelRunner, SeqChunk

    kv = _kv(model, 1, tokens)
    runner = ModelRunner(model, kv)
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, model.cfg.vocab_size, (tokens,), generator=g).tolist()

    cuda = model.device.type == "cuda"

    def once() -> float:
        kv.ensure("p", tokens)
        if cuda:
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
        t0 = time.perf_counter()
        runner.run([SeqChunk("p", ids, 0, "last")])
        if cuda:
            e1.record()
            torch.cuda.synchronize()
        dt = e0.elapsed_time(e1) / 1e3 if cuda else time.perf_counter() - t0
        kv.free("p")
        return dt

    once()  # warm-up: compiles kernels, pads weights into derived copies
    times = [once() for _ in range(repeat)]
    sec = statistics.median(times)
    res = {"mode": "prefill", "tokens": tokens, "seconds": sec, "all_seconds": times,
           "tokens_per_s": tokens / sec, "usd_per_1m_input_tokens": sec * usd / 3600 * 1e6 / tokens}
    if breakdown:
        res.update(_breakdown(model, once, sec * 1e3, breakdown if isinstance(breakdown, str) else "profile"))
    return res


def bench_decode(model, batch: int, context: int, steps: int, seed: int, breakdown: bool | str = False,
                 graphs: bool = False) -> dict:
    from dayzero.runtime.cuda_graph import DEFAULT_BUCKETS
    from dayzero.runtime.model_runner import ModelRunner, SeqChunk

    kv = _kv(model, batch, context + steps + 3)          # + warm-up step, breakdown step (and its retry)
    bucket = next((b for b in DEFAULT_BUCKETS if b >= batch), batch)
    runner = ModelRunner(model, kv, cuda_graphs=graphs, graph_buckets=(bucket,), max_model_len=context + steps + 3)
    g = torch.Generator().manual_seed(seed)
    seqs = [f"d{i}" for i in range(batch)]
    last = []
    group = max(1, 8192 // context)
    for s0 in range(0, batch, group):  # prefill the contexts a few sequences at a time
        chunk = []
        for s in seqs[s0:s0 + group]:
            kv.ensure(s, context + steps + 3)
            chunk.append(SeqChunk(s, torch.randint(0, model.cfg.vocab_size, (context,), generator=g).tolist(), 0))
        last += [int(lg.argmax()) for lg in runner.run(chunk)]
    pos = context

    def step(r: ModelRunner = runner) -> None:
        nonlocal last, pos
        out = r.run([SeqChunk(s, [t], pos) for s, t in zip(seqs, last)])
        last = torch.cat(out).argmax(-1).tolist()                   # greedy, one host sync per step
        pos += 1

    sync = torch.cuda.synchronize if model.device.type == "cuda" else (lambda: None)
    t0 = time.perf_counter()
    step()  # warm-up (captures the graph when graphs are on)
    sync()
    warm = time.perf_counter() - t0
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    sync()
    dt = (time.perf_counter() - t0) / steps
    res = {"mode": "decode", "batch": batch, "context": context, "steps": steps, "ms_per_step": dt * 1e3,
           "tokens_per_s": batch / dt, "tokens_per_s_per_seq": 1 / dt, "cuda_graphs": graphs,
           "graph_bucket": bucket if graphs else None, "warmup_s": warm}
    if breakdown:  # one eager step (a graph replay hides its ops); the same kernels the graph replays
        eager = ModelRunner(model, kv, cuda_graphs=False) if graphs else runner
        res.update(_breakdown(model, lambda: step(eager), dt * 1e3, breakdown if isinstance(breakdown, str)
                              else "profile"))
    return res


@contextlib.contextmanager
def qkv_gemms(model, mode: str):
    """Within the block, attention runs q/k/v as ``mode``: "stacked" (as built) or "three" (three GEMMs over
    the stacked weight's row views, i.e. the same weights). Yields what is used: "stacked" or "three"."""
    attns = [layer.self_attn for layer in model.model.layers]
    saved = [a.qkv_lw for a in attns]
    if mode == "three":
        for a in attns:
            a.qkv_lw = None
    try:
        yield "stacked" if all(lw is not None for lw in saved) and mode == "stacked" else "three"
    finally:
        for a, lw in zip(attns, saved):
            a.qkv_lw = lw


def _print_breakdown(row: dict) -> None:
    from dayzero.bench_breakdown import print_breakdown

    print_breakdown(row.get("breakdown_ms"), row.get("breakdown_check"))
    if row.get("breakdown_error"):
        print(f"  breakdown failed: {row['breakdown_error']}")


def run(args: argparse.Namespace) -> int:
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("dayzero bench: error: no CUDA device (use --device cpu --backend torch for a smoke run)", file=sys.stderr)
        return 2
    if args.mode == "decode" and args.graphs in ("on", "both") and (not args.device.startswith("cuda")
                                                                   or args.backend == "torch"):
        print("dayzero bench: error: --graphs on/both needs --device cuda and a GPU kernel backend", file=sys.stderr)
        return 2
    parts = ("prefill", "decode") if args.mode == "all" else (args.mode,)
    need = max(args.tokens + 8 if "prefill" in parts else 0, args.context + args.steps + 8 if "decode" in parts else 0)
    t0 = time.perf_counter()
    model = build_model(args, need)
    meta = {"model": args.model, "backend": args.backend, "dtype": args.dtype, "build_s": time.perf_counter() - t0,
            "device": torch.cuda.get_device_name() if args.device.startswith("cuda") else args.device,
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "fallback_ops": list(model.ops.fallbacks),
            "commit": os.environ.get("DAYZERO_COMMIT", "unknown")}
    rows = []
    if "prefill" in parts:
        bd = args.breakdown and args.breakdown_mode
        rows.append(bench_prefill(model, args.tokens, args.repeat, bd, args.usd_per_gpu_hour, args.seed))
        r = rows[0]
        print(f"prefill {args.model} {args.dtype}/{args.backend} {r['tokens']} tokens: {r['seconds']:.4f} s "
              f"({r['tokens_per_s']:.0f} tok/s, ${r['usd_per_1m_input_tokens']:.4f} per 1M input tokens)")
        _print_breakdown(r)
    if "decode" in parts:
        from dayzero.runtime.model_runner import graphs_by_default

        modes = {"auto": [graphs_by_default(model)], "on": [True], "off": [False], "both": [True, False]}[args.graphs]
        for qkv in ("stacked", "three") if args.qkv == "both" else (args.qkv,):
            with qkv_gemms(model, qkv) as used:
                for b in [int(x) for x in args.batch.split(",") if x]:
                    for graphs in modes:
                        bd = args.breakdown and args.breakdown_mode and qkv == "stacked"
                        rows.append(bench_decode(model, b, args.context, args.steps, args.seed, bd, graphs))
                        r = rows[-1]
                        r["qkv"] = used
                        print(f"decode {args.model} batch {b} ctx {args.context} {'graph' if graphs else 'eager'} "
                              f"q/k/v {used}: {r['ms_per_step']:.2f} ms/step, {r['tokens_per_s']:.1f} tok/s "
                              f"(warm-up {r['warmup_s']:.1f} s)")
                        _print_breakdown(r)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1)
    return 0
