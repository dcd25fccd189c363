"""The single-process engine the services run: continuous batching over a paged KV cache.

Construction::

    engine = Engine.from_dir(model_dir, dtype="bfloat16", backend="torch", device="cpu",
                             config=EngineConfig(block_size=16, num_kv_blocks=..., max_num_seqs=64,
                                                 max_num_batched_tokens=2048))
    # or Engine(model, config) with a loaded GptOssForEngine

Continuous batching (one thread drives it; the engine is not thread-safe)::

    engine.add_request(request_id, prompt_ids, SamplingParams(...))  # ValueError on bad input
    while engine.has_unfinished():
        for out in engine.step():          # list[StepOutput], one per request that got a token
            out.request_id, out.token_id, out.logprob, out.top_logprobs, out.finished, out.finish_reason
    engine.abort(request_id) -> bool       # frees its blocks at once; no further outputs for it

``step()`` schedules (running requests first, then queued ones; prompts are prefilled in chunks
within ``max_num_batched_tokens`` per step), runs one forward pass, samples, and returns the new
tokens. A request finishes with ``finish_reason`` "stop" (a stop id, or an eos id of the model
unless ``ignore_eos``; the stop token IS emitted as the last output) or "length" (``max_tokens``,
``max_model_len``, or a KV cache too small for it to grow: then the final output has
``token_id == -1``, no new token). Finished requests free their blocks.

Disaggregated serving (lower-level calls; the same KV layout on both sides)::

    # decode worker
    alloc = engine.allocate(request_id, num_prompt_tokens)  # KVAllocation; KVCacheFullError if no room
    #   alloc.layer_blocks[layer] = physical blocks to fill (see KVCacheManager.layer_blocks);
    #   engine.kv.layer_tensors() / engine.kv.regions() give the memory to register with a transport
    ... a prefill worker writes the prompt's KV into those blocks ...
    engine.add_prefilled(request_id, prompt_ids, first_token, params) -> None | finish_reason
    #   joins the decode batch; returns "stop"/"length" (and frees) if first_token already ends it
    engine.free(request_id)                 # release a lease (or any request) and its blocks

    # prefill worker (batch 1)
    sample = engine.prefill_only(request_id, prompt_ids, params, on_chunk=None) -> Sample
    #   computes the prompt's KV chunk by chunk into this engine's blocks (allocated if needed),
    #   calls on_chunk(request_id, num_tokens_done) after each chunk, samples the first token
    #   (step 0 of the request's seed); the blocks stay held until engine.free(request_id).
    engine.kv.layer_blocks(request_id, len(prompt_ids))   # what to send, per layer

Seeded sampling depends only on (seed, step), so a request split over two workers gives the same
tokens as in one engine if both sides get the same seed.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from dayzero.kvcache import KVCacheManager, KVCacheSpec
from dayzero.model.transformer import GptOssForEngine

from .grammar import GrammarCompiler
from .model_runner import ModelRunner, SeqChunk
from .sampling import Sample, SampleRequest, Sampler, SamplingParams
from .scheduler import Request, ScheduledBatch, Scheduler


@dataclass
class EngineConfig:
    block_size: int = 16
    num_kv_blocks: int | None = None        # full-attention blocks; None: max_num_seqs full-length sequences, capped
    max_num_seqs: int = 64                  # running requests per step
    max_num_batched_tokens: int = 2048      # tokens per forward pass (the prefill chunk budget)
    max_model_len: int | None = None        # None: the model's max positions
    kv_dtype: torch.dtype | None = None     # None: the model's activation dtype
    max_kv_seqs: int | None = None          # sequences holding sliding rings at once (None: 2 * max_num_seqs)
    cuda_graphs: bool | None = None         # decode steps replay CUDA graphs; None: on for FP8 + GPU backend on CUDA
    cuda_graph_buckets: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256)  # batch sizes captured (<= max_num_seqs used)


@dataclass
class StepOutput:
    request_id: str
    token_id: int                           # -1: finished without a new token (cache could not grow)
    logprob: float | None = None
    top_logprobs: list[tuple[int, float]] = field(default_factory=list)
    finished: bool = False
    finish_reason: str | None = None        # "stop" | "length" when finished


@dataclass
class KVAllocation:
    request_id: str
    num_tokens: int
    layer_blocks: list[list[int]]          # per layer, physical blocks in transfer order


@dataclass
class EngineStats:
    num_running: int
    num_waiting: int
    num_queued_tokens: int
    kv_blocks_free: int
    kv_blocks_used: int
    kv_blocks_total: int


class Engine:
    def __init__(self, model: GptOssForEngine, config: EngineConfig | None = None) -> None:
        self.model = model
        self.cfg = model.cfg
        self.config = c = config or EngineConfig()
        self.max_model_len = min(c.max_model_len or model.max_positions, model.max_positions)
        num_blocks = c.num_kv_blocks or min(c.max_num_seqs * math.ceil(self.max_model_len / c.block_size), 8192)
        spec = KVCacheSpec.from_model(self.cfg, c.block_size, c.kv_dtype or model.act_dtype,
                                      num_kv_heads=self.cfg.num_key_value_heads // model.parallel.tp_size)
        self.kv = KVCacheManager(spec, num_blocks, max_seqs=c.max_kv_seqs or 2 * c.max_num_seqs, device=model.device)
        buckets = [b for b in c.cuda_graph_buckets if b < c.max_num_seqs]
        buckets.append(min([b for b in c.cuda_graph_buckets if b >= c.max_num_seqs] or [c.max_num_seqs]))
        self.runner = ModelRunner(model, self.kv, cuda_graphs=c.cuda_graphs, graph_buckets=buckets,
                                  max_model_len=self.max_model_len)
        self.scheduler = Scheduler(self.kv, c.max_num_seqs, c.max_num_batched_tokens)
        self.sampler = Sampler()
        self.requests: dict[str, Request] = {}
        self.leases: dict[str, int] = {}        # allocate()d but not yet added: request id -> tokens
        self._rng = random.SystemRandom()
        eos = self.cfg.eos_token_id
        self.eos_ids = frozenset(eos if isinstance(eos, tuple) else (eos,))
        self.grammars = GrammarCompiler(self.cfg.vocab_size, self.eos_ids)   # tokenizer built on first use

    @classmethod
    def from_dir(cls, model_dir: str, dtype: str = "bfloat16", backend: str = "torch", device: str = "cpu",
                 config: EngineConfig | None = None, **model_kwargs) -> "Engine":
        from dayzero.weights.loader import load_model

        return cls(load_model(model_dir, dtype=dtype, backend=backend, device=device, **model_kwargs), config)

    # ---- continuous batching -------------------------------------------------------------------
    def add_request(self, request_id: str, prompt_ids: list[int], params: SamplingParams | None = None) -> None:
        req = self._new_request(request_id, prompt_ids, params)
        self.requests[request_id] = req
        self.scheduler.add(req)

    def abort(self, request_id: str) -> bool:
        """Drop a request (queued, running or leased) and free its blocks; False if unknown."""
        req = self.requests.pop(request_id, None)
        if req is not None:
            self.scheduler.remove(request_id)
        leased = self.leases.pop(request_id, None) is not None
        self.kv.free(request_id)
        return req is not None or leased

    def has_unfinished(self) -> bool:
        return bool(self.requests)

    def step(self) -> list[StepOutput]:
        """Schedule, run one forward pass, sample; outputs of the requests that got a token."""
        batch = self.scheduler.schedule()
        outputs = [self._finish(r, r.finish_reason, None) for r in batch.finished]
        if not batch.empty:
            logits = self.runner.run(batch.chunks)
            outputs += self._process(batch, logits)
        return outputs

    def generate(self, prompts: list[list[int]], params: SamplingParams | None = None) -> list[list[int]]:
        """Convenience: run ``prompts`` to completion together; the generated ids of each."""
        ids = [f"generate-{i}-{self._rng.getrandbits(32):08x}" for i in range(len(prompts))]
        for rid, p in zip(ids, prompts):
            self.add_request(rid, p, params)
        out: dict[str, list[int]] = {rid: [] for rid in ids}
        while any(rid in self.requests for rid in ids):
            for o in self.step():
                if o.request_id in out:
                    out[o.request_id].append(o.token_id)
        return [out[rid] for rid in ids]

    # ---- disaggregated serving -----------------------------------------------------------------
    def allocate(self, request_id: str, num_prompt_tokens: int) -> KVAllocation:
        if request_id in self.requests or request_id in self.leases or self.kv.has(request_id):
            raise ValueError(f"request id {request_id!r} is already in use")
        self._check_len(request_id, num_prompt_tokens)
        self.kv.ensure(request_id, num_prompt_tokens)
        self.leases[request_id] = num_prompt_tokens
        return KVAllocation(request_id, num_prompt_tokens, self.kv.layer_blocks(request_id, num_prompt_tokens))

    def prefill_only(self, request_id: str, prompt_ids: list[int], params: SamplingParams | None = None,
                     on_chunk: Callable[[str, int], None] | None = None) -> Sample:
        req = self._new_request(request_id, prompt_ids, params, allow_lease=True)
        n = len(req.prompt_ids)
        if request_id not in self.leases:
            self.allocate(request_id, n)
        elif self.leases[request_id] < n:
            raise ValueError(f"{request_id!r}: {n} prompt tokens but only {self.leases[request_id]} allocated")
        budget = self.config.max_num_batched_tokens
        logits = None
        for s in range(0, n, budget):
            e = min(n, s + budget)
            logits = self.runner.run([SeqChunk(request_id, req.prompt_ids[s:e], s, "last" if e == n else "none")])[0]
            if on_chunk is not None:
                on_chunk(request_id, e)
        return self.sampler(logits, [self._sample_request(req)])[0]

    def add_prefilled(self, request_id: str, prompt_ids: list[int], first_token: int,
                      params: SamplingParams | None = None) -> str | None:
        if request_id not in self.leases:
            raise ValueError(f"{request_id!r}: add_prefilled needs a prior allocate()")
        req = self._new_request(request_id, prompt_ids, params, allow_lease=True)
        if self.leases[request_id] < len(req.prompt_ids):
            raise ValueError(f"{request_id!r}: {len(req.prompt_ids)} prompt tokens but only "
                             f"{self.leases[request_id]} allocated")
        if not 0 <= first_token < self.cfg.vocab_size:
            raise ValueError(f"{request_id!r}: first token {first_token} outside the vocabulary")
        self._append(req, first_token)
        req.num_computed = len(req.prompt_ids)
        reason = self._stop_reason(req)
        del self.leases[request_id]
        if reason is not None:
            self.kv.free(request_id)
            return reason
        self.requests[request_id] = req
        self.scheduler.add(req)
        return None

    def free(self, request_id: str) -> bool:
        return self.abort(request_id)

    def warmup(self) -> int:
        """Capture every decode CUDA graph now (a service calls this before it reports ready, so no
        request pays a capture); returns the number of graphs held (0 where graphs are off)."""
        if self.runner.graphs is None:
            return 0
        self.runner.graphs.capture_all()
        return len(self.runner.graphs.graphs)

    def stats(self) -> EngineStats:
        return EngineStats(num_running=len(self.scheduler.running), num_waiting=len(self.scheduler.waiting),
                           num_queued_tokens=self.scheduler.num_queued_tokens(),
                           kv_blocks_free=self.kv.full_alloc.num_free, kv_blocks_used=self.kv.full_alloc.num_used,
                           kv_blocks_total=self.kv.full_alloc.num_blocks)

    # ---- internals -----------------------------------------------------------------------------
    def _new_request(self, request_id: str, prompt_ids: list[int], params: SamplingParams | None,
                     allow_lease: bool = False) -> Request:
        params = params or SamplingParams()
        params.validate()
        params.check_vocab(self.cfg.vocab_size)
        if not isinstance(request_id, str) or not request_id:
            raise ValueError("request id must be a non-empty string")
        if request_id in self.requests or (request_id in self.leases and not allow_lease):
            raise ValueError(f"request id {request_id!r} is already in use")
        prompt = [int(t) for t in prompt_ids]
        if not prompt:
            raise ValueError(f"{request_id!r}: empty prompt")
        bad = [t for t in prompt if not 0 <= t < self.cfg.vocab_size]
        if bad:
            raise ValueError(f"{request_id!r}: token id(s) {bad[:5]} outside the vocabulary [0, {self.cfg.vocab_size})")
        self._check_len(request_id, len(prompt))
        seed = params.seed if params.seed is not None else self._rng.getrandbits(63)
        ends = params.json_end_ids or tuple(self.eos_ids)
        matcher = self.grammars.matcher(params.json_schema, ends) if params.json_schema else None  # GrammarError
        # compiled up front: a schema that cannot be used is refused now, not in the middle of a step
        prefix_matchers = tuple(self.grammars.matcher(s, ends) if s else None for s in params.prefix_json_schemas)
        return Request(request_id, prompt, params, seed, matcher=matcher, prefix_matchers=prefix_matchers)

    def _sample_request(self, req: Request) -> SampleRequest:
        allowed = req.matcher.allowed(self.model.device) if req.matcher is not None else None
        return SampleRequest(req.params, req.seed, len(req.output_ids), req.output_ids, allowed)

    def _append(self, req: Request, token: int) -> None:
        req.output_ids.append(token)
        if req.prefix_matchers:   # the JSON of prefix i starts right after prefix i is out
            out = tuple(req.output_ids)
            for seq, m in zip(req.params.allowed_prefixes, req.prefix_matchers):
                if out == seq:
                    req.matcher, req.prefix_matchers = m, ()
                    return
            if len(out) >= max(len(seq) for seq in req.params.allowed_prefixes):
                req.prefix_matchers = ()
            return
        if req.matcher is not None and not req.matcher.advance(token):
            # only a token outside the grammar's mask gets here (e.g. a first token sampled elsewhere)
            raise ValueError(f"{req.request_id!r}: token {token} does not continue the requested JSON "
                             f"({req.matcher.error})")

    def _check_len(self, request_id: str, n: int) -> None:
        if n >= self.max_model_len:
            raise ValueError(f"{request_id!r}: prompt of {n} tokens leaves no room in max_model_len {self.max_model_len}")
        blocks = math.ceil((n + 1) / self.kv.BS)
        if self.kv.spec.full_layers and blocks > self.kv.full_alloc.num_blocks:
            raise ValueError(f"{request_id!r}: prompt of {n} tokens needs {blocks} KV blocks; the cache has "
                             f"{self.kv.full_alloc.num_blocks}")

    def _stop_reason(self, req: Request) -> str | None:
        tok, p = req.output_ids[-1], req.params
        if tok in p.stop_token_ids or (not p.ignore_eos and tok in self.eos_ids):
            return "stop"
        if req.matcher is not None and req.matcher.ends(tok):   # the JSON and its end token are out
            return "stop"
        if len(req.output_ids) >= p.max_tokens or req.num_tokens >= self.max_model_len:
            return "length"
        return None

    def _process(self, batch: ScheduledBatch, logits: list[torch.Tensor | None]) -> list[StepOutput]:
        rows, reqs = [], []
        for req, chunk, lg in zip(batch.requests, batch.chunks, logits):
            req.num_computed += len(chunk.token_ids)
            if lg is not None:
                rows.append(lg)
                reqs.append(req)
        if not rows:
            return []
        samples = self.sampler(torch.cat(rows), [self._sample_request(r) for r in reqs])
        outputs = []
        for req, s in zip(reqs, samples):
            self._append(req, s.token_id)
            reason = self._stop_reason(req)
            if reason is not None:
                outputs.append(self._finish(req, reason, s))
            else:
                outputs.append(StepOutput(req.request_id, s.token_id, s.logprob, s.top_logprobs))
        return outputs

    def _finish(self, req: Request, reason: str, s: Sample | None) -> StepOutput:
        self.scheduler.finish(req)
        self.requests.pop(req.request_id, None)
        if s is None:  # ended by the scheduler without a new token
            return StepOutput(req.request_id, -1, finished=True, finish_reason=reason)
        return StepOutput(req.request_id, s.token_id, s.logprob, s.top_logprobs, True, reason)
