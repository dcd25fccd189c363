"""Gluon sliding-window prefill (``gluon_attention_window``, opt-in, window <= 128, head dim 64, no cached
prefix) vs the torch reference op.

CPU tests (no triton, run in CI): ``gluon_attention_window_schedule.emulate_window`` (and, for version 2's
``pk*`` configurations, ``emulate_window_packed``, its masks checked key by key) runs the kernel's tile
schedule (CTA / warpgroup rows, the resident window's tiles, which are loaded, scored, masked; TMA reads past
a sequence and past T; the sink rule) in torch and must match the reference; ``cta_tiles`` is checked
against the visibility rule key by key; a wrong window makes the emulation fail (the check can fail).
GPU tests (marked ``gpu``; skipped without CUDA or triton): fresh random inputs per case, the output
poisoned with NaN (an unwritten element fails), relative error per sequence < 1e-2 against the reference;
ragged lengths around every tile edge (and version 2's 16-token units), sinks from very negative (no sink) to
large, scores spread over hundreds of log2 units, keys whose scores keep growing, windows 128 / 100 / 1;
unsupported calls raise.
"""

from __future__ import annotations

import os

import pytest
import torch

from dayzero.kernels import torch_attention as ref_ops
from dayzero.kernels.gluon_attention_window_schedule import (BN, MAX_WINDOW, PK_KEYS, PK_TOK, WM,
                                                             check_window_supported, cta_tiles, emulate_window,
                                                             emulate_window_packed, kv_ring_holds_window,
                                                             kv_ring_protocol, packed_bounds, packed_chunk,
                                                             packed_cta_units, ring_waits_every_phase)
from dayzero.kernels.triton_attention_cases import check_output, make_case, seq_errors

TOL = 1e-2
CUDA = torch.cuda.is_available()
# lengths around every edge of 64-row warpgroups, 128 / 192-row CTAs and 64-key tiles
EDGES = [1, 2, 63, 64, 65, 127, 128, 129, 191, 192, 193, 255, 256, 257, 300]
GPU_EDGES = EDGES + [15, 16, 17, 33]   # and version 2's 16-token units


# ---------------------------------------------------------------- CPU: the schedule in torch ----

@pytest.mark.parametrize("tb", [1, 2, 3])
@pytest.mark.parametrize("window", [128, 100, 1])
def test_window_emulation_matches_reference(tb, window):
    """Every tile edge in one ragged batch (next sequences' rows read past each end, zeros past T)."""
    case = make_case([129, 1, 64, 193, 300, 2, 65], [0] * 7, hq=16, hkv=2, window=window, sinks="mixed",
                     dtype=torch.bfloat16, device="cpu", seed=3 + tb + window)
    ref = ref_ops.attention(*case.args())
    out = emulate_window(case.q, case.k, case.v, case.cu_seqlens_q, case.sinks, case.scale, window, tb)
    assert not out.isnan().any(), "the schedule left rows unwritten"
    errs = seq_errors(out, ref, case.cu_seqlens_q)
    assert max(errs) < TOL, errs


@pytest.mark.parametrize("sinks", ["neg", "large"])
def test_window_emulation_extreme(sinks):
    case = make_case([257, 70], [0, 0], hq=8, hkv=1, window=128, sinks=sinks, dtype=torch.bfloat16, device="cpu",
                     seed=11)
    case.q.mul_(30.0)  # scores over hundreds of log2 units
    ref = ref_ops.attention(*case.args())
    out = emulate_window(case.q, case.k, case.v, case.cu_seqlens_q, case.sinks, case.scale, 128)
    assert max(seq_errors(out, ref, case.cu_seqlens_q)) < TOL


def test_window_emulation_check_can_fail():
    """A window one key too narrow is caught: the reference and the emulation then differ."""
    case = make_case([300], [0], hq=8, hkv=1, window=128, dtype=torch.bfloat16, device="cpu", seed=13)
    ref = ref_ops.attention(*case.args())
    out = emulate_window(case.q, case.k, case.v, case.cu_seqlens_q, case.sinks, case.scale, 127)
    assert max(seq_errors(out, ref, case.cu_seqlens_q)) > TOL


