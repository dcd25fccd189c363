"""Gluon ping-pong causal prefill (``gluon_attention_prefill``, opt-in, head dim 64, no cached prefix) vs the
torch reference op.

GPU tests (marked ``gpu``; skipped without CUDA or triton): fresh random inputs per case, the output
poisoned with NaN (an unwritten element fails), relative error per sequence < 1e-2 against the fp32
reference; ragged lengths around the tile edges (1, 63-65, 127-129, 191-193, 255-257 tokens ...), sinks from
very negative (no sink) to large (the sink takes most of the mass), scores spread over hundreds of log2
units, keys whose scores keep growing along the sequence (the running max and O rescale at every tile);
unsupported calls raise ValueError.
CPU tests (no triton, run in CI): ``gluon_attention_schedule.emulate`` runs the kernel's tile schedule
(CTA / warpgroup rows, tile 0 + unmasked + diagonal tiles, TMA reads past a sequence and past T, the sink
rule) in torch and must match the reference, so the kernel's index logic is checked without a GPU;
``simulate_protocol`` steps its mbarrier protocol (ring, empties, turns) at random interleavings.
"""

from __future__ import annotations

import os

import pytest
import torch

from dayzero.kernels import torch_attention as ref_ops
from dayzero.kernels.gluon_attention_schedule import ProtocolError, emulate, simulate_protocol, tile_plan
from dayzero.kernels.triton_attention_cases import check_output, make_case, seq_errors

TOL = 1e-2
CUDA = torch.cuda.is_available()
# lengths around every tile edge of 64-row warpgroups, 128 / 192-row CTAs and 128-key tiles
EDGES = [1, 2, 63, 64, 65, 127, 128, 129, 191, 192, 193, 255, 256, 257, 300]


# ---------------------------------------------------------------- CPU: the schedule in torch ----

@pytest.mark.parametrize("nwg,block_n", [(2, 128), (3, 128), (2, 64)])
def test_schedule_emulation_matches_reference(nwg, block_n):
    """Every tile edge in one ragged batch (next sequences' rows read past each end, zeros past T)."""
    case = make_case([129, 1, 64, 193, 300, 2], [0] * 6, hq=16, hkv=2, sinks="mixed", dtype=torch.bfloat16,
                     device="cpu", seed=3 + nwg + block_n)
    ref = ref_ops.attention(*case.args())
    out = emulate(case.q, case.k, case.v, case.cu_seqlens_q, case.sinks, case.scale, nwg=nwg, block_n=block_n)
    assert not out.isnan().any(), "the schedule left rows unwritten"
    errs = seq_errors(out, ref, case.cu_seqlens_q)
    assert max(errs) < TOL, errs


@pytest.mark.parametrize("sinks", ["neg", "large"])
def test_schedule_emulation_extreme(sinks):
    case = make_case([257], [0], hq=8, hkv=1, sinks=sinks, dtype=torch.bfloat16, device="cpu", seed=11)
    case.q.mul_(30.0)  # scores over hundreds of log2 units
    ref = ref_ops.attention(*case.args())
    out = emulate(case.q, case.k, case.v, case.cu_seqlens_q, case.sinks, case.scale)
    assert max(seq_errors(out, ref, case.cu_seqlens_q)) < TOL


@pytest.mark.parametrize("block_m,block_n", [(128, 128), (192, 128), (128, 64)])
def test_tile_plan_covers_causal_keys(block_m, block_n):
    """Tiles [0, n_full) hold no key any row of the CTA must not see; [0, n_tiles) holds every key it must."""
    for q_len in EDGES + [1000, 1024, 1025]:
        plan = tile_plan(q_len, block_m, block_n)
        assert [c.m_start for c in plan] == list(range(0, q_len, block_m))
        for c in plan:
            assert c.n_full * block_n <= c.m_start + 1                   # every key <= the first row
            assert (c.n_full + 1) * block_n > c.m_start + 1 or c.n_full == c.n_tiles
            assert c.n_tiles * block_n >= min(c.m_start + block_m, q_len)  # the last row's keys
            assert (c.n_tiles - 1) * block_n < min(c.m_start + block_m, q_len)
            assert 1 <= c.n_tiles and c.n_full <= c.n_tiles


@pytest.mark.parametrize("nwg,stages", [(2, 2), (2, 3), (3, 2)])
@pytest.mark.parametrize("pingpong", [True, False])
def test_barrier_protocol_no_deadlock_no_hazard(nwg, stages, pingpong):
    """The kernel's waits / arrives (producer ring, per-stage empties counting every consumer, the turn
    passed round-robin) interleaved at random: no deadlock, no stage read early or overwritten in use."""
    for n_tiles in range(1, 8):
        for seed in range(6):
            assert simulate_protocol(n_tiles, nwg, stages, pingpong, seed) > 0


