"""Prefill lab: loop-structure variants of full-causal attention with sinks, one sequence, timed beside
the shipped op in the same process (issue 5: causal prefill >= FlashInfer fa3, which was 4-5 % ahead).

    PYTHONPATH=shared python3 bench/attention/prefill_lab.py --out DIR [--n 8192,32768]

Variants (the lab kernel covers only the bench shape: new keys, no cached prefix, no window):
  * ``PIPE``: the next tile's Q.K^T is issued before this tile's softmax (FA3's intra-warpgroup overlap:
    the tensor core works on S_{j+1} while the FMA/MUFU units turn S_j into P_j); two score tiles live.
  * ``WS``: Triton's own warp specialisation of the key loop (``tl.range(warp_specialize=True)``).
  * tile shape / warps / stages.
Each variant is checked against the torch reference on its first and last 256 rows (bf16 relative error)
before it is timed; JSON: ``<out>/prefill_lab.json`` (meta with commit, GPU, date).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import traceback

import torch
import triton
import triton.language as tl

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from attn_common import run_meta, sink_reference_rows, time_ms  # noqa: E402

HQ, HKV, D = 64, 8, 64
LOG2E = 1.4426950408889634


@triton.jit
def _step(acc, l_i, m_i, qk, vt, q_pos, pos, qk_scale, MASK: tl.constexpr):
    if MASK:
        qk = tl.where(pos[None, :] <= q_pos[:, None], qk * qk_scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        qk = qk - m_new[:, None]
    else:
        m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
        qk = qk * qk_scale - m_new[:, None]
    p = tl.math.exp2(qk)
    alpha = tl.math.exp2(m_i - m_new)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None]
    acc = tl.dot(p.to(vt.dtype), vt, acc)
    return acc, l_i, m_new


@triton.jit
def _lab_kernel(q_ptr, k_ptr, v_ptr, k_desc, v_desc, sink_ptr, o_ptr, N, qk_scale,
                GROUP: tl.constexpr, HEAD_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                PIPE: tl.constexpr, WS: tl.constexpr, ROW: tl.constexpr):
    pid_m = tl.num_programs(0) - 1 - tl.program_id(0)         # longest tiles first
    h = tl.program_id(1)
    hkv = h // GROUP
    m_start = pid_m * BLOCK_M
    offs_m = m_start + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_D)
    offs_n = tl.arange(0, BLOCK_N)
    row_ok = offs_m < N
    q = tl.load(q_ptr + offs_m[:, None].to(tl.int64) * ROW + h * HEAD_D + offs_d[None, :],
                mask=row_ok[:, None], other=0.0)
    m_i = tl.zeros([BLOCK_M], dtype=tl.float32) - 1.0e30
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_D], dtype=tl.float32)
    col = hkv * HEAD_D
    full_hi = m_start // BLOCK_N * BLOCK_N                     # key tiles every row sees whole
    if PIPE:
        if full_hi > 0:
            qk = tl.dot(q, tl.trans(k_desc.load([0, col])))
            for n0 in range(0, full_hi - BLOCK_N, BLOCK_N):
                vt = v_desc.load([n0, col])
                qk_next = tl.dot(q, tl.trans(k_desc.load([n0 + BLOCK_N, col])))
                acc, l_i, m_i = _step(acc, l_i, m_i, qk, vt, offs_m, n0 + offs_n, qk_scale, False)
                qk = qk_next
            vt = v_desc.load([full_hi - BLOCK_N, col])
            acc, l_i, m_i = _step(acc, l_i, m_i, qk, vt, offs_m, full_hi - BLOCK_N + offs_n, qk_scale, False)
    else:
        for n0 in tl.range(0, full_hi, BLOCK_N, warp_specialize=WS):
            qk = tl.dot(q, tl.trans(k_desc.load([n0, col])))
            vt = v_desc.load([n0, col])
            acc, l_i, m_i = _step(acc, l_i, m_i, qk, vt, offs_m, n0 + offs_n, qk_scale, False)
    hi = tl.minimum(m_start + BLOCK_M, N)
    for n0 in range(full_hi, hi, BLOCK_N):                     # diagonal tiles, masked
        pos = n0 + offs_n
        qk = tl.dot(q, tl.trans(k_desc.load([n0, col])))
        vt = v_desc.load([n0, col])
        vt = tl.where((pos < N)[:, None], vt, 0.0)
        acc, l_i, m_i = _step(acc, l_i, m_i, qk, vt, offs_m, pos, qk_scale, True)
    sink = tl.load(sink_ptr + h).to(tl.float32) * 1.4426950408889634
    m_f = tl.maximum(m_i, sink)
    alpha = tl.math.exp2(m_i - m_f)
    l_i = l_i * alpha + tl.math.exp2(sink - m_f)
    out = acc * (alpha / l_i)[:, None]
    tl.store(o_ptr + offs_m[:, None].to(tl.int64) * ROW + h * HEAD_D + offs_d[None, :],
             out.to(o_ptr.dtype.element_ty), mask=row_ok[:, None])



def lab_attention(q, k, v, sinks, scale: float, out, BLOCK_M=128, BLOCK_N=64, PIPE=False, WS=False,
                  num_warps=4, num_stages=3):
    """q [N, 64, 64], k/v [N, 8, 64] bf16 (contiguous), sinks [64] -> out [N, 64, 64]."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    n = q.shape[0]
    kd = TensorDescriptor(k, [n, HKV * D], [k.stride(0), 1], [BLOCK_N, D])
    vd = TensorDescriptor(v, [n, HKV * D], [v.stride(0), 1], [BLOCK_N, D])
    _lab_kernel[(triton.cdiv(n, BLOCK_M), HQ)](q, k, v, kd, vd, sinks, out, n, scale * LOG2E, GROUP=HQ // HKV,
                                               HEAD_D=D, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, PIPE=PIPE, WS=WS, ROW=HQ * D,
                                               num_warps=num_warps, num_stages=num_stages)
    return out