@pytest.mark.parametrize("tb", [1, 2, 3])
@pytest.mark.parametrize("window", [128, 100, 1])
def test_cta_tiles_cover_the_window(tb, window):
    """Key by key: every key a stored row sees lies in a tile its warpgroup scores; an unmasked scored tile
    holds no key that row must not see; scored tiles are loaded, lie in the sequence and in the CTA's
    resident window; every loaded tile is scored by some live warpgroup (no TMA copy left in flight)."""
    for q_len in EDGES + [1000, 1024, 1025]:
        for m_start in range(0, q_len, WM * tb):
            i_lo, i_hi, wgs = cta_tiles(q_len, m_start, tb, window)
            assert 0 <= i_lo < i_hi <= tb + 2
            assert [wg.r0 for wg in wgs] == [r for r in range(m_start, min(m_start + WM * tb, q_len), WM)]
            scored = set()
            for wg in wgs:
                assert wg.tiles == sorted(wg.tiles) and wg.masked[0] and wg.masked[-1]
                scored |= set(wg.tiles)
                for i, masked in zip(wg.tiles, wg.masked):
                    base = m_start - 2 * BN + i * BN
                    assert i_lo <= i < i_hi and 0 <= base < q_len
                    for r in range(wg.r0, min(wg.r0 + WM, q_len)):
                        vis = [key for key in range(base, base + BN) if 0 <= r - key < window]
                        if not masked:
                            assert len(vis) == BN, (q_len, m_start, wg.r0, i, r)
                for r in range(wg.r0, min(wg.r0 + WM, q_len)):
                    for key in range(max(0, r - window + 1), r + 1):
                        i = (key - (m_start - 2 * BN)) // BN
                        assert i in wg.tiles, (q_len, m_start, r, key)
            assert scored == set(range(i_lo, i_hi))


# ---- version 2 (gluon_attention_window_packed): GQA-packed units of 4 heads x 16 tokens, 144 keys each ----

@pytest.mark.parametrize("window,ups", [(128, 1), (128, 2), (100, 1), (1, 2)])
def test_packed_emulation_matches_reference(window, ups):
    """Version 2's arithmetic (one 128 + 16 ups key tile a unit, the sink in the row max, keys below the
    sequence from the previous one or TMA zero fill) on a ragged batch: every unit / slot edge, GQA group 8."""
    case = make_case([129, 1, 16, 33, 193, 2, 65], [0] * 7, hq=16, hkv=2, window=window, sinks="mixed",
                     dtype=torch.bfloat16, device="cpu", seed=31 + window)
    ref = ref_ops.attention(*case.args())
    out = emulate_window_packed(case.q, case.k, case.v, case.cu_seqlens_q, case.sinks, case.scale, window, ups)
    assert not out.isnan().any(), "the schedule left rows unwritten"
    errs = seq_errors(out, ref, case.cu_seqlens_q)
    assert max(errs) < TOL, errs


@pytest.mark.parametrize("sinks", ["neg", "large"])
def test_packed_emulation_extreme(sinks):
    case = make_case([257, 70], [0, 0], hq=8, hkv=1, window=128, sinks=sinks, dtype=torch.bfloat16, device="cpu",
                     seed=37)
    case.q.mul_(30.0)  # scores over hundreds of log2 units
    ref = ref_ops.attention(*case.args())
    out = emulate_window_packed(case.q, case.k, case.v, case.cu_seqlens_q, case.sinks, case.scale, 128)
    assert max(seq_errors(out, ref, case.cu_seqlens_q)) < TOL


def test_packed_check_can_fail():
    """A window one key too narrow is caught by the same comparison."""
    case = make_case([300], [0], hq=8, hkv=1, window=128, dtype=torch.bfloat16, device="cpu", seed=41)
    ref = ref_ops.attention(*case.args())
    out = emulate_window_packed(case.q, case.k, case.v, case.cu_seqlens_q, case.sinks, case.scale, 127)
    assert max(seq_errors(out, ref, case.cu_seqlens_q)) > TOL


