"""CUDA graphs for the decode step: the model's forward plus the lm_head, one graph per batch bucket.

A decode step launches a few hundred small kernels whose Python launch cost is as large as their
GPU time (bench/NOTES.md). ``DecodeGraphs`` captures ``model(ids, fb)`` + ``compute_logits`` once
per bucket size (1, 2, 4, ... 256 sequences) over static input buffers and replays it; sampling
stays outside the graph. A batch of B sequences runs in the smallest bucket >= B; the rows B..bucket-1
are dummy one-token sequences with no cached tokens that store nothing (slot -1), so they read
and write no KV block. Attention gets ``max_seqlen_q=1`` and ``max_seqlen_k=max_len`` (a fixed
split count per bucket and layer kind), so no kernel needs a host sync or a data-dependent shape.

Static inputs (``DecodeInputs``), for up to N = the largest bucket sequences:
    meta       [5, N] int64   rows: token ids, positions, cached lengths, full slots, sliding slots
    tables     [2, N, MB] int32  full / sliding block tables, MB = ceil(max_len / block_size)
    cached32   [N] int32      cached lengths as the attention op wants them (converted in the graph)
    cu_seqlens [N+1] int32    0..N (one new token per sequence; never changes)
Per step the host writes the metadata into pinned staging buffers and issues one copy for ``meta``
and one for the block-table columns that changed since the last step (a sequence's blocks are
append-only while it lives, so a row is rewritten only when a new sequence takes it).
Graphs share one memory pool; the logits a replay returns are valid until the next replay.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from dayzero.kvcache import KVCacheManager
from dayzero.model.attention import ForwardBatch

if TYPE_CHECKING:
    from dayzero.kvcache.manager import SeqBlocks
    from dayzero.model.transformer import GptOssForEngine

    from .model_runner import SeqChunk

DEFAULT_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
IDS, POS, CACHED, SLOT_FULL, SLOT_SLIDING = range(5)


class DecodeInputs:
    """Static decode metadata for up to ``max_batch`` sequences: pinned host staging + device buffers."""

    def __init__(self, kv: KVCacheManager, max_batch: int, max_len: int, device: torch.device) -> None:
        self.kv = kv
        self.BS, self.R = kv.BS, kv.R
        self.max_batch, self.max_len = max_batch, max_len
        self.mb = math.ceil(max_len / self.BS)
        pin = device.type == "cuda"
        N = max_batch
        self.host_meta = torch.zeros((5, N), dtype=torch.int64, pin_memory=pin)
        self.host_tables = torch.zeros((2, N, self.mb), dtype=torch.int32, pin_memory=pin)
        self.meta = torch.zeros((5, N), dtype=torch.int64, device=device)
        self.tables = torch.zeros((2, N, self.mb), dtype=torch.int32, device=device)
        self.cached32 = torch.zeros((N,), dtype=torch.int32, device=device)
        self.cu_seqlens = torch.arange(N + 1, dtype=torch.int32, device=device)
        self._rows: list[tuple[SeqBlocks | None, int]] = [(None, 0)] * N  # who owns each table row, blocks written
        self._copied: torch.cuda.Event | None = None                       # last host->device copy

    def forward_batch(self, bucket: int, kv_caches: list, max_len: int) -> tuple[torch.Tensor, ForwardBatch]:
        """(ids [bucket], ForwardBatch) views of the static buffers: what a graph of ``bucket`` reads."""
        m = self.meta
        return m[IDS, :bucket], ForwardBatch(
            positions=m[POS, :bucket], cu_seqlens_q=self.cu_seqlens[:bucket + 1], cached_lens=self.cached32[:bucket],
            block_tables_full=self.tables[0, :bucket], block_tables_sliding=self.tables[1, :bucket],
            slots_full=m[SLOT_FULL, :bucket], slots_sliding=m[SLOT_SLIDING, :bucket], kv_caches=kv_caches,
            max_seqlen_q=1, max_seqlen_k=max_len)

    def fill(self, chunks: Sequence[SeqChunk], bucket: int) -> None:
        """Write the metadata of ``chunks`` (one new token each) into rows 0..B-1, dummy rows up to
        ``bucket``, and copy what changed to the device (asynchronously, on the current stream)."""
        B = len(chunks)
        if not 0 < B <= bucket <= self.max_batch:
            raise ValueError(f"decode graph: batch {B} does not fit bucket {bucket} (max {self.max_batch})")
        if self._copied is not None:
            self._copied.synchronize()  # the previous step's copies have read the staging buffers
        hm = self.host_meta.numpy()
        ht = self.host_tables.numpy()
        BS, R = self.BS, self.R
        lo, hi = self.mb, 0
        for b, c in enumerate(chunks):
            seq = self.kv.seqs.get(c.seq_id)
            pos = c.start
            if seq is None or seq.capacity < pos + 1:
                raise RuntimeError(f"sequence {c.seq_id!r}: {pos + 1} tokens exceed the "
                                   f"{0 if seq is None else seq.capacity} reserved")
            if pos >= self.max_len:
                raise ValueError(f"sequence {c.seq_id!r}: position {pos} is beyond the graphs' {self.max_len}")
            j, off = divmod(pos, BS)
            hm[IDS, b], hm[POS, b], hm[CACHED, b] = c.token_ids[0], pos, pos
            hm[SLOT_FULL, b] = seq.full[j] * BS + off if seq.full else -1
            hm[SLOT_SLIDING, b] = seq.ring[j % R] * BS + off if seq.ring else -1
            nblk = j + 1
            owner, done = self._rows[b]
            if owner is not seq:
                done = 0
            if nblk > done:
                if seq.full:
                    ht[0, b, done:nblk] = seq.full[done:nblk]
                if seq.ring:  # only the last R logical blocks can be inside the window
                    first = max(done, nblk - R)
                    ht[1, b, first:nblk] = [seq.ring[i % R] for i in range(first, nblk)]
                lo, hi = min(lo, done), max(hi, nblk)
                self._rows[b] = (seq, nblk)
        hm[:, B:bucket] = 0
        hm[SLOT_FULL:, B:bucket] = -1               # dummy rows: no cached tokens, store nothing
        self.meta.copy_(self.host_meta, non_blocking=True)  # 5 x N x 8 bytes, contiguous (rows >= bucket unused)
        if hi > lo:
            self.tables[:, :B, lo:hi].copy_(self.host_tables[:, :B, lo:hi], non_blocking=True)
        if self.meta.is_cuda:
            self._copied = torch.cuda.Event()
            self._copied.record()


class DecodeGraphs:
    """One captured decode step per batch bucket (captured on first use, or all at once by ``capture``)."""

    def __init__(self, model: GptOssForEngine, kv: KVCacheManager, kv_caches: list, max_len: int,
                 buckets: Sequence[int] = DEFAULT_BUCKETS) -> None:
        if model.device.type != "cuda":
            raise ValueError(f"CUDA graphs need a CUDA device, the model is on {model.device}")
        if not buckets or any(b < 1 for b in buckets):
            raise ValueError(f"graph buckets must be positive batch sizes, got {list(buckets)}")
        self.model, self.kv_caches = model, kv_caches
        self.buckets = tuple(sorted(set(int(b) for b in buckets)))
        self.max_len = min(max_len, model.max_positions)
        self.inputs = DecodeInputs(kv, self.buckets[-1], self.max_len, model.device)
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}  # bucket -> (graph, logits [bucket, V])
        self.pool = None

    def bucket_for(self, batch: int) -> int | None:
        return next((b for b in self.buckets if b >= batch), None)

    def supports(self, chunks: Sequence[SeqChunk]) -> bool:
        """True for a pure decode step (one new token per sequence) that fits a bucket and the graphs' length."""
        return (self.bucket_for(len(chunks)) is not None
                and all(len(c.token_ids) == 1 and c.start < self.max_len for c in chunks))

    def _step(self, bucket: int) -> torch.Tensor:
        ids, fb = self.inputs.forward_batch(bucket, self.kv_caches, self.max_len)
        self.inputs.cached32[:bucket].copy_(self.inputs.meta[CACHED, :bucket])
        hidden = self.model(ids, fb)                                   # [bucket, H]
        return self.model.compute_logits(hidden)                      # [bucket, V] fp32

    @torch.no_grad()
    def capture(self, bucket: int) -> None:
        """Warm up (compiles kernels, builds derived weights) and capture the step of ``bucket``."""
        if bucket in self.graphs:
            return
        inp = self.inputs
        inp.meta[:, :bucket] = 0
        inp.meta[SLOT_FULL:, :bucket] = -1                                # the warm-up stores nothing
        stream = torch.cuda.Stream(device=self.model.device)
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):
                self._step(bucket)
        torch.cuda.current_stream().wait_stream(stream)
        torch.cuda.synchronize(self.model.device)
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            logits = self._step(bucket)
        self.graphs[bucket] = (graph, logits)

    def capture_all(self) -> None:
        for b in sorted(self.buckets, reverse=True):  # largest first: smaller ones reuse its pool memory
            self.capture(b)

    @torch.no_grad()
    def run(self, chunks: Sequence[SeqChunk]) -> torch.Tensor:
        """Logits ``[B, V]`` fp32 of the decode step ``chunks`` (a view, valid until the next replay)."""
        bucket = self.bucket_for(len(chunks))
        if bucket is None:
            raise ValueError(f"decode graph: batch {len(chunks)} is above the largest bucket {self.buckets[-1]}")
        if bucket not in self.graphs:
            self.capture(bucket)
        self.inputs.fill(chunks, bucket)
        graph, logits = self.graphs[bucket]
        graph.replay()
        return logits[:len(chunks)]