VARIANTS = {
    "lab_m128n64w4s3": dict(),
    "pipe_m128n64w4s3": dict(PIPE=True),
    "pipe_m128n64w8s3": dict(PIPE=True, num_warps=8),
    "pipe_m128n128w8s2": dict(PIPE=True, BLOCK_N=128, num_warps=8, num_stages=2),
    "pipe_m256n64w8s3": dict(PIPE=True, BLOCK_M=256, num_warps=8),
    "lab_m128n128w8s3": dict(BLOCK_N=128, num_warps=8),
    "lab_m256n64w8s3": dict(BLOCK_M=256, num_warps=8),
    "ws_m128n64w4s3": dict(WS=True),
    "ws_m128n128w8s3": dict(WS=True, BLOCK_N=128, num_warps=8),
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=".")
    ap.add_argument("--n", default="8192,32768")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    a = ap.parse_args()
    from dayzero.kernels.triton_attention import attention as ours

    out_dir = pathlib.Path(a.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    doc = dict(meta=run_meta(), rows=[], errors=[])
    scale = D ** -0.5
    for n in [int(x) for x in a.n.split(",")]:
        g = torch.Generator(device="cuda").manual_seed(n)
        q = torch.randn(n, HQ, D, device="cuda", generator=g).bfloat16()
        k = torch.randn(n, HKV, D, device="cuda", generator=g).bfloat16()
        v = torch.randn(n, HKV, D, device="cuda", generator=g).bfloat16()
        sinks = torch.randn(HQ, device="cuda", generator=g) * 2
        rows = [slice(0, 256), slice(n - 256, n)]
        refs = [sink_reference_rows(q, k, v, sinks, sl, 0, scale) for sl in rows]
        flops = 4 * D * HQ * n * (n + 1) / 2
        kc = torch.zeros(1, 16, HKV, D, device="cuda", dtype=torch.bfloat16)
        bt = torch.zeros(1, 1, device="cuda", dtype=torch.int32)
        cu = torch.tensor([0, n], device="cuda", dtype=torch.int32)
        cl = torch.zeros(1, device="cuda", dtype=torch.int32)
        fns = {"shipped": lambda o: ours(q, k, v, kc, kc, bt, cu, cl, sinks, scale, 0, max_seqlen_q=n, out=o)}
        for name in a.variants.split(","):
            fns[name] = lambda o, kw=VARIANTS[name]: lab_attention(q, k, v, sinks, scale, o, **kw)
        for name, fn in fns.items():
            out = torch.full_like(q, float("nan"))
            try:
                fn(out)
                torch.cuda.synchronize()
                err = max(float((out[sl].float() - r.float()).norm() / r.float().norm()) for sl, r in zip(rows, refs))
                written = bool(torch.isfinite(out).all())
                ms = time_ms(lambda: fn(out), rep=200 if n <= 8192 else 40)
                r = dict(n=n, impl=name, ms=ms, tflops=flops / (ms * 1e-3) / 1e12, rel_err=err, all_written=written)
                doc["rows"].append(r)
                print(f"N={n:>6} {name:<20} {ms:8.3f} ms {r['tflops']:6.1f} TF/s err {err:.2e} written {written}",
                      flush=True)
            except Exception as e:  # noqa: BLE001 - one variant's failure keeps the others
                doc["errors"].append(dict(n=n, impl=name, error=f"{type(e).__name__}: {str(e)[:400]}",
                                          trace=traceback.format_exc()[-1500:]))
                print(f"N={n:>6} {name:<20} FAILED {type(e).__name__}: {str(e)[:200]}", flush=True)
            (out_dir / "prefill_lab.json").write_text(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
