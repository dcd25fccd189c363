"""Routing policy: which decode and prefill worker serve a request, and whether to disaggregate.

- decode: the most free KV blocks (registry load minus what this router has just placed there);
- prefill: the fewest queued prompt tokens, preferring workers whose KV handshake matches the
  chosen decode worker (an incompatible pair is still tried when nothing else exists, so the
  prefill worker's handshake refuses it with a message naming the mismatch);
- conditional disaggregation: prompts shorter than ``threshold`` tokens (or any prompt when no
  prefill worker is up) are prefilled by the decode worker itself.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from dayzero.rpc.v1 import worker_pb2


@dataclass
class RoutePlan:
    disaggregate: bool
    decodes: list[worker_pb2.WorkerRecord]      # in order of preference
    prefills: list[worker_pb2.WorkerRecord]     # in order of preference (empty when local)


def blocks_needed(prompt_tokens: int, block_size: int) -> int:
    return math.ceil((prompt_tokens + 1) / max(1, block_size))


def order_decodes(decodes: list[worker_pb2.WorkerRecord], pending: dict[str, int]) -> list[worker_pb2.WorkerRecord]:
    def free(r: worker_pb2.WorkerRecord) -> int:
        return r.load.kv_blocks_free - pending.get(r.worker_id, 0)
    return sorted(decodes, key=lambda r: (-free(r), r.load.running_requests, r.worker_id))


def order_prefills(prefills: list[worker_pb2.WorkerRecord], pending: dict[str, int],
                   compat_hash: str) -> list[worker_pb2.WorkerRecord]:
    def key(r: worker_pb2.WorkerRecord):
        return (r.compat_hash != compat_hash, r.load.queued_tokens + pending.get(r.worker_id, 0), r.worker_id)
    return sorted(prefills, key=key)


def plan_route(prompt_tokens: int, decodes: list[worker_pb2.WorkerRecord], prefills: list[worker_pb2.WorkerRecord],
               threshold: int, pending_blocks: dict[str, int], pending_tokens: dict[str, int]) -> RoutePlan:
    ds = order_decodes(decodes, pending_blocks)
    disaggregate = bool(prefills) and prompt_tokens >= threshold
    ps = order_prefills(prefills, pending_tokens, ds[0].compat_hash if ds else "") if disaggregate else []
    return RoutePlan(disaggregate, ds, ps)