@pytest.mark.parametrize("ups", [1, 2])
@pytest.mark.parametrize("window", [128, 100, 64, 1])
def test_packed_bounds_are_the_window(window, ups):
    """Key by key: the kernel's columns lo[r] .. hi[r] of unit toff / 16 of a slot at t0 are exactly the keys
    row r's token may see (key >= 0, key <= token, token - key < window), all in the slot's 128 + 16 ups."""
    nk = PK_KEYS + PK_TOK * (ups - 1)
    for t0 in range(0, 400, PK_TOK * ups):
        for toff in range(0, PK_TOK * ups, PK_TOK):
            lo, hi = packed_bounds(t0, window, toff)
            for r in range(WM):
                t = t0 + toff + r % PK_TOK
                cols = {c for c in range(nk) if lo[r] <= c <= hi[r]}
                want = {key - (t0 - 128) for key in range(max(0, t - window + 1), t + 1)}
                assert cols == want, (t0, toff, r, window)
                assert hi[r] < nk


def test_packed_chunks_cover_the_sequence():
    """Chunks of units: every unit of the longest sequence in exactly one CTA, ~one CTA per SM, >= min_units."""
    for n, streams, sms, min_units, ups in [(8192, 8, 132, 8, 1), (32768, 8, 132, 8, 2), (1, 8, 132, 8, 2),
                                            (300, 16, 132, 8, 1), (100000, 1, 132, 2, 2), (64, 8, 1, 1, 1),
                                            (49, 8, 132, 1, 2)]:
        per, chunks = packed_chunk(n, streams, sms, min_units, ups)
        units = -(-n // PK_TOK)
        assert per >= 1 and per % ups == 0 and per * chunks >= units and per * (chunks - 1) < units
        assert per >= min(min_units, units)
        if min_units < per < units:                    # sized by the SM count, not a bound
            assert chunks * streams <= 2 * sms


def test_check_window_supported_refuses():
    case = make_case([100], [0], hq=8, hkv=1, window=128, device="cpu")
    out = torch.empty_like(case.q)
    check_window_supported(case.q, case.k, case.v, out, 128)
    for w in (0, MAX_WINDOW + 1):
        with pytest.raises(ValueError, match="window"):
            check_window_supported(case.q, case.k, case.v, out, w)
    half = make_case([100], [0], hq=8, hkv=1, dtype=torch.float16, device="cpu")
    with pytest.raises(ValueError, match="bf16"):
        check_window_supported(half.q, half.k, half.v, torch.empty_like(half.q), 128)
    wide = make_case([100], [0], hq=8, hkv=1, d=128, device="cpu")
    with pytest.raises(ValueError, match="64"):
        check_window_supported(wide.q, wide.k, wide.v, torch.empty_like(wide.q), 128)
    odd = make_case([100], [0], hq=12, hkv=8, device="cpu")
    with pytest.raises(ValueError, match="multiple"):
        check_window_supported(odd.q, odd.k, odd.v, torch.empty_like(odd.q), 128)


def test_registered_window_choice_env(monkeypatch):
    """The registered op's switch (needs triton to import, no GPU): DAYZERO_WINDOW_GLUON=0 / empty is off, an
    unknown name raises, and CPU tensors never take the Gluon kernel."""
    pytest.importorskip("triton", reason="the registered op's module needs triton")
    from dayzero.kernels.triton_attention_prefill import WINDOW_GLUON_ENV, gluon_window_choice

    case = make_case([40], [0], window=128, device="cpu")
    args = (case.q, case.k, case.v, case.q, 128, None, case.cached_lens, 0)
    for off in ("0", ""):
        monkeypatch.setenv(WINDOW_GLUON_ENV, off)
        assert gluon_window_choice(*args) is None
    for bad in ("no_such_config", "pkL3", "pk3s_ns"):          # (the diagnostics write wrong output)
        monkeypatch.setenv(WINDOW_GLUON_ENV, bad)
        with pytest.raises(ValueError, match="not a Gluon window configuration"):
            gluon_window_choice(*args)
    monkeypatch.delenv(WINDOW_GLUON_ENV)
    assert gluon_window_choice(*args) is None                      # not on a GPU


def test_no_cached_prefix_rule():
    """Both Gluon prefill choices' prefix rule (needs triton to import, no GPU): the engine's max_seqlen_k
    decides when given; without it the cached lengths are read."""
    pytest.importorskip("triton", reason="the registered op's module needs triton")
    from dayzero.kernels.triton_attention_prefill import no_cached_prefix

    zeros, some = torch.zeros(3, dtype=torch.int32), torch.tensor([0, 5, 0], dtype=torch.int32)
    assert no_cached_prefix(some, 0) and not no_cached_prefix(zeros, 7)     # the hint wins
    assert no_cached_prefix(zeros, None) and not no_cached_prefix(some, None)


def test_packed_ring_phase_rule():
    """Consumers wait for a slot by the parity of its phase: a warpgroup that skips a phase of a barrier can pass a
    wait early (round 2's load-only pkL2 faulted on the GPU). 3 round-robin warpgroups over one-unit slots need a
    multiple of 3 slots; a warpgroup per quad (nc 2) or 2-unit slots (every warpgroup in every slot) any count."""
    assert ring_waits_every_phase(3, 3, 1) and ring_waits_every_phase(3, 6, 1)
    assert not ring_waits_every_phase(3, 2, 1) and not ring_waits_every_phase(3, 4, 1)
    assert all(ring_waits_every_phase(2, st, 1) for st in (2, 3, 4))
    assert all(ring_waits_every_phase(3, st, 2) for st in (2, 3, 4))


def test_kv_ring_holds_every_window():
    """The group ring (``kv_ring``): 16 groups + 8 mirrored rows hold every in-flight unit's 8-group window as
    contiguous rows and its new group, for up to 8 Q slots; with 9 a load overwrites a group still in use."""
    assert all(kv_ring_holds_window(st) for st in (1, 3, 6, 8))
    assert not kv_ring_holds_window(9)
    assert not kv_ring_holds_window(3, ng=10)


def test_kv_ring_protocol_hang_and_fix():
    """The group ring's barrier protocol (``kv_ring_protocol``: mbarrier phases, arrival counts, expect-tx bytes, TMA
    landing at any time) over the CTAs the GPU tests launch (132 SMs). Session 8's build waited for groups 0 .. v + 8
    at every item (its loop-carried ``gw`` compiled away): a CTA of more than 8 units waits on a ring row's phase
    already passed twice and hangs, under every schedule; the registered-op tests' CTAs (8 units at most) pass. The
    kernel's waits now (from the warpgroup's previous unit + 9) finish every CTA, with every wait on its own phase and
    no ring row or Q slot overwritten while read."""
    edges = [1, 2, 63, 64, 65, 127, 128, 129, 191, 192, 193, 255, 256, 257, 300, 15, 16, 17, 33]   # = GPU_EDGES
    direct = set(packed_cta_units(edges, 8, 132, 8)) | set(packed_cta_units([4096 + 77, 1100, 5], 8, 132, 8))
    registered = set(packed_cta_units([300, 129, 1, 17], 8, 132, 8)) | set(
        packed_cta_units([1, 17, 128, 300, 64, 129], 8, 132, 8))
    assert max(registered) <= 8 < max(direct)
    bench = set(packed_cta_units([8192], 8, 132, 8)) | set(packed_cta_units([32768], 8, 132, 8))
    for stages in (3, 6):
        for n in sorted(direct | registered | bench):
            for seed in (None, 0, 1, 2):
                old = kv_ring_protocol(n, stages, 3, "from0", seed)
                assert old["done"] == (n <= 8), (stages, n, seed, old["stuck"])
                new = kv_ring_protocol(n, stages, 3, "fixed", seed)
                assert new["done"] and not new["violations"], (stages, n, seed, new)
    # the model sees a ring too small (9 Q slots: a group overwritten while read), as kv_ring_holds_window does
    assert any(kv_ring_protocol(40, 9, 3, "fixed", seed)["violations"] for seed in range(4))


def test_kv_ring_group_waits_compiled():
    """sm_90 build on the CPU (needs triton, no GPU): the consumers' group-wait loops in pk3sr's TTGIR start at a
    computed bound. Session 8's build started them at constant 0 (the Gluon canonicalizer replaced the yield of the
    loop-carried ``gw``, used only as that loop's lower bound, by ``gw`` itself): every item re-waited every group."""
    pytest.importorskip("triton", reason="the Gluon kernel needs triton")
    import importlib.util
    import pathlib
    import re
    import sys
    bench = pathlib.Path(__file__).resolve().parents[2] / "bench"
    sys.path[:0] = [str(bench), str(bench / "attention")]
    try:
        spec = importlib.util.spec_from_file_location("gluon_window_compile", bench / "attention" /
                                                      "gluon_window_compile.py")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        builds = []
        real = mod.build_sm90
        mod.build_sm90 = lambda *a, **k: builds.append(real(*a, **k)) or builds[-1]
        mod.check_packed("pk3sr")
    finally:
        del sys.path[:2]
    loops = re.findall(r"scf\.for %lg = (%\S+) to (%\S+)", builds[-1].ttgir)
    waits = [(lo, hi) for lo, hi in loops if not hi.startswith("%c")]    # (the producer's first 8 groups: 0 to 8)
    assert len(waits) == 3 and not any(lo.startswith("%c") for lo, _ in waits), loops


def test_packed_diagnostics_are_fenced():
    """The diagnostic configurations (wrong output by design, timed only) are in CONFIGS, never in RUN_CONFIGS
    or the registered default, and only the serial consumers build them (needs triton to import, no GPU)."""
    pytest.importorskip("triton", reason="the Gluon modules need triton")
    from dayzero.kernels import gluon_attention_window as G
    from dayzero.kernels.gluon_attention_window_packed import GluonWindowPackedConfig, _diag_mode
    from dayzero.kernels.triton_attention_prefill import WINDOW_GLUON_DEFAULT

    assert set(G.DIAG_CONFIGS) <= set(G.CONFIGS) and not set(G.DIAG_CONFIGS) & set(G.RUN_CONFIGS)
    assert WINDOW_GLUON_DEFAULT not in G.DIAG_CONFIGS
    assert all(_diag_mode(G.CONFIGS[c]) > 0 for c in G.DIAG_CONFIGS)
    assert all(_diag_mode(c) == 0 for n, c in G.CONFIGS.items()
               if isinstance(c, GluonWindowPackedConfig) and n not in G.DIAG_CONFIGS)
    with pytest.raises(ValueError, match="serial"):
        _diag_mode(GluonWindowPackedConfig(diag=1))
    with pytest.raises(ValueError, match="diag must be"):
        _diag_mode(GluonWindowPackedConfig(serial=True, diag=3))
    from dayzero.kernels.gluon_attention_window_packed import _store_mode
    for c in G.CONFIGS.values():   # every listed ring waits every phase (refused at launch otherwise)
        if isinstance(c, GluonWindowPackedConfig):
            _store_mode(c)
    with pytest.raises(ValueError, match="skip phases"):
        _store_mode(GluonWindowPackedConfig(nc=3, serial=True, stages=4))
    for bad in (dict(stages=9), dict(ups=2), dict(store_via_q=True), dict(prefetch=4)):   # the group ring: 16 >= 8 + S
        with pytest.raises(ValueError, match="kv_ring"):
            _store_mode(GluonWindowPackedConfig(nc=3, serial=True, kv_ring=True, **bad))


# ---------------------------------------------------------------- GPU ----

def _gluon():
    pytest.importorskip("triton", reason="the Gluon kernel needs triton")
    from dayzero.kernels import gluon_attention_window as G
    return G


def _run(case, cfg_name: str) -> list[float]:
    G = _gluon()
    from gpu_util import poison
    ref = ref_ops.attention(*case.args())
    poison()
    out = torch.full_like(case.q, float("nan"))
    max_q = int((case.cu_seqlens_q[1:] - case.cu_seqlens_q[:-1]).max())
    res = G.window_attention(*case.args(), max_q, out, config=G.CONFIGS[cfg_name])
    torch.cuda.synchronize()
    return check_output(res, out, ref, case.cu_seqlens_q, TOL)


# = gluon_attention_window.RUN_CONFIGS (checked below)
ALL_CFGS = ["g4", "pk3s", "pk2s"]
# DAYZERO_GLUON_WINDOW_CFGS=a,b: only these (gluon_window_run.sh tests one configuration per process)
CFGS = [c for c in os.environ.get("DAYZERO_GLUON_WINDOW_CFGS", "").split(",") if c] or ALL_CFGS


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("cfg", CFGS)
@pytest.mark.parametrize("sinks", ["normal", "neg", "large", "mixed"])
def test_gpu_window_ragged_edges(cfg, sinks):
    """All tile-edge lengths in one batch: rows past each end read the next sequence, the last past T."""
    _run(make_case(GPU_EDGES, [0] * len(GPU_EDGES), window=128, sinks=sinks, seed=17 + len(sinks), device="cuda"), cfg)


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("cfg", CFGS)
@pytest.mark.parametrize("window", [100, 1])
def test_gpu_window_narrow(cfg, window):
    """A window below 128: the middle tile is masked too (MID_MASK); and a call of 5 tokens (T below every TMA
    box: version 2's Q / K boxes of 16 / 128 rows read zero fill past T and below row 0)."""
    _run(make_case([300, 129, 1, 64], [0] * 4, window=window, sinks="mixed", seed=19 + window, device="cuda"), cfg)
    _run(make_case([5], [0], window=window, sinks="mixed", seed=29 + window, device="cuda"), cfg)


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("cfg", CFGS)
def test_gpu_window_long_and_extreme_scores(cfg):
    n = 4096 + 77
    _run(make_case([n, 1100, 5], [0, 0, 0], window=128, sinks="normal", seed=5, device="cuda"), cfg)
    case = make_case([n, 3], [0, 0], window=128, sinks="mixed", seed=6, device="cuda")
    case.q.mul_(40.0)  # most probabilities underflow to 0
    _run(case, cfg)
    case = make_case([n], [0], window=128, sinks="large", seed=7, device="cuda")
    ramp = torch.linspace(0.2, 4.0, n, device="cuda", dtype=torch.float32)[:, None, None]
    case.k.copy_((case.k.float() * ramp).to(case.k.dtype))  # each row's max keeps rising
    _run(case, cfg)


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("cfg", CFGS)
def test_gpu_window_matches_emulation(cfg):
    """The kernel and its torch schedule agree much closer than either to the bf16 reference tolerance."""
    G = _gluon()
    c = G.CONFIGS[cfg]
    case = make_case([300, 129], [0, 0], hq=16, hkv=2, window=128, sinks="mixed", seed=23, device="cuda")
    out = torch.full_like(case.q, float("nan"))
    G.window_attention(*case.args(), 300, out, config=c)
    cpu = (case.q.cpu(), case.k.cpu(), case.v.cpu(), case.cu_seqlens_q.cpu(), case.sinks.cpu(), case.scale, 128)
    emu = emulate_window_packed(*cpu, ups=c.ups) if cfg.startswith("pk") else emulate_window(*cpu, tb=c.tb)
    assert max(seq_errors(out.cpu(), emu.to(torch.bfloat16), case.cu_seqlens_q.cpu())) < 5e-3


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
def test_gpu_window_configs_listed():
    G = _gluon()
    assert tuple(ALL_CFGS) == G.RUN_CONFIGS and set(CFGS) <= set(G.CONFIGS)


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
def test_gpu_window_unsupported_calls_raise():
    G = _gluon()
    case = make_case([100], [0], window=128, device="cuda")
    out = torch.empty_like(case.q)
    args = list(case.args())
    for w in (0, 129):
        with pytest.raises(ValueError, match="window"):
            G.window_attention(*args[:10], w, 100, out)
    prefixed = make_case([100], [40], window=128, device="cuda")
    with pytest.raises(ValueError, match="prefix"):
        G.window_attention(*prefixed.args(), 100, torch.empty_like(prefixed.q))
    for bad in (G.GluonWindowConfig(tb=1, hw=1), G.GluonWindowConfig(tb=1, hw=2, hpc=3),
                G.GluonWindowConfig(tb=2, hw=2, hpc=2, producer=True)):
        with pytest.raises(ValueError, match="warpgroups"):
            G.window_attention(*case.args(), 100, out, config=bad)
    g4 = make_case([100], [0], hq=16, hkv=4, window=128, device="cuda")       # version 2 needs a group of 8
    with pytest.raises(ValueError, match="group of 8"):
        G.window_attention(*g4.args(), 100, torch.empty_like(g4.q), config=G.CONFIGS["pk3"])


# ---------------------------------------------------------------- the registered op's window path ----

# DAYZERO_WINDOW_REG_CFGS=a,b: the configurations the registered-op tests run under DAYZERO_WINDOW_GLUON (default:
# the shipped one); gluon_window_run.sh runs the candidates, so a default that moves had these tests pass too
REG_CFGS = [c for c in os.environ.get("DAYZERO_WINDOW_REG_CFGS", "").split(",") if c] or ["default"]


def _reg_name(cfg: str) -> str:
    from dayzero.kernels.triton_attention_prefill import WINDOW_GLUON_DEFAULT
    return WINDOW_GLUON_DEFAULT if cfg == "default" else cfg


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("cfg", REG_CFGS)
def test_gpu_registered_window_dispatch(cfg, monkeypatch):
    """DAYZERO_WINDOW_GLUON=cfg: the registered op (``triton_attention.attention``) runs the Gluon window kernel for
    window-128 prefill without a cached prefix (``max_seqlen_k`` 0, or not given: checked on the host) and the
    Triton kernels for a prefix, another window, max_seqlen_k > 0, a caller's config or another GQA group; every
    output matches the reference."""
    G = _gluon()
    from dayzero.kernels.triton_attention import attention
    from dayzero.kernels.triton_attention_prefill import WINDOW_GLUON_ENV, gluon_window_choice

    name = _reg_name(cfg)
    assert name in G.CONFIGS
    monkeypatch.setenv(WINDOW_GLUON_ENV, name)
    plain = make_case([300, 129, 1, 17], [0, 0, 0, 0], window=128, sinks="mixed", seed=51, device="cuda")
    prefixed = make_case([300, 129], [0, 77], window=128, sinks="mixed", seed=52, device="cuda")
    narrow = make_case([300, 129], [0, 0], window=100, sinks="mixed", seed=53, device="cuda")
    full = make_case([300, 129], [0, 0], window=0, sinks="mixed", seed=54, device="cuda")
    group4 = make_case([300, 129], [0, 0], hq=16, hkv=4, window=128, sinks="mixed", seed=55, device="cuda")
    cases = [(plain, None, name), (plain, 0, name), (plain, 5, None), (prefixed, None, None), (prefixed, 77, None),
             (narrow, 0, None)]
    if isinstance(G.CONFIGS[name], G.GluonWindowPackedConfig):
        cases.append((group4, 0, None))                  # version 2 needs a GQA group of 8
    for case, max_k, want in cases:
        out = torch.full_like(case.q, float("nan"))
        got = gluon_window_choice(case.q, case.k, case.v, out, case.window, None, case.cached_lens, max_k)
        assert got == want, (case.window, max_k, got)
        ref = ref_ops.attention(*case.args())
        res = attention(*case.args(), max_seqlen_q=300, max_seqlen_k=max_k, out=out)
        torch.cuda.synchronize()
        check_output(res, out, ref, case.cu_seqlens_q, TOL)
    assert gluon_window_choice(plain.q, plain.k, plain.v, plain.q, 128, dict(KERNEL="window"), plain.cached_lens,
                               0) is None
    assert gluon_window_choice(full.q, full.k, full.v, full.q, 0, None, full.cached_lens, 0) is None
    monkeypatch.setenv(WINDOW_GLUON_ENV, "no_such_config")
    with pytest.raises(ValueError, match="not a Gluon window configuration"):
        attention(*plain.args(), max_seqlen_q=300, max_seqlen_k=0)
    monkeypatch.setenv(WINDOW_GLUON_ENV, "0")
    assert gluon_window_choice(plain.q, plain.k, plain.v, plain.q, 128, None, plain.cached_lens, 0) is None


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
def test_gpu_registered_window_default(monkeypatch):
    """Without the variable the op takes ``WINDOW_GLUON_DEFAULT`` (a configuration of CONFIGS) on a Hopper GPU for a
    long window-128 prefill (8k tokens in 3 sequences) and matches the reference."""
    G = _gluon()
    from dayzero.kernels.triton_attention import attention
    from dayzero.kernels.triton_attention_prefill import WINDOW_GLUON_DEFAULT, WINDOW_GLUON_ENV, gluon_window_choice

    monkeypatch.delenv(WINDOW_GLUON_ENV, raising=False)
    assert WINDOW_GLUON_DEFAULT in G.CONFIGS
    c = make_case([4096 + 33, 3000, 1067], [0, 0, 0], window=128, sinks="normal", seed=57, device="cuda")
    hopper = torch.cuda.get_device_capability() == (9, 0)
    assert gluon_window_choice(c.q, c.k, c.v, c.q, 128, None, c.cached_lens, 0) == (
        WINDOW_GLUON_DEFAULT if hopper else None)
    ref = ref_ops.attention(*c.args())
    out = torch.full_like(c.q, float("nan"))
    res = attention(*c.args(), max_seqlen_q=4096 + 33, max_seqlen_k=0, out=out)
    torch.cuda.synchronize()
    check_output(res, out, ref, c.cu_seqlens_q, TOL)
