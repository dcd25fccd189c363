"""The tile schedule of the Gluon sliding-window prefill kernel (``gluon_attention_window``) in plain torch.

No triton here: CI (no GPU, no triton) checks ``emulate_window`` against the torch reference op, so the
kernel's index logic (which query rows a CTA and a warpgroup own, which 64-key tiles of the CTA's
resident window it loads and scores, which of them are masked and how, what TMA reads past a sequence or
past T, how the sink joins the softmax) is checked without a GPU. Gluon kernels cannot run in
TRITON_INTERPRET; keep this module in step with the kernel.

The schedule (head dim 64, window w <= 128, no cached prefix): a CTA owns some query heads of one KV head
and BM = 64 TB consecutive new tokens [m_start, m_start + BM) of one sequence; token block t holds rows
r0 = m_start + 64 t .. r0 + 63 (of every head of the CTA; which warpgroup takes which head does not change
the arithmetic). Every key any of its rows may see lies in [m_start - 128, m_start + BM), TB + 2 tiles of
64 keys; tile i holds keys [m_start - 128 + 64 i, + 64). Token block t scores exactly tiles t, t + 1, t + 2
(keys r0 - 128 .. r0 + 63): 192 scores per row for at most 128 visible keys.
  * tiles wholly before the sequence (i < 2 - m_start / 64: a sequence's first tiles) are neither loaded
    nor scored; tiles from the sequence's end on (first key >= q_len) are not loaded, and no live token
    block scores them;
  * the first tile a token block scores is masked both ways (key <= query and query - key < w): with
    w = 128 it is the window's edge (tile t) or, at a sequence's start, the middle / diagonal tile;
  * tile t + 1 (keys r0 - 64 .. r0 - 1: query - key in [1, 127]) is unmasked when w == 128 (masked both
    ways for a narrower window);
  * tile t + 2 (the diagonal) is masked both ways (the kernel's ``causal_diag`` tests key <= query only:
    the same set where the window spans the tile, w >= 64);
  * token blocks whose rows all lie past the sequence's end do nothing.
"""

from __future__ import annotations

import functools

from dataclasses import dataclass

import torch

from .gluon_attention_schedule import LOG2E, WM, _rows, check_tensors, finish_with_sink, online_step

MAX_WINDOW = 128  # two tiles of 64 keys before a warpgroup's first row
BN = 64           # keys per tile


@dataclass(frozen=True)
class WarpgroupTiles:
    """The key tiles (indices into the CTA's resident window) one token block's rows score, in order."""

    r0: int             # first query row (index in the sequence)
    tiles: list[int]    # tile indices, ascending; tile i holds keys [m_start - 128 + 64 i, + 64)
    masked: list[bool]  # per tile: masked (key <= query and query - key < window) or not


