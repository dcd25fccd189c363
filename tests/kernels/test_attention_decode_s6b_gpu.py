"""TMA decode candidate (triton_attention_decode_tma.py, presets ``tma_*``) vs the torch reference op.

Fresh random inputs per case, shuffled pages, NaN in every cache slot the kernel must not read (unused blocks,
slots past each sequence's cached length: a TMA load copies whole pages, so the kernel must mask them), outputs
poisoned with NaN, ragged lengths incl. a sequence without a new token; one and many splits; the registered op
under each preset (``DAYZERO_DECODE_ATTENTION``); bitwise-repeatable calls; CUDA-graph replay == eager bitwise
(with PDL, behind a q writer). On the CPU: ``TRITON_INTERPRET=1 DAYZERO_KERNEL_TEST_DEVICE=cpu pytest
--noconftest ...`` (fp32 inputs there: the interpreter mis-multiplies bf16 dots; small shapes).
"""

from __future__ import annotations

import pytest
import torch

from gpu_util import DEV
from dayzero.kernels import torch_attention as ref_ops
from dayzero.kernels.triton_attention_cases import check_output, make_case

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(DEV == "cuda" and not torch.cuda.is_available(), reason="needs a CUDA GPU")]
CUDA = DEV == "cuda"
DTYPE = torch.bfloat16 if CUDA else torch.float32
TOL = 1e-2
PRESETS = ["tma_p4", "tma_p4_s4", "tma_p4_w1", "tma_p4_w1_s4", "tma_p2_w1_s4"] if CUDA else ["tma_p4", "tma_p2_w1_s4"]
# (hq, hkv, d, bs): the 20B / 120B shape (every preset) and small ones (the first preset; few builds on the GPU)
SHAPES = [(64, 8, 64, 16), (8, 2, 16, 16), (16, 2, 64, 32)] if CUDA else [(8, 2, 16, 16), (4, 1, 32, 8)]
CASES = [(p, SHAPES[0]) for p in PRESETS] + [(PRESETS[0], sh) for sh in SHAPES[1:]]


def _preset(name: str) -> dict:
    from dayzero.kernels.triton_attention_decode import DECODE_PRESETS
    return dict(DECODE_PRESETS[name])


def _case(cached, seed, hq=64, hkv=8, d=64, bs=16, sinks="mixed", empty=()):
    q_lens = [0 if i in empty else 1 for i in range(len(cached))]
    return make_case(q_lens, cached, hq=hq, hkv=hkv, d=d, bs=bs, sinks=sinks, seed=seed, dtype=DTYPE, device=DEV)


def _run(case, ns, config):
    from dayzero.kernels.triton_attention import attention
    ref = ref_ops.attention(*case.args())
    out = torch.full_like(case.q, float("nan"))
    res = attention(*case.args(), out=out, max_seqlen_q=1, num_splits=ns, config=config)
    if CUDA:
        torch.cuda.synchronize()
    return check_output(res, out, ref, case.cu_seqlens_q, TOL)


@pytest.mark.parametrize("preset,shape", CASES)
def test_tma_decode_ragged(preset, shape):
    hq, hkv, d, bs = shape
    long = 40000 if CUDA else 700
    cached = [0, 1, bs - 1, bs, bs + 1, 4 * bs, 129, 1000 if CUDA else 300, long]
    case = _case(cached, seed=hq + d + bs, hq=hq, hkv=hkv, d=d, bs=bs, empty=(2,))
    for ns in ((1, 3, 16, 64, 132) if CUDA else (1, 3, 9)):
        _run(case, ns, _preset(preset))


@pytest.mark.parametrize("sinks", ["neg", "large"])
def test_tma_decode_sink_counted_once(sinks):
    case = _case([3000 if CUDA else 300, 64, 1, 700 if CUDA else 70], seed=3, sinks=sinks, hq=8, hkv=2,
                 d=64 if CUDA else 16)
    for ns in (1, 2, 7, 40):
        _run(case, ns, _preset("tma_p4"))