@pytest.mark.parametrize("stages", [2, 3])
def test_barrier_protocol_persistent_walk(stages):
    """The persistent kernel's walk: items of 1-6 tiles back to back, two Q buffers, ring and turns counted
    over the walk."""
    import random
    rnd = random.Random(stages)
    for seed in range(40):
        items = [rnd.randint(1, 6) for _ in range(rnd.randint(1, 6))]
        assert simulate_protocol(0, 2, stages, seed % 5 != 0, seed, items=items) > 0


def test_barrier_protocol_check_can_fail():
    """Without the producer's first-pass parity flip its first wait never passes: reported, not hung."""
    with pytest.raises(ProtocolError, match="deadlock"):
        simulate_protocol(3, empty_parity_flip=0)
    with pytest.raises(ProtocolError, match="deadlock"):
        simulate_protocol(0, empty_parity_flip=0, items=[2, 3])


# ---------------------------------------------------------------- GPU ----

def _gluon():
    pytest.importorskip("triton", reason="the Gluon kernel needs triton")
    from dayzero.kernels import gluon_attention_prefill as G
    return G


def _run(case, cfg_name: str) -> list[float]:
    G = _gluon()
    from gpu_util import poison
    ref = ref_ops.attention(*case.args())
    poison()
    out = torch.full_like(case.q, float("nan"))
    max_q = int((case.cu_seqlens_q[1:] - case.cu_seqlens_q[:-1]).max())
    res = G.prefill_attention(case.q, case.k, case.v, case.k_cache, case.v_cache, case.block_tables,
                              case.cu_seqlens_q, case.cached_lens, case.sinks, case.scale, 0, max_q, out,
                              config=G.CONFIGS[cfg_name])
    torch.cuda.synchronize()
    return check_output(res, out, ref, case.cu_seqlens_q, TOL)


# = gluon_attention_prefill.RUN_CONFIGS (checked below)
ALL_CFGS = ["pp3_nopin", "pp2_nopin", "pp2_persist_nopin"]
# DAYZERO_GLUON_CFGS=a,b: only these (gluon_prefill_run.sh tests one configuration per process, so a
# configuration that hangs on the GPU is cut by its own timeout)
CFGS = [c for c in os.environ.get("DAYZERO_GLUON_CFGS", "").split(",") if c] or ALL_CFGS


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("cfg", CFGS)
@pytest.mark.parametrize("sinks", ["normal", "neg", "large", "mixed"])
def test_gpu_ragged_edges(cfg, sinks):
    """All tile-edge lengths in one batch: rows past each end read the next sequence, the last past T."""
    _run(make_case(EDGES, [0] * len(EDGES), sinks=sinks, seed=17 + len(sinks), device="cuda"), cfg)


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("cfg", CFGS)
def test_gpu_long_and_extreme_scores(cfg):
    n = 2048 + 77
    _run(make_case([n, 1100, 5], [0, 0, 0], sinks="normal", seed=5, device="cuda"), cfg)
    case = make_case([n, 3], [0, 0], sinks="mixed", seed=6, device="cuda")
    case.q.mul_(40.0)  # most probabilities underflow to 0
    _run(case, cfg)
    case = make_case([n], [0], sinks="large", seed=7, device="cuda")
    ramp = torch.linspace(0.2, 4.0, n, device="cuda", dtype=torch.float32)[:, None, None]
    case.k.copy_((case.k.float() * ramp).to(case.k.dtype))  # each row's max keeps rising
    _run(case, cfg)


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("cfg", CFGS)
def test_gpu_matches_emulation_bitwise_close(cfg):
    """The kernel and its torch schedule agree much closer than either to the bf16 reference tolerance."""
    G = _gluon()
    c = G.CONFIGS[cfg]
    case = make_case([300, 129], [0, 0], hq=16, hkv=2, sinks="mixed", seed=23, device="cuda")
    out = torch.full_like(case.q, float("nan"))
    G.prefill_attention(case.q, case.k, case.v, case.k_cache, case.v_cache, case.block_tables, case.cu_seqlens_q,
                        case.cached_lens, case.sinks, case.scale, 0, 300, out, config=c)
    emu = emulate(case.q.cpu(), case.k.cpu(), case.v.cpu(), case.cu_seqlens_q.cpu(), case.sinks.cpu(), case.scale,
                  nwg=c.nwg, block_n=c.block_n)
    assert max(seq_errors(out.cpu(), emu.to(torch.bfloat16), case.cu_seqlens_q.cpu())) < 5e-3


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
def test_gpu_configs_are_the_run_configs():
    G = _gluon()
    assert tuple(ALL_CFGS) == G.RUN_CONFIGS and set(CFGS) <= set(G.CONFIGS)


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
def test_gpu_unsupported_calls_raise():
    G = _gluon()
    case = make_case([100], [0], device="cuda")
    out = torch.empty_like(case.q)
    args = [case.q, case.k, case.v, case.k_cache, case.v_cache, case.block_tables, case.cu_seqlens_q,
            case.cached_lens, case.sinks, case.scale, 0, 100, out]
    with pytest.raises(ValueError, match="window"):
        G.prefill_attention(*args[:10], 128, *args[11:])
    prefixed = make_case([100], [40], device="cuda")
    with pytest.raises(ValueError, match="prefix"):
        G.prefill_attention(*prefixed.args(), 100, torch.empty_like(prefixed.q))
    half = make_case([100], [0], device="cuda", dtype=torch.float16)
    with pytest.raises(ValueError, match="bf16"):
        G.prefill_attention(*half.args(), 100, torch.empty_like(half.q))
    wide = make_case([100], [0], d=128, device="cuda")
    with pytest.raises(ValueError, match="64"):
        G.prefill_attention(*wide.args(), 100, torch.empty_like(wide.q))


