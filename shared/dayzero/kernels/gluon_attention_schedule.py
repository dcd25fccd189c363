"""The tile schedule and mbarrier protocol of the Gluon ping-pong prefill kernel (``gluon_attention_prefill``)
in plain Python / torch.

No triton here: CI (no GPU, no triton) checks ``emulate`` against the torch reference op, so the
kernel's index logic (which query rows a CTA and a warpgroup own, which key tiles it walks, which of
them are masked, what TMA reads past a sequence or past T, how the sink joins the softmax) is checked
without a GPU; ``simulate_protocol`` steps its producer / consumer waits and arrives (K/V ring, empties,
turns) at random interleavings and reports deadlocks and stage hazards. Gluon kernels cannot run in
TRITON_INTERPRET, so these are the CPU checks of that logic; keep them in step with the kernel.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

LOG2E = 1.4426950408889634
WM = 64      # query rows per consumer warpgroup
HEAD_D = 64  # the one head dim the kernel supports


@dataclass(frozen=True)
class CtaTiles:
    """The key tiles one CTA (query tile) walks: tile 0 (masked), [1, n_full) unmasked, then masked ones."""

    m_start: int   # first query index of the CTA within its sequence
    n_full: int    # tiles [0, n_full) are seen whole by every row of the CTA
    n_tiles: int   # tiles [0, n_tiles) cover keys [0, min(m_start + BM, q_len))


def tile_plan(q_len: int, block_m: int, block_n: int) -> list[CtaTiles]:
    """What the kernel's prologue computes for each query tile of a sequence of ``q_len`` new tokens."""
    plan = []
    for m_start in range(0, q_len, block_m):
        m_end = min(m_start + block_m, q_len)
        plan.append(CtaTiles(m_start, (m_start + 1) // block_n, -(-m_end // block_n)))
    return plan


def check_tensors(what: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor) -> None:
    """Raise ValueError unless q [T, Hq, 64], k / v [T, Hkv, 64] (Hq a multiple of Hkv) and out are bf16 with
    the rows a TMA descriptor can read (what: the kernel's name, for the message)."""
    if q.dim() != 3 or k.dim() != 3 or v.dim() != 3 or q.shape[2] != HEAD_D or k.shape[2] != HEAD_D \
            or v.shape != k.shape or q.shape[0] != k.shape[0]:
        raise ValueError(f"the {what} kernel needs q [T, Hq, 64], k/v [T, Hkv, 64]; got {tuple(q.shape)}, "
                         f"{tuple(k.shape)}, {tuple(v.shape)}")
    if q.shape[1] % k.shape[1]:
        raise ValueError(f"query heads {q.shape[1]} are not a multiple of KV heads {k.shape[1]}")
    if any(t.dtype != torch.bfloat16 for t in (q, k, v, out)):
        raise ValueError(f"the {what} kernel needs bf16 q, k, v and out")
    if out.shape != q.shape or out.stride(2) != 1:
        raise ValueError(f"out must be [T, Hq, 64] with contiguous rows, got {tuple(out.shape)}")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.stride(2) != 1 or t.stride(1) != HEAD_D or (t.stride(0) * 2) % 16 or t.data_ptr() % 16:
            raise ValueError(f"{name} must have contiguous [H, 64] rows at 16-byte aligned strides (TMA)")


def check_supported(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, window: int,
                    block_n: int, nwg: int) -> None:
    """Raise ValueError unless the kernel supports this call (full causal, D 64, bf16, TMA-able rows)."""
    if window != 0:
        raise ValueError(f"the Gluon prefill kernel is full causal only (window {window})")
    check_tensors("Gluon prefill", q, k, v, out)
    if block_n not in (64, 128) or nwg not in (2, 3):
        raise ValueError(f"block_n must be 64 or 128 and nwg 2 or 3 (got {block_n}, {nwg})")


def _rows(t: torch.Tensor, first: int, n: int) -> torch.Tensor:
    """Rows [first, first + n) of t [T, ...] as TMA reads them: zero past T (``first`` >= 0 here)."""
    blk = t.new_zeros((n, ) + tuple(t.shape[1:]))
    stop = min(first + n, t.shape[0])
    if stop > first:
        blk[:stop - first] = t[first:stop]
    return blk


def online_step(m: torch.Tensor, l_: torch.Tensor, o: torch.Tensor, s: torch.Tensor,
                vt: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One key tile of the kernels' online softmax in log2 units: s [WM, BN] scaled scores (masked -inf),
    vt [BN, D]; P is rounded to bf16 before the PV product, as the wgmma operand is."""
    m_new = torch.maximum(m, s.max(1).values)
    p = torch.exp2(s - m_new[:, None])
    alpha = torch.exp2(m - m_new)
    return m_new, l_ * alpha + p.sum(1), o * alpha[:, None] + p.to(torch.bfloat16).float() @ vt


def finish_with_sink(m: torch.Tensor, l_: torch.Tensor, o: torch.Tensor, sink: float) -> torch.Tensor:
    """The epilogue: the head's sink logit joins the denominator once; returns O / l [WM, D]."""
    sink = sink * LOG2E
    m_f = torch.clamp(m, min=sink)
    alpha = torch.exp2(m - m_f)
    return o * (alpha / (l_ * alpha + torch.exp2(sink - m_f)))[:, None]


def emulate(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor, sinks: torch.Tensor,
            scale: float, nwg: int = 2, block_n: int = 128) -> torch.Tensor:
    """The kernel's computation, CTA by CTA and warpgroup by warpgroup, in float32 with P rounded to
    bf16 before the PV product: q [T, Hq, D], k/v [T, Hkv, D] (no cached prefix) -> [T, Hq, D] float32.
    Rows past a sequence's end are computed from what TMA reads there (next sequence / zeros) and
    dropped at the store, as in the kernel."""
    T, Hq, D = q.shape
    group = Hq // k.shape[1]
    out = torch.full((T, Hq, D), float("nan"))
    cu = cu_seqlens_q.tolist()
    qk_scale = scale * LOG2E
    bm = WM * nwg
    for b in range(len(cu) - 1):
        q_start, q_len = cu[b], cu[b + 1] - cu[b]
        for cta in tile_plan(q_len, bm, block_n):
            for h in range(Hq):
                kv = h // group
                for wg in range(nwg):
                    r0 = cta.m_start + wg * WM
                    qt = _rows(q[:, h].float(), q_start + r0, WM)               # [WM, D]
                    rows = torch.arange(r0, r0 + WM)
                    m = torch.full((WM, ), -1.0e30)
                    l_ = torch.zeros(WM)
                    o = torch.zeros(WM, D)
                    for j in range(cta.n_tiles):
                        kt = _rows(k[:, kv].float(), q_start + j * block_n, block_n)  # [BN, D]
                        vt = _rows(v[:, kv].float(), q_start + j * block_n, block_n)
                        s = qt @ kt.T * qk_scale                                   # [WM, BN]
                        if j == 0 or j >= cta.n_full:                              # masked tiles
                            cols = j * block_n + torch.arange(block_n)
                            s = s.masked_fill(cols[None, :] > rows[:, None], float("-inf"))
                        m, l_, o = online_step(m, l_, o, s, vt)
                    res = finish_with_sink(m, l_, o, float(sinks[h]))
                    keep = rows < q_len
                    out[q_start + rows[keep], h] = res[keep]
    return out


# ---- the mbarrier protocol, step by step (deadlocks and stage hazards without a GPU) ----

class ProtocolError(RuntimeError):
    """A deadlock, or a K/V stage read before its tile landed or overwritten while a warpgroup reads it."""


class _Barrier:
    """An mbarrier: ``count`` arrivals complete a phase; ``wait(parity)`` passes once the phase of that
    parity has completed (PTX try_wait.parity: passes while the completed-phase count's parity differs)."""

    def __init__(self, count: int):
        self.count, self.pending, self.completed = count, 0, 0

    def arrive(self) -> None:
        self.pending += 1
        if self.pending == self.count:
            self.completed, self.pending = self.completed + 1, 0

    def passes(self, parity: int) -> bool:
        return self.completed % 2 != parity


class _Running(_Barrier):
    """Not a barrier: a point where a warpgroup's wgmma runs (anything may happen meanwhile)."""

    def __init__(self):
        super().__init__(1)

    def passes(self, parity: int) -> bool:
        return True


def simulate_protocol(n_tiles: int, nwg: int = 2, stages: int = 2, pingpong: bool = True, seed: int = 0,
                      empty_parity_flip: int = 1, items: list[int] | None = None) -> int:
    """Run the kernel's producer and consumers (the same waits and arrives, in the same order, as
    ``gluon_attention_prefill``) for one CTA of ``n_tiles`` key tiles, interleaved at random (TMA copies
    land at random later points). ``items`` (key tiles per work item): the persistent kernel's walk
    (``gluon_attention_prefill_persistent``: two Q buffers released by both consumers after each item,
    ring and turns counted over the walk). Raises ProtocolError on a deadlock or a stage hazard; returns
    the number of steps. ``empty_parity_flip`` is the kernel's ``^ 1`` on the producer's first empty waits
    (a test passes 0 to see the check fail)."""
    import random
    rnd = random.Random(seed)
    persistent = items is not None
    items = list(items) if persistent else [n_tiles]
    q_ready, q_empty = [_Barrier(1) for _ in range(2)], [_Barrier(nwg) for _ in range(2)]
    k_ready, v_ready = [_Barrier(1) for _ in range(stages)], [_Barrier(1) for _ in range(stages)]
    k_empty, v_empty = [_Barrier(nwg) for _ in range(stages)], [_Barrier(nwg) for _ in range(stages)]
    turn = [_Barrier(1) for _ in range(nwg)]
    turn[0].arrive()                                          # warpgroup 0 has the first turn
    content = {"Q": [None] * 2, "K": [None] * stages, "V": [None] * stages}   # (item, tile) in each buffer
    readers = {"Q": [set(), set()], "K": [set() for _ in range(stages)], "V": [set() for _ in range(stages)]}
    landing = []                                              # TMA copies in flight: (kind, buffer, what, barrier)
    mma = _Running()

    def read(kind, s, what, who):
        if content[kind][s] != what:
            raise ProtocolError(f"{who} reads {kind} buffer {s} expecting {what}, holds {content[kind][s]}")
        readers[kind][s].add(who)

    def producer():
        it = 0
        for ic, nt in enumerate(items):
            qb = ic % 2 if persistent else 0
            if persistent:
                yield q_empty[qb], ((ic // 2) & 1) ^ empty_parity_flip
            landing.append(("Q", qb, (ic, 0), q_ready[qb]))
            for j in range(nt):
                s, ph = it % stages, ((it // stages) & 1) ^ empty_parity_flip
                yield k_empty[s], ph
                landing.append(("K", s, (ic, j), k_ready[s]))
                yield v_empty[s], ph
                landing.append(("V", s, (ic, j), v_ready[s]))
                it += 1

    def consumer(g):
        who = f"wg{g}"
        it = 0
        for ic, nt in enumerate(items):
            qb = ic % 2 if persistent else 0
            yield q_ready[qb], (ic // 2) & 1
            read("Q", qb, (ic, 0), who)
            s0 = it % stages
            yield k_ready[s0], (it // stages) & 1
            if pingpong:
                yield turn[g], it & 1
            read("K", s0, (ic, 0), who)
            if pingpong:
                turn[(g + 1) % nwg].arrive()
            yield mma, 0
            readers["K"][s0].discard(who)
            k_empty[s0].arrive()
            it += 1
            for j in range(1, nt):
                s, sp = it % stages, (it - 1) % stages
                yield k_ready[s], (it // stages) & 1
                yield v_ready[sp], ((it - 1) // stages) & 1
                if pingpong:
                    yield turn[g], it & 1
                read("K", s, (ic, j), who)
                read("V", sp, (ic, j - 1), who)
                if pingpong:
                    turn[(g + 1) % nwg].arrive()
                yield mma, 0                                  # S = Q K^T and O += P V run
                readers["K"][s].discard(who)
                k_empty[s].arrive()
                yield mma, 0                                  # the softmax; O += P V still runs
                readers["V"][sp].discard(who)
                v_empty[sp].arrive()
                it += 1
            sl = (it - 1) % stages
            yield v_ready[sl], ((it - 1) // stages) & 1
            read("V", sl, (ic, nt - 1), who)
            yield mma, 0
            readers["V"][sl].discard(who)
            v_empty[sl].arrive()
            readers["Q"][qb].discard(who)
            if persistent:
                q_empty[qb].arrive()

    procs = [producer()] + [consumer(g) for g in range(nwg)]
    waiting = [next(p) for p in procs]                        # each process's current (barrier, parity)
    steps = 0
    while any(w is not None for w in waiting) or landing:
        ready = [i for i, w in enumerate(waiting) if w is not None and w[0].passes(w[1])]
        if not ready and not landing:
            raise ProtocolError(f"deadlock after {steps} steps ({items} tiles, {nwg} warpgroups, {stages} stages)")
        if landing and (not ready or rnd.random() < 0.3):     # a TMA copy lands
            kind, s, what, bar = landing.pop(rnd.randrange(len(landing)))
            if readers[kind][s]:
                raise ProtocolError(f"{kind} {what} overwrites buffer {s} while {readers[kind][s]} read it")
            content[kind][s] = what
            bar.arrive()
        else:
            i = rnd.choice(ready)
            waiting[i] = next(procs[i], None)
        steps += 1
    return steps
