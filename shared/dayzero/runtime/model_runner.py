"""Model runner: one forward pass over a mixed batch of prefill chunks and decode tokens.

Each ``SeqChunk`` is the new tokens of one sequence (a prefill chunk, or one token for decode)
that follow the ``start`` tokens whose KV is already in the paged cache. The runner builds the
attention metadata (positions, cu_seqlens, block tables, slot mappings), runs the model (which
writes the new K/V into the cache) and returns the logits each chunk asked for.
Blocks must already be reserved (``KVCacheManager.ensure``) for ``start + len(token_ids)`` tokens.

Pure decode steps (one new token per sequence) replay a CUDA graph of the forward + lm_head per
batch bucket (``runtime.cuda_graph``) when graphs are on; everything else runs eagerly. Graphs are
on by default for an FP8 model on a CUDA device with a GPU kernel backend, alone (no TP/EP): those
ops have no host syncs and static shapes. ``cuda_graphs=True`` forces them on a CUDA device (capture
then fails loudly if an op syncs); CPU and the torch backend always run eagerly.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from dayzero.kvcache import KVCacheManager
from dayzero.model.attention import ForwardBatch
from dayzero.model.transformer import GptOssForEngine

from . import staging
from .cuda_graph import DEFAULT_BUCKETS, DecodeGraphs


@dataclass
class SeqChunk:
    seq_id: str
    token_ids: list[int]      # new tokens of this step (len >= 1)
    start: int                # tokens of this sequence already in the cache = position of token_ids[0]
    logits: str = "last"      # "last": logits of the last new token; "all": of every new token; "none"


def graphs_by_default(model: GptOssForEngine) -> bool:
    par = model.parallel
    return (model.device.type == "cuda" and model.ops.backend != "torch" and model.precision.fp8
            and par.tp_size == 1 and par.ep_size == 1)


class ModelRunner:
    def __init__(self, model: GptOssForEngine, kv: KVCacheManager, cuda_graphs: bool | None = None,
                 graph_buckets: Sequence[int] = DEFAULT_BUCKETS, max_model_len: int | None = None) -> None:
        self.model = model
        self.kv = kv
        self.device = model.device
        self.kv_caches = [kv.layer_cache(i) for i in range(model.cfg.num_hidden_layers)]
        # host-known attention bounds spare the GPU backends a host sync per layer (torch takes none)
        self.attention_hints = model.ops.backend != "torch"
        if cuda_graphs is None:
            cuda_graphs = graphs_by_default(model)
        if cuda_graphs and (model.device.type != "cuda" or model.ops.backend == "torch"):
            raise ValueError(f"CUDA graphs need a CUDA device and a GPU kernel backend (device "
                             f"{model.device}, backend {model.ops.backend!r})")
        self.graphs = DecodeGraphs(model, kv, self.kv_caches, max_model_len or model.max_positions,
                                   graph_buckets) if cuda_graphs else None

    def build_batch(self, chunks: list[SeqChunk], logit_rows: list[int] | None = None
                    ) -> tuple[torch.Tensor, ForwardBatch, torch.Tensor | None]:
        """(token ids [T] int64, the batch's metadata, ``logit_rows`` [N] int64 or None) on the device, all
        staged on the host and copied in one transfer (``runtime.staging``)."""
        ids, pos, cu = [], [], [0]
        for c in chunks:
            if not c.token_ids:
                raise ValueError(f"sequence {c.seq_id!r}: empty chunk")
            ids += c.token_ids
            pos.append(torch.arange(c.start, c.start + len(c.token_ids), dtype=torch.int64))
            cu.append(cu[-1] + len(c.token_ids))
        seq_ids = [c.seq_id for c in chunks]
        starts = [c.start for c in chunks]
        counts = [len(c.token_ids) for c in chunks]
        totals = [s + n for s, n in zip(starts, counts)]
        cpu = torch.device("cpu")
        bt_full, bt_slide = self.kv.block_tables(seq_ids, totals, cpu)
        slots_full, slots_slide = self.kv.slot_mappings(seq_ids, starts, counts, cpu)
        host = {"ids": torch.tensor(ids, dtype=torch.int64), "pos": torch.cat(pos),
                "cu": torch.tensor(cu, dtype=torch.int32), "cached": torch.tensor(starts, dtype=torch.int32),
                "bt_full": bt_full, "bt_slide": bt_slide, "slots_full": slots_full, "slots_slide": slots_slide}
        if logit_rows is not None:
            host["rows"] = torch.tensor(logit_rows, dtype=torch.int64)
        d = staging.pack(host, self.device)
        fb = ForwardBatch(
            positions=d["pos"], cu_seqlens_q=d["cu"], cached_lens=d["cached"],
            block_tables_full=d["bt_full"], block_tables_sliding=d["bt_slide"],
            slots_full=d["slots_full"], slots_sliding=d["slots_slide"], kv_caches=self.kv_caches)
        if self.attention_hints:
            fb.max_seqlen_q, fb.max_seqlen_k = max(counts), max(starts)
        return d["ids"], fb, d.get("rows")

    @torch.no_grad()
    def run(self, chunks: list[SeqChunk]) -> list[torch.Tensor | None]:
        """Forward ``chunks`` together; per chunk: logits ``[1, V]`` ("last"), ``[n, V]`` ("all") or None."""
        if not chunks:
            return []
        vocab = self.model.cfg.vocab_size
        for c in chunks:
            if c.start + len(c.token_ids) > self.model.max_positions:
                raise ValueError(f"sequence {c.seq_id!r}: position {c.start + len(c.token_ids) - 1} is beyond the "
                                 f"model's {self.model.max_positions} positions")
            if c.token_ids and (min(c.token_ids) < 0 or max(c.token_ids) >= vocab):
                bad = [t for t in c.token_ids if not 0 <= t < vocab]
                raise ValueError(f"sequence {c.seq_id!r}: token id(s) {bad[:5]} outside the vocabulary [0, {vocab})")
        if self.graphs is not None and self.graphs.supports(chunks):
            logits = self.graphs.run(chunks)                                  # [B, V] fp32, one row per chunk
            return [None if c.logits == "none" else logits[b:b + 1] for b, c in enumerate(chunks)]
        rows, spans, r = [], [], 0
        for c in chunks:
            n = len(c.token_ids)
            if c.logits == "all":
                spans.append((len(rows), n))
                rows += range(r, r + n)
            elif c.logits == "last":
                spans.append((len(rows), 1))
                rows.append(r + n - 1)
            else:
                spans.append(None)
            r += n
        ids, fb, rows_dev = self.build_batch(chunks, rows)
        hidden = self.model(ids, fb)                                          # [T, H]
        if not rows:
            return [None] * len(chunks)
        logits = self.model.compute_logits(hidden[rows_dev])                  # [N, V] fp32
        return [None if s is None else logits[s[0]:s[0] + s[1]] for s in spans]
