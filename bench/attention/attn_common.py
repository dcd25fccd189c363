"""Shared pieces of the attention benchmark: run metadata, timers, ceilings, problem builders."""

from __future__ import annotations

import datetime
import hashlib
import pathlib
import subprocess

import torch
import triton
from triton.testing import do_bench

ROOT = pathlib.Path(__file__).resolve().parents[2]
HQ, HKV, D, BS = 64, 8, 64, 16


def run_meta() -> dict:
    """Commit (the carried .devmeta/commit, else git), GPU, versions, UTC date, kernel source hash.
    The carried file wins: the device copy's git reported a stale HEAD in runs 4-5."""
    commit = ""
    meta_file = ROOT / ".devmeta" / "commit"
    if meta_file.exists():
        commit = meta_file.read_text().strip()
    try:
        if not commit:
            commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                                    timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        pass
    if len(commit) != 40 or any(c not in "0123456789abcdef" for c in commit):
        commit = ""  # not a git checkout (the device copy has no history)
    src = hashlib.sha256()
    for p in sorted((ROOT / "shared" / "dayzero" / "kernels").glob("triton_attention*.py")):
        src.update(p.read_bytes())
    props = torch.cuda.get_device_properties(0)
    return {"commit": commit or "unknown", "kernel_sources_sha256": src.hexdigest()[:16],
            "gpu": torch.cuda.get_device_name(0), "sms": props.multi_processor_count,
            "torch": torch.__version__, "triton": triton.__version__,
            "date_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}


def time_ms(fn, rep: int = 100) -> float:
    """Median ms per call with events; L2 flushed before each call (triton's do_bench)."""
    return float(do_bench(fn, warmup=25, rep=rep, return_mode="median"))


def prefill_time_ms(fn, n: int) -> float:
    """Median ms per prefill call of ``n`` tokens: ``time_ms`` up to 64k tokens; above (a 128k call takes
    ~0.3 s, too long for do_bench's hundreds of calls in one device call) the median of 3 event-timed
    calls after one warm-up."""
    if n <= 65536:
        return time_ms(fn, rep=200 if n <= 8192 else 300)
    fn()
    times = []
    for _ in range(3):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b))
    return sorted(times)[1]


def graph_time_ms(fns: list, target_ms: float = 20.0, samples: int = 5) -> float:
    """Median ms per call of ``fns`` (rotating over distinct buffers) replayed from one CUDA graph."""
    for f in fns:
        f()
    torch.cuda.synchronize()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=s):
            for f in fns:
                f()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    t0, t1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    t0.record()
    g.replay()
    t1.record()
    torch.cuda.synchronize()
    reps = max(1, int(target_ms / max(t0.elapsed_time(t1), 1e-3)))
    out = []
    for _ in range(samples):
        t0.record()
        for _ in range(reps):
            g.replay()
        t1.record()
        torch.cuda.synchronize()
        out.append(t0.elapsed_time(t1) / (reps * len(fns)))
    out.sort()
    return out[len(out) // 2]


def decode_problem(B: int, L: int, pool_blocks: int, g: torch.Generator, window: int = 0,
                   max_rotations: int = 128):
    """A decode batch over a shared paged pool: B sequences of L cached keys each (``window``: only the
    last ``window`` are read), R page tables over distinct pool pages to rotate through (at most
    ``max_rotations``, ~512 MB of KV in all). -> (R, tables [R, B, nb] int32, q, k, v, cu, cl, out,
    kv_bytes read per call)."""
    nb = triton.cdiv(L, BS)
    kv_bytes = B * min(L, window or L) * HKV * D * 2 * 2
    R = int(max(1, min(max_rotations, pool_blocks // (B * nb), triton.cdiv(1 << 29, kv_bytes))))
    tables = torch.randperm(pool_blocks, device="cuda", generator=g)[:R * B * nb].view(R, B, nb).to(torch.int32)
    q = torch.randn(B, HQ, D, device="cuda", dtype=torch.bfloat16, generator=g)
    k = torch.randn(B, HKV, D, device="cuda", dtype=torch.bfloat16, generator=g)
    v = torch.randn(B, HKV, D, device="cuda", dtype=torch.bfloat16, generator=g)
    cu = torch.arange(B + 1, device="cuda", dtype=torch.int32)
    cl = torch.full((B,), L, device="cuda", dtype=torch.int32)
    return R, tables, q, k, v, cu, cl, torch.empty_like(q), kv_bytes


def copy_bandwidth() -> float:
    """Device-to-device copy, bytes read + written per second (the memory ceiling)."""
    x = torch.empty(1 << 30, dtype=torch.uint8, device="cuda").random_()
    y = torch.empty_like(x)
    ms = time_ms(lambda: y.copy_(x))
    del x, y
    return 2 * (1 << 30) / (ms * 1e-3)


def bf16_gemm_tflops() -> float:
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    ms = time_ms(lambda: a @ b)
    return 2 * 8192 ** 3 / (ms * 1e-3) / 1e12


def single_sequence(n: int, cached: int = 0, seed: int = 0):
    """One sequence of ``n`` new tokens after ``cached`` paged tokens (shuffled pages), sinks N(0,2)."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    rnd = lambda *s: torch.randn(*s, device="cuda", generator=g, dtype=torch.bfloat16)  # noqa: E731
    nblk = max(1, triton.cdiv(cached, BS))
    k_cache, v_cache = rnd(nblk, BS, HKV, D), rnd(nblk, BS, HKV, D)
    tables = torch.randperm(nblk, device="cuda", generator=g).to(torch.int32)[None]
    return dict(q=rnd(n, HQ, D), k=rnd(n, HKV, D), v=rnd(n, HKV, D), k_cache=k_cache, v_cache=v_cache,
                block_tables=tables, cu_seqlens_q=torch.tensor([0, n], dtype=torch.int32, device="cuda"),
                cached_lens=torch.tensor([cached], dtype=torch.int32, device="cuda"),
                sinks=torch.randn(HQ, device="cuda", generator=g) * 2)


def sink_reference_rows(q, k, v, sinks, rows: slice, window: int, scale: float) -> torch.Tensor:
    """fp32 reference for some query rows of one uncached sequence (causal, window, sinks)."""
    n = k.shape[0]
    qs = q[rows].float()                                            # [R, Hq, D]
    pos = torch.arange(n, device=q.device)[rows]
    kk = k.float().repeat_interleave(HQ // HKV, 1)                  # [N, Hq, D]
    vv = v.float().repeat_interleave(HQ // HKV, 1)
    s = torch.einsum("rhd,nhd->hrn", qs, kk) * scale
    kpos = torch.arange(n, device=q.device)
    vis = kpos[None] <= pos[:, None]
    if window:
        vis &= (pos[:, None] - kpos[None]) < window
    s = s.masked_fill(~vis[None], float("-inf"))
    s = torch.cat([s, sinks.float().view(-1, 1, 1).expand(-1, s.shape[1], 1)], -1)
    p = torch.softmax(s, -1)[..., :-1]
    return torch.einsum("hrn,nhd->rhd", p, vv)
