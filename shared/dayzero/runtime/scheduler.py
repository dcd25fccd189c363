"""Continuous-batching scheduler: which tokens of which requests run in the next forward pass.

One rule covers prefill, chunked prefill, decode and recompute after preemption: a request has
``tokens = prompt + output`` and ``num_computed`` of them in the KV cache; a step feeds
``tokens[num_computed : num_computed + n]``, and when that reaches the end of ``tokens`` the step
samples the next token. Decode is the case n = 1.

Policy per step (token budget ``max_num_batched_tokens``):
  1. running requests first: decodes (1 token each), then those still prefilling (a chunk each),
     oldest first within each group; if the KV cache cannot grow, the newest running request is
     preempted (blocks freed, back to the front of the queue, recomputed later);
  2. then queued requests in arrival order, while the budget, ``max_num_seqs`` and free blocks
     allow; a long prompt takes as much of the budget as is left and continues next step.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from dayzero.kvcache import KVCacheFullError, KVCacheManager

from .model_runner import SeqChunk
from .sampling import SamplingParams


@dataclass(eq=False)  # identity semantics: two requests are never "equal"
class Request:
    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    seed: int
    output_ids: list[int] = field(default_factory=list)
    num_computed: int = 0
    finish_reason: str | None = None
    matcher: Any = None                 # structured output: a dayzero.runtime.grammar.Matcher
    prefix_matchers: tuple = ()         # per allowed prefix: the Matcher that starts once it is out (or None)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def num_pending(self) -> int:
        return self.num_tokens - self.num_computed

    def token_slice(self, start: int, end: int) -> list[int]:
        n = len(self.prompt_ids)
        if end <= n:
            return self.prompt_ids[start:end]
        return (self.prompt_ids + self.output_ids)[start:end]


@dataclass
class ScheduledBatch:
    requests: list[Request]
    chunks: list[SeqChunk]
    finished: list[Request] = field(default_factory=list)  # ended by the scheduler (cannot grow)

    @property
    def empty(self) -> bool:
        return not self.chunks


class Scheduler:
    def __init__(self, kv: KVCacheManager, max_num_seqs: int, max_num_batched_tokens: int) -> None:
        if max_num_batched_tokens < 1 or max_num_seqs < 1:
            raise ValueError("max_num_seqs and max_num_batched_tokens must be >= 1")
        self.kv = kv
        self.max_num_seqs = max_num_seqs
        self.budget = max_num_batched_tokens
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.num_preemptions = 0

    def add(self, req: Request, front: bool = False) -> None:
        (self.waiting.appendleft if front else self.waiting.append)(req)

    def remove(self, request_id: str) -> Request | None:
        for i, r in enumerate(self.running):
            if r.request_id == request_id:
                return self.running.pop(i)
        for r in self.waiting:
            if r.request_id == request_id:
                self.waiting.remove(r)
                return r
        return None

    def _preempt(self, victim: Request) -> None:
        self.running.remove(victim)
        self.kv.free(victim.request_id)
        victim.num_computed = 0
        self.num_preemptions += 1
        self.waiting.appendleft(victim)

    def schedule(self) -> ScheduledBatch:
        batch = ScheduledBatch([], [])
        budget = self.budget
        for req in sorted(self.running, key=lambda r: r.num_pending > 1):  # decodes first (stable)
            if req not in self.running:  # preempted in this loop
                continue
            if budget <= 0:
                break
            n = min(req.num_pending, budget)
            while True:
                try:
                    self.kv.ensure(req.request_id, req.num_computed + n)
                    break
                except KVCacheFullError:
                    # preempt the newest request not already in this batch (or this one itself)
                    others = [r for r in self.running if r is not req and r not in batch.requests]
                    victim = others[-1] if others else req
                    if victim is req and len(self.running) == 1:
                        # nothing else to free: the request cannot grow any further
                        self.running.remove(req)
                        self.kv.free(req.request_id)
                        req.finish_reason = "length"
                        batch.finished.append(req)
                        break
                    self._preempt(victim)
                    if victim is req:
                        break
            if req not in self.running:
                continue
            self._take(batch, req, n)
            budget -= n
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            req = self.waiting[0]
            n = min(req.num_pending, budget)
            if not self.kv.can_fit(req.request_id, req.num_computed + n):
                break
            self.kv.ensure(req.request_id, req.num_computed + n)
            self.waiting.popleft()
            self.running.append(req)
            self._take(batch, req, n)
            budget -= n
        return batch

    @staticmethod
    def _take(batch: ScheduledBatch, req: Request, n: int) -> None:
        start = req.num_computed
        done = start + n == req.num_tokens
        batch.requests.append(req)
        batch.chunks.append(SeqChunk(req.request_id, req.token_slice(start, start + n), start,
                                     "last" if done else "none"))

    def finish(self, req: Request) -> None:
        if req in self.running:
            self.running.remove(req)
        self.kv.free(req.request_id)

    def num_queued_tokens(self) -> int:
        return sum(r.num_pending for r in self.waiting) + sum(max(0, r.num_pending - 1) for r in self.running)