# ---------------------------------------------------------------- the registered op's Gluon path ----

@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("cfg", CFGS)
def test_gpu_registered_dispatch(cfg, monkeypatch):
    """DAYZERO_PREFILL_GLUON=cfg: the registered op (``triton_attention.attention``) runs the Gluon kernel for
    full-causal calls without a cached prefix (``max_seqlen_k`` 0, or not given: checked on the host) and the
    Triton kernel for a prefix, a window or max_seqlen_k > 0; every output matches the reference."""
    _gluon()
    from dayzero.kernels.triton_attention import attention
    from dayzero.kernels.triton_attention_prefill import GLUON_ENV, gluon_prefill_choice

    monkeypatch.setenv(GLUON_ENV, cfg)
    plain = make_case([300, 129, 1], [0, 0, 0], sinks="mixed", seed=31, device="cuda")
    prefixed = make_case([300, 129], [0, 77], sinks="mixed", seed=32, device="cuda")
    windowed = make_case([300, 129], [0, 0], window=128, seed=33, device="cuda")
    for case, max_k, want in [(plain, None, cfg), (plain, 0, cfg), (plain, 5, None), (prefixed, None, None),
                              (prefixed, 77, None), (windowed, 0, None)]:
        out = torch.full_like(case.q, float("nan"))
        got = gluon_prefill_choice(case.q, case.k, case.v, out, case.window, None, case.cached_lens, max_k)
        assert got == want, (case.window, max_k, got)
        ref = ref_ops.attention(*case.args())
        res = attention(*case.args(), max_seqlen_q=300, max_seqlen_k=max_k, out=out)
        torch.cuda.synchronize()
        check_output(res, out, ref, case.cu_seqlens_q, TOL)
    monkeypatch.setenv(GLUON_ENV, "no_such_config")
    with pytest.raises(ValueError, match="not a Gluon prefill configuration"):
        attention(*plain.args(), max_seqlen_q=300, max_seqlen_k=0)
    monkeypatch.setenv(GLUON_ENV, "0")
    assert gluon_prefill_choice(plain.q, plain.k, plain.v, plain.q, 0, None, plain.cached_lens, 0) is None


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
def test_gpu_registered_default(monkeypatch):
    """Without the variable the op takes ``GLUON_DEFAULT`` (a config of CONFIGS) on a Hopper GPU, and a
    caller's tile config keeps the Triton kernel."""
    G = _gluon()
    from dayzero.kernels.triton_attention_prefill import GLUON_DEFAULT, GLUON_ENV, gluon_prefill_choice

    monkeypatch.delenv(GLUON_ENV, raising=False)
    assert GLUON_DEFAULT in G.CONFIGS
    c = make_case([200], [0], seed=35, device="cuda")
    hopper = torch.cuda.get_device_capability() == (9, 0)
    assert gluon_prefill_choice(c.q, c.k, c.v, c.q, 0, None, c.cached_lens, 0) == (GLUON_DEFAULT if hopper else None)
    assert gluon_prefill_choice(c.q, c.k, c.v, c.q, 0, dict(BLOCK_M=64), c.cached_lens, 0) is None