def test_tma_decode_registered_op_under_env(monkeypatch):
    """The registered op with no config runs the candidate when DAYZERO_DECODE_ATTENTION names it (and the
    preset's kernel is what runs: the same bits as a direct call)."""
    from dayzero.kernels.triton_attention import attention
    from dayzero.kernels.triton_attention_decode_tma import tma_decode
    from dayzero.kernels.triton_attention_prefill import LOG2E
    case = _case([5000 if CUDA else 500, 17, 1, 129], seed=9, hq=8, hkv=2, d=64 if CUDA else 16)
    monkeypatch.setenv("DAYZERO_DECODE_ATTENTION", "tma_p4")
    ns = 8
    _run(case, ns, None)
    a = case.args()
    got = attention(*a, max_seqlen_q=1, num_splits=ns)
    cfg = {k: v for k, v in _preset("tma_p4").items() if k not in ("MERGE", "TMA")}
    direct = tma_decode(cfg, ns, *a[:9], a[9] * LOG2E, torch.empty_like(case.q), pdl=CUDA)
    assert torch.equal(got, direct)


@pytest.mark.skipif(not CUDA, reason="repeatability and graphs: GPU only")
@pytest.mark.parametrize("preset", ["tma_p4", "tma_p4_w1"])
def test_tma_decode_deterministic(preset):
    from dayzero.kernels.triton_attention import attention
    case = _case([5000, 40000, 17, 1, 129, 3000, 800, 0], seed=61)
    for ns in (2, 13, 64):
        outs = [attention(*case.args(), max_seqlen_q=1, num_splits=ns, config=_preset(preset)) for _ in range(10)]
        torch.cuda.synchronize()
        assert all(torch.equal(o, outs[0]) for o in outs), f"num_splits={ns}: runs differ"


@pytest.mark.skipif(not CUDA, reason="CUDA graphs: GPU only")
@pytest.mark.parametrize("preset", ["tma_p4", "tma_p4_w1"])
def test_tma_decode_graph_replay_equals_eager(preset):
    """Three chained calls (each reads the previous output as q) behind a q writer, PDL on, captured once; after
    the lengths and q change in place, the replay gives the eager chain's bits."""
    from dayzero.kernels.triton_attention import attention
    case = make_case([1] * 6, [2000, 10, 500, 1, 1500, 30000], sinks="mixed", seed=21, extra_cols=8, poison=False)
    outs = [torch.empty_like(case.q) for _ in range(3)]
    qbuf = torch.empty_like(case.q)
    args = list(case.args())
    cfg = dict(_preset(preset), PDL=True)

    def chain():
        qbuf.copy_(case.q)
        for i, o in enumerate(outs):
            args[0] = qbuf if i == 0 else outs[i - 1]
            attention(*args, max_seqlen_q=1, num_splits=16, out=o, config=cfg)

    chain()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        chain()
    for step in range(3):
        case.cached_lens.add_(7 * step)
        case.q.copy_(torch.randn_like(case.q))
        for o in outs:
            o.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        replayed = [o.clone() for o in outs]
        chain()
        torch.cuda.synchronize()
        for i, (r, e) in enumerate(zip(replayed, outs)):
            assert torch.equal(r, e), f"step {step} call {i}: graph replay differs from eager"
        ref = case.q
        for _ in outs:
            ref = ref_ops.attention(ref, *case.args()[1:])
        check_output(outs[-1], outs[-1], ref, case.cu_seqlens_q, TOL)


def test_tma_supported_refuses_what_it_cannot_read():
    from dayzero.kernels.triton_attention_decode_tma import tma_supported
    case = _case([40, 3], seed=1, hq=8, hkv=2, d=16)
    assert tma_supported(case.k_cache, case.v_cache, 0)
    assert not tma_supported(case.k_cache, case.v_cache, 128)                     # window layers
    assert not tma_supported(case.k_cache.transpose(1, 2), case.v_cache, 0)       # not [NB, BS, Hkv, D] dense
    wide = torch.zeros((4, 16, 2, 64), dtype=torch.float32, device=DEV)              # 256-byte box rows
    assert not tma_supported(wide, wide, 0)
    # the registered op still answers (the shipped path) for a layout the candidate cannot read
    kc = case.k_cache.transpose(1, 2).contiguous().transpose(1, 2)
    vc = case.v_cache.transpose(1, 2).contiguous().transpose(1, 2)
    from dayzero.kernels.triton_attention import attention
    args = list(case.args())
    args[3], args[4] = kc, vc
    ref = ref_ops.attention(*case.args())
    out = torch.full_like(case.q, float("nan"))
    res = attention(*args, out=out, max_seqlen_q=1, num_splits=2, config=_preset("tma_p4"))
    check_output(res, out, ref, case.cu_seqlens_q, TOL)