def cta_tiles(q_len: int, m_start: int, tb: int, window: int) -> tuple[int, int, list[WarpgroupTiles]]:
    """What the kernel's prologue computes for the CTA at ``m_start`` with ``tb`` token blocks: (first
    loaded tile, end of loaded tiles, per live token block its tiles)."""
    n_live = min(tb, -(-(q_len - m_start) // WM))
    i_lo = max(0, 2 - m_start // BN)
    i_hi = min(tb + 2, n_live + 2)
    wgs = []
    for g in range(n_live):
        i0 = max(g, i_lo)
        tiles = list(range(i0, g + 3))
        masked = [i == i0 or i == g + 2 or window < MAX_WINDOW for i in tiles]
        wgs.append(WarpgroupTiles(m_start + g * WM, tiles, masked))
    return i_lo, i_hi, wgs


def check_window_supported(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                           window: int) -> None:
    """Raise ValueError unless the Gluon window kernel supports this call (window 1..128, D 64, bf16,
    TMA-able rows)."""
    if not 0 < window <= MAX_WINDOW:
        raise ValueError(f"the Gluon window kernel needs a sliding window in [1, {MAX_WINDOW}] (got {window})")
    check_tensors("Gluon window", q, k, v, out)


def emulate_window(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor,
                   sinks: torch.Tensor, scale: float, window: int, tb: int = 2) -> torch.Tensor:
    """The kernel's computation, CTA by CTA (``tb`` token blocks each) and token block by token block, in
    float32 with P rounded to bf16 before the PV product: q [T, Hq, D], k/v [T, Hkv, D] (no cached prefix)
    -> [T, Hq, D] float32 (NaN where the kernel stores nothing)."""
    T, Hq, D = q.shape
    group = Hq // k.shape[1]
    out = torch.full((T, Hq, D), float("nan"))
    cu = cu_seqlens_q.tolist()
    qk_scale = scale * LOG2E
    for b in range(len(cu) - 1):
        q_start, q_len = cu[b], cu[b + 1] - cu[b]
        for m_start in range(0, q_len, WM * tb):
            _, _, wgs = cta_tiles(q_len, m_start, tb, window)
            for h in range(Hq):
                kv = h // group
                for wg in wgs:
                    qt = _rows(q[:, h].float(), q_start + wg.r0, WM)                    # [WM, D]
                    rows = torch.arange(wg.r0, wg.r0 + WM)
                    m = torch.full((WM, ), -1.0e30)
                    l_ = torch.zeros(WM)
                    o = torch.zeros(WM, D)
                    for i, masked in zip(wg.tiles, wg.masked):
                        base = m_start - 2 * BN + i * BN                               # >= 0 here
                        kt = _rows(k[:, kv].float(), q_start + base, BN)               # [BN, D]
                        vt = _rows(v[:, kv].float(), q_start + base, BN)
                        s = qt @ kt.T * qk_scale                                       # [WM, BN]
                        if masked:
                            cols = base + torch.arange(BN)
                            vis = (cols[None, :] <= rows[:, None]) & (rows[:, None] - cols[None, :] < window)
                            s = s.masked_fill(~vis, float("-inf"))
                        m, l_, o = online_step(m, l_, o, s, vt)
                    res = finish_with_sink(m, l_, o, float(sinks[h]))
                    keep = rows < q_len
                    out[q_start + rows[keep], h] = res[keep]
    return out


# ---- version 2 (``gluon_attention_window_packed``): GQA-packed 64-row units, one 144-key tile each ----
PK_TOK = 16     # tokens per unit (rows r -> token t0 + r % 16)
PK_HEADS = 4    # query heads per unit (rows r -> head r // 16)
PK_KEYS = 144   # keys a unit scores: [t0 - 128, t0 + 16)


def packed_chunk(max_seqlen_q: int, streams: int, sms: int, min_units: int, ups: int = 1) -> tuple[int, int]:
    """Units (of 16 tokens) per CTA, a multiple of ``ups`` (units a ring slot), and chunks per sequence: about
    one CTA per SM over ``streams`` = sequences x KV heads, at least ``min_units`` units a CTA."""
    n = -(-max_seqlen_q // PK_TOK)
    per = min(max(min_units, -(-n * streams // max(sms, 1))), max(n, 1))
    per = -(-per // ups) * ups
    return per, -(-n // per)


@functools.lru_cache(maxsize=None)   # (checked at every launch: a few hundred loop steps the first time only)
def ring_waits_every_phase(nc: int, stages: int, ups: int, n_slots: int = 96) -> bool:
    """Version 2's consumers wait for a slot's ``ready`` barrier by parity ((v // stages) & 1). A consumer
    warpgroup that skips a phase of a barrier it waits on (none of its items in slot v, items in slot v + stages)
    can pass the wait for slot v + stages while slot v is still loading (the barrier's current phase then has the
    other parity): it reads a slot not yet written and over-arrives on ``empty``. True when every warpgroup
    (items g, g + nc, ..., 2 ups items a slot) waits every phase of each barrier it waits on at all (nc = 2 keeps
    its quad: always; nc = 3 with one unit a slot: stages a multiple of 3)."""
    for g in range(nc):
        slots = sorted({i // (2 * ups) for i in range(g, 2 * ups * n_slots, nc)})
        for b in range(stages):
            mine = [v for v in slots if v % stages == b]
            if mine and mine != list(range(b, n_slots, stages))[:len(mine)]:
                return False
    return True


def kv_ring_holds_window(stages: int, ng: int = 16, n_units: int = 64) -> bool:
    """The ``kv_ring`` layout of ``gluon_attention_window_packed`` replayed on indices: local group lg (keys of unit
    lg - 8) goes to ring row lg % ng, rows 0-7 also to ng + lg % ng; the producer loads groups 0-7, then unit u's
    Q with group u + 8 once unit u - stages is released (in order). While unit v is the oldest unreleased, units
    v .. v + stages - 1 may be loaded and in process: each such unit u must find groups u .. u + 7 at rows
    u % ng .. u % ng + 7 (its window, one contiguous view) and group u + 8 at row (u + 8) % ng."""
    for v in range(n_units):
        rows = [-1] * (ng + 8)
        for lg in range(min(v + stages, n_units) + 8):           # every group loaded by then
            rows[lg % ng] = lg
            if lg % ng < 8:
                rows[ng + lg % ng] = lg
        for u in range(v, min(v + stages, n_units)):
            if rows[u % ng:u % ng + 8] != list(range(u, u + 8)) or rows[(u + 8) % ng] != u + 8:
                return False
    return True


def packed_bounds(t0: int, window: int, toff: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """The kernel's mask of a unit at token t0 + toff of a ring slot whose keys start at t0 - 128: row r sees
    columns lo[r] <= c <= hi[r] (key t0 - 128 + c)."""
    rt = torch.arange(WM) % PK_TOK + toff
    lo = torch.clamp(rt + 129 - window, min=128 - t0)
    return lo, rt + 128


def emulate_window_packed(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor,
                          sinks: torch.Tensor, scale: float, window: int, ups: int = 1) -> torch.Tensor:
    """Version 2's computation item by item, in float32 with P rounded to bf16 before the PV product: a ring
    slot holds ``ups`` units (16 tokens each) and keys [t0 - 128, t0 + 16 ups), every unit of it scores all
    of them (masked as the kernel masks), keys read as TMA does (rows of the packed [T, Hkv, D] tensors, zeros
    below row 0 and past T), the sink in the row max before the exps. q [T, Hq, D] -> [T, Hq, D] float32 (NaN
    where the kernel stores nothing)."""
    T, Hq, D = q.shape
    hkv = k.shape[1]
    group = Hq // hkv
    nk = 128 + PK_TOK * ups
    out = torch.full((T, Hq, D), float("nan"))
    cu = cu_seqlens_q.tolist()
    qk_scale = scale * LOG2E
    cols = torch.arange(nk)
    for b in range(len(cu) - 1):
        q_start, q_len = cu[b], cu[b + 1] - cu[b]
        for t0 in range(0, q_len, PK_TOK * ups):                  # every ring slot
            first = q_start + t0 - 128
            pad = max(0, -first)
            for toff in range(0, PK_TOK * ups, PK_TOK):            # every unit of the slot
                lo, hi = packed_bounds(t0, window, toff)
                vis = (cols[None, :] >= lo[:, None]) & (cols[None, :] <= hi[:, None])     # [WM, nk]
                for kv in range(hkv):
                    kt = torch.cat([k.new_zeros(pad, D), _rows(k[:, kv], max(first, 0), nk - pad)]).float()
                    vt = torch.cat([v.new_zeros(pad, D), _rows(v[:, kv], max(first, 0), nk - pad)]).float()
                    for h4 in range(0, group, PK_HEADS):
                        heads = [kv * group + h4 + j for j in range(PK_HEADS)]
                        qt = torch.cat([_rows(q[:, h], q_start + t0 + toff, PK_TOK) for h in heads]).float()
                        s = (qt @ kt.T * qk_scale).masked_fill(~vis, float("-inf"))
                        sink = (sinks[heads].float() * LOG2E).repeat_interleave(PK_TOK)
                        m = torch.maximum(s.max(1).values, sink)
                        p = torch.exp2(s - m[:, None])
                        l_ = p.sum(1) + torch.exp2(sink - m)
                        res = (p.to(torch.bfloat16).float() @ vt) / l_[:, None]
                        tok = torch.arange(t0 + toff, t0 + toff + PK_TOK)
                        keep = tok < q_len
                        for j, h in enumerate(heads):
                            out[q_start + tok[keep], h] = res[j * PK_TOK:(j + 1) * PK_TOK][keep]
    return out


def packed_cta_units(q_lens: list[int], hkv: int, sms: int, min_units: int, ups: int = 1) -> list[int]:
    """The units (16 tokens) each CTA of version 2 walks (``n_units`` of ``window_packed_kernel``), one entry per KV
    head x chunk x sequence with work, for a launch over sequences of ``q_lens`` new tokens on ``sms`` SMs."""
    per, n_chunks = packed_chunk(max(q_lens), len(q_lens) * hkv, sms, min_units, ups)
    out = []
    for q_len in q_lens:
        for c in range(n_chunks):
            n = min(-(-q_len // PK_TOK) - c * per, per)
            if n > 0:
                out += [n] * hkv
    return out


class _MBarrier:
    """An mbarrier as sm_90 keeps it: completed phases ``k``, arrivals still due and transaction bytes still due in
    the current phase; ``try_wait.parity(p)`` passes while the current phase's parity (k & 1) differs from p (phase
    p, or one of the same parity, has completed)."""

    def __init__(self, name: str, count: int):
        self.name, self.count, self.k, self.pending, self.tx = name, count, 0, count, 0

    def _check(self) -> None:
        if self.pending == 0 and self.tx == 0:
            self.k += 1
            self.pending = self.count

    def arrive(self, tx: int = 0) -> None:        # mbarrier.arrive / arrive.expect_tx
        self.tx += tx
        self.pending -= 1
        self._check()

    def complete_tx(self, nbytes: int) -> None:   # a TMA copy landing
        self.tx -= nbytes
        self._check()

    def passes(self, parity: int) -> bool:
        return (self.k & 1) != parity


def kv_ring_protocol(n_units: int, stages: int = 3, nc: int = 3, group_waits: str = "fixed", seed: int | None = 0,
                     ng: int = 16) -> dict:
    """The ``kv_ring`` barrier protocol of ``gluon_attention_window_packed`` (``_pk_producer_ring`` and the serial
    consumers with KVR) for one CTA of ``n_units`` units, run by a scheduler over the producer warp, ``nc`` consumer
    warpgroups and the TMA copies in flight (each landing at a time of the scheduler's choosing; ``seed`` None: the
    producer and TMA first, the order that runs ahead most). Barriers as the kernel makes them: ``ready`` / ``empty``
    per Q slot (counts 1 / 2), ``kvb`` per ring row (count 1); expect-tx bytes as the kernel's, TMA bytes as the boxes
    deliver them (full boxes, zero fill included). ``group_waits``: "fixed" the kernel's waits (item i waits for groups
    from its warpgroup's previous unit + 9, or 0, to v + 8), "from0" what session 7's build ran (the loop-carried
    ``gw`` lost by the compiler: groups 0 .. v + 8 at every item), "gw" session 7's source as written.
    Returns dict(done, stuck (per blocked actor: what it waits for), violations (a wait passed on a phase other than
    the one meant, a ring row or Q slot overwritten while an item reads it, a read of data not yet landed), steps)."""
    import random
    rng = None if seed is None else random.Random(seed)
    KB = 64 * 2 * 16                                     # one 16-row box of 64 bf16: 2 KB
    kvb = [_MBarrier(f"kvb[{r}]", 1) for r in range(ng)]
    ready = [_MBarrier(f"ready[{s}]", 1) for s in range(stages)]
    empty = [_MBarrier(f"empty[{s}]", 2) for s in range(stages)]
    rows = [None] * (ng + 8)                             # group held by each K / V ring row (None: not landed)
    qslot = [None] * stages                              # unit whose Q quads a slot holds
    reading: dict[int, tuple] = {}                       # consumer -> (unit, rows read, Q slot) while computing
    inflight = []                                        # TMA copies issued, not landed: (barrier, bytes, action)
    violations = []

    def load_group(lg):
        r = lg % ng
        targets = [r] + ([ng + r] if r < 8 else [])
        for c, rd in reading.items():
            if set(targets) & set(rd[1]):
                violations.append(f"group {lg} overwrites ring row {r} while consumer {c} reads unit {rd[0]}")
        for t in targets:
            rows[t] = None
        kvb[r].arrive(tx=2 * KB * len(targets))          # expect 4 KB (K + V) or 8 KB with the mirror
        for t in targets:
            inflight.append((kvb[r], 2 * KB, ("row", t, lg)))

    def producer():
        for lg in range(8):
            load_group(lg)
        for v in range(n_units):
            s = v % stages
            yield ("wait", empty[s], ((v // stages) & 1) ^ 1, v // stages, f"producer empty unit {v}")
            for c, rd in reading.items():
                if rd[2] == s:
                    violations.append(f"Q of unit {v} overwrites slot {s} while consumer {c} reads unit {rd[0]}")
            qslot[s] = None
            ready[s].arrive(tx=8 * KB)                   # 2 quads x 4 heads x [16, 64]
            inflight.append((ready[s], 8 * KB, ("q", s, v)))
            load_group(v + 8)

    def consumer(wg):
        for i in range(wg, 2 * n_units, nc):
            v = i // 2
            s = v % stages
            yield ("wait", ready[s], (v // stages) & 1, v // stages + 1, f"consumer {wg} ready unit {v}")
            if group_waits == "from0":
                lo = 0
            elif group_waits == "gw":
                lo = consumer.gw[wg] + 1
            else:
                lo = (i - nc) // 2 + 9 if i >= nc else 0
            for lg in range(lo, v + 9):
                yield ("wait", kvb[lg % ng], (lg // ng) & 1, lg // ng + 1, f"consumer {wg} group {lg} (unit {v})")
            consumer.gw[wg] = v + 8
            rd = [(v % ng) + j for j in range(8)] + [(v + 8) % ng]
            want = list(range(v, v + 9))
            if [rows[r] for r in rd] != want or qslot[s] != v:
                violations.append(f"consumer {wg} unit {v} reads rows {[rows[r] for r in rd]} / Q {qslot[s]}, "
                                  f"wants {want} / {v}")
            reading[wg] = (v, rd, s)
            yield ("compute", None, 0, 0, "")
            del reading[wg]
            empty[s].arrive()
    consumer.gw = [-1] * nc

    actors = {"producer": producer()}
    actors.update({f"consumer {g}": consumer(g) for g in range(nc)})
    blocked = {name: None for name in actors}            # name -> the wait it is stopped at (None: runnable)
    steps = 0
    while actors:
        steps += 1
        runnable = [n for n in actors if blocked[n] is None or blocked[n][1].passes(blocked[n][2])]
        choices = [("actor", n) for n in runnable] + [("tma", j) for j in range(len(inflight))]
        if not choices:
            stuck = {n: f"{w[4]}: {w[1].name} parity {w[2]} (phases completed {w[1].k})" for n, w in blocked.items()}
            return dict(done=False, stuck=stuck, violations=violations, steps=steps)
        if rng is None:   # producer, then TMA, then consumers in order: the producer as far ahead as it can run
            kind, x = min(choices, key=lambda c: (0, 0) if c == ("actor", "producer") else
                          (1, c[1]) if c[0] == "tma" else (2, c[1]))
        else:
            kind, x = rng.choice(choices)
        if kind == "tma":
            bar, nbytes, (what, where, val) = inflight.pop(x)
            if what == "row":
                rows[where] = val
            else:
                qslot[where] = val
            bar.complete_tx(nbytes)
            continue
        w = blocked[x]
        if w is not None and w[1].k != w[3]:      # passed, but not on the phase it was meant for
            violations.append(f"{w[4]}: passed {w[1].name} with {w[1].k} phases completed, meant {w[3]}")
        try:
            blocked[x] = next(actors[x])
            if blocked[x][0] == "compute":
                blocked[x] = None
        except StopIteration:
            del actors[x], blocked[x]
    return dict(done=True, stuck={}, violations=violations, steps=steps)
