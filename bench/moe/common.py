"""Shared helpers of the MoE / linear kernel benchmarks: timing, run metadata, random FP8 weights."""

from __future__ import annotations

import datetime
import json
import os
import traceback
from dataclasses import dataclass, field

import torch
import triton.testing

from dayzero.kernels.types import ExpertWeights, LinearWeight
from dayzero.weights import fp8

DEVICE = os.environ.get("DAYZERO_BENCH_DEVICE", "cuda")  # "cpu" only for a TRITON_INTERPRET=1 dry run
COPY_TBS = 4.26        # H200 device-to-device copy ceiling measured there (DESIGN.md section 6)
FP8_BLOCK_TFLOPS = 1149.0


def median_ms(fn, warmup_ms: int = 25, rep_ms: int = 100) -> float:
    """Median time of ``fn`` in ms (CUDA events, after warm-up; triton.testing.do_bench)."""
    return float(triton.testing.do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="median"))


def graph_us(calls: list, reps: int = 20) -> float:
    """Median GPU time of one call (us) from a CUDA graph of all ``calls`` (warmed up on a side
    stream first), replayed ``reps`` times."""
    import statistics

    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        for c in calls:  # compile, warm up
            c()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for c in calls:
            c()
    g.replay()
    torch.cuda.synchronize()
    t0, t1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(reps):
        t0.record()
        g.replay()
        t1.record()
        t1.synchronize()
        times.append(t0.elapsed_time(t1) * 1000.0 / len(calls))
    return statistics.median(times)


def run_meta() -> dict:
    """Commit (the carried .devmeta/commit, else git), hash of the kernel sources, GPU, date, versions."""
    import hashlib
    import pathlib
    import subprocess

    import triton

    root = pathlib.Path(__file__).resolve().parents[2]
    commit = ""
    meta = root / ".devmeta" / "commit"  # carried by device calls; the device copy's .git can be stale
    if meta.exists():
        commit = meta.read_text().strip()
    if len(commit) != 40:
        try:
            commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True,
                                    timeout=10).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            pass
    src = hashlib.sha256()
    for p in sorted((root / "shared" / "dayzero" / "kernels").glob("triton_[lm]*.py")):
        src.update(p.read_bytes())
    return {"commit": commit or "unknown", "kernel_sources_sha256": src.hexdigest()[:16],
            "gpu": torch.cuda.get_device_name(), "date_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(
                timespec="seconds"), "torch": torch.__version__, "triton": triton.__version__, "cuda": torch.version.cuda}


@dataclass
class Results:
    """Rows of one benchmark, written as JSON; a failing section is recorded, not fatal."""

    name: str
    meta: dict = field(default_factory=run_meta)
    rows: list = field(default_factory=list)
    errors: list = field(default_factory=list)

    def add(self, **row) -> None:
        self.rows.append(row)
        print(json.dumps(row), flush=True)

    def section(self, title: str, fn, *args, **kw) -> None:
        try:
            fn(self, *args, **kw)
        except Exception as exc:  # keep going: record the failure with its traceback
            self.errors.append({"section": title, "error": repr(exc), "trace": traceback.format_exc()[-3000:]})
            print(f"[{title}] FAILED: {exc!r}", flush=True)
        torch.cuda.empty_cache()

    def write(self, out_dir: str) -> str:
        os.makedirs(out_dir, exist_ok=True)
        path = os.path.join(out_dir, f"{self.name}.json")
        with open(path, "w", encoding="utf-8") as f:
            json.dump({"meta": self.meta, "rows": self.rows, "errors": self.errors}, f, indent=1)
        return path


def random_linear(n: int, k: int, seed: int, std: float | None = None) -> LinearWeight:
    g = torch.Generator(device="cuda").manual_seed(seed)
    w = torch.randn(n, k, device="cuda", generator=g) * (std or k ** -0.5)
    q, s = fp8.quantize_weight_block(w)
    return LinearWeight(weight=q, bias=(torch.randn(n, device="cuda", generator=g) * 0.1).bfloat16(), scale=s)


def random_experts(E: int, H: int, I: int, seed: int) -> ExpertWeights:
    """gpt-oss-like magnitudes (gate_up std 1/sqrt(H), down 0.25/sqrt(I)), quantized on the GPU per expert."""
    g = torch.Generator(device=DEVICE).manual_seed(seed)

    def q(shape, std):
        w8 = torch.empty(shape, dtype=torch.float8_e4m3fn, device=DEVICE)
        sc = torch.empty((shape[0], -(-shape[1] // 128), -(-shape[2] // 128)), dtype=torch.float32, device=DEVICE)
        for e in range(shape[0]):
            w8[e], sc[e] = fp8.quantize_weight_block(torch.randn(shape[1:], device=DEVICE, generator=g) * std)
        return w8, sc

    gu, gus = q((E, 2 * I, H), H ** -0.5)
    dn, dns = q((E, H, I), 0.25 * I ** -0.5)
    return ExpertWeights(gate_up=gu, gate_up_bias=(torch.randn(E, 2 * I, device=DEVICE, generator=g) * 0.1).bfloat16(),
                         down=dn, down_bias=(torch.randn(E, H, device=DEVICE, generator=g) * 0.1).bfloat16(),
                         gate_up_scale=gus, down_scale=dns, derived={"expert_offset": 0})


def routing(T: int, E: int, k: int, balanced: bool, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights [T,k] bf16, ids [T,k] int64). balanced: pair p goes to expert p % E (every expert
    gets exactly T*k/E routes, a token's k experts are distinct); else random top-k of N(0,1) logits."""
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    logits = torch.randn(T, E, device=DEVICE, generator=g).bfloat16()
    if balanced:
        ids = (torch.arange(T * k, device=DEVICE) % E).view(T, k)
        top = logits.gather(1, ids)
    else:
        top, ids = logits.topk(k, dim=1)
    return torch.softmax(top, dim=1, dtype=torch.bfloat16), ids
