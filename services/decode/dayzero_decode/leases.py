"""The decode worker's KV leases (engine thread only): blocks held for a prompt's KV until a
Generate consumes them, and blocks that must not be reused yet because a sender may still write.

Life of a lease::

    allocate -> open --(KV landed)--> landed --(Generate takes it)--> the engine's request
                 |                      |
                 +---(release/expire)---+--> freed at once when no sender can write any more,
                                             else draining --(sender landed/stopped, or timeout)--> freed

An open lease expires ``seconds`` after allocation if its KV never lands, a landed one
``landed_seconds`` after landing if no Generate uses it. With a one-sided transport (NIXL,
``KVReceiver.remote_writes``) a prefill worker may still be writing a lease that was released or
expired: its blocks stay held ("draining") until as many senders as were handed the lease said
they stopped (or the KV landed), or ``drain_seconds`` pass. Handing such blocks to another
request would let the late writes overwrite that request's KV.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from dayzero.rpc.v1 import transfer_pb2
from dayzero.runtime.engine import Engine
from dayzero.serving.metrics import DecodeMetrics
from dayzero.transfer import KVReceiver

log = logging.getLogger(__name__)

UNKNOWN_SENDERS = -1   # release(senders=...): nobody said how many senders were handed the lease


@dataclass
class Lease:
    request_id: str
    lease_id: str
    num_tokens: int
    expires_at: float                                  # monotonic; while draining: the drain deadline
    landed: bool = False
    stops: int = 0                                     # senders that said they stopped without landing it
    drain_until_stops: int = 0                         # draining: freed once ``stops`` reaches this
    waiters: list[Callable[[bool], None]] = field(default_factory=list)  # called with landed? on land/drop


class LeaseBook:
    def __init__(self, engine: Engine, receiver: KVReceiver | None, metrics: DecodeMetrics,
                 landed_seconds: float = 30.0, drain_seconds: float = 10.0):
        self.engine = engine
        self.receiver = receiver
        self.metrics = metrics
        self.landed_seconds = landed_seconds
        self.drain_seconds = drain_seconds
        self.open: dict[str, Lease] = {}               # lease_id -> lease (routable)
        self.draining: dict[str, Lease] = {}           # lease_id -> lease (blocks held, not routable)

    def __len__(self) -> int:
        return len(self.open)

    def busy(self) -> bool:
        """Whether notifications are expected (the engine loop then polls more often)."""
        return bool(self.open or self.draining)

    def allocate(self, request_id: str, prompt_tokens: int, seconds: float) -> transfer_pb2.KVAllocation:
        alloc = self.engine.allocate(request_id, prompt_tokens)  # KVCacheFullError / ValueError
        lease_id = uuid.uuid4().hex
        self.open[lease_id] = Lease(request_id, lease_id, prompt_tokens, time.monotonic() + seconds)
        if self.receiver is not None:
            self.receiver.expect(request_id, lease_id)
        return transfer_pb2.KVAllocation(
            request_id=request_id, lease_id=lease_id, num_tokens=prompt_tokens,
            layers=[transfer_pb2.LayerBlocks(block_ids=b) for b in alloc.layer_blocks],
            expires_at_unix=time.time() + seconds)

    def watch(self, lease_id: str, request_id: str, cb: Callable[[bool], None]) -> None:
        """``cb(True)`` once the lease's KV has landed, ``cb(False)`` if the lease is gone."""
        lease = self.open.get(lease_id)
        if lease is None or lease.request_id != request_id:
            cb(False)
        elif lease.landed:
            cb(True)
        else:
            lease.waiters.append(cb)

    def take(self, lease_id: str, request_id: str, num_tokens: int) -> None:
        """Hand a landed lease's blocks over to the engine's request of the same id."""
        lease = self.open.get(lease_id)
        if lease is None or lease.request_id != request_id:
            raise LookupError(f"no open lease {lease_id!r} for request {request_id!r} (expired or released)")
        if not lease.landed:
            raise LookupError(f"the KV of lease {lease_id!r} has not landed")
        if num_tokens != lease.num_tokens:
            raise ValueError(f"lease {lease_id!r} holds {lease.num_tokens} tokens but the prompt has {num_tokens}")
        del self.open[lease_id]

    def release(self, request_id: str, lease_id: str, senders: int) -> bool:
        """Drop the request's lease ``lease_id`` (every lease of the request when empty). ``senders``:
        how many prefill workers were handed it (0: none, nothing can be written; UNKNOWN_SENDERS)."""
        found = False
        for lid, lease in list(self.open.items()):
            if lease.request_id == request_id and (not lease_id or lid == lease_id):
                self.drop(lid, senders)
                found = True
        return found

    def drop(self, lease_id: str, senders: int, expired: bool = False) -> None:
        lease = self.open.pop(lease_id, None)
        if lease is None:
            return
        for cb in lease.waiters:
            cb(False)
        lease.waiters.clear()
        if expired:
            self.metrics.leases_expired.inc()
            log.warning("lease %s of %s expired (%s)", lease_id, lease.request_id,
                        "KV landed but never used" if lease.landed else "KV never landed")
        one_sided = self.receiver is not None and self.receiver.remote_writes
        if senders == UNKNOWN_SENDERS:
            senders = lease.stops + 1  # wait for one more sender to say it stopped
        if lease.landed or not one_sided or lease.stops >= senders:
            self._free(lease)
            return
        lease.drain_until_stops = senders
        lease.expires_at = time.monotonic() + self.drain_seconds
        self.draining[lease_id] = lease
        log.info("lease %s of %s ended before its KV landed: its blocks stay held until the prefill worker "
                 "stops writing (at most %.0fs)", lease_id, lease.request_id, self.drain_seconds)

    def poll(self) -> None:
        """Apply the transport's notifications: landed KV, senders that stopped."""
        if self.receiver is None or not self.busy():
            return
        for request_id, lease_id in self.receiver.poll_landed():
            lease = self.open.get(lease_id) or self.draining.get(lease_id)
            if lease is None or lease.request_id != request_id:
                log.info("KV landed for unknown lease %s (%s): ignored", lease_id, request_id)
            elif lease_id in self.draining:
                self._free(self.draining.pop(lease_id))
            elif not lease.landed:
                self.receiver.forget(request_id, lease_id)
                lease.landed = True
                lease.expires_at = time.monotonic() + self.landed_seconds
                for cb in lease.waiters:
                    cb(True)
                lease.waiters.clear()
        for request_id, lease_id in self.receiver.poll_stopped():
            lease = self.open.get(lease_id) or self.draining.get(lease_id)
            if lease is None or lease.request_id != request_id:
                continue
            lease.stops += 1
            if lease_id in self.draining and lease.stops >= lease.drain_until_stops:
                self._free(self.draining.pop(lease_id))

    def expire(self) -> None:
        now = time.monotonic()
        for lid in [lid for lid, lease in self.open.items() if lease.expires_at <= now]:
            self.drop(lid, UNKNOWN_SENDERS, expired=True)
        for lid in [lid for lid, lease in self.draining.items() if lease.expires_at <= now]:
            lease = self.draining.pop(lid)
            log.warning("lease %s of %s: no word from its prefill worker within %.0fs; blocks freed",
                        lid, lease.request_id, self.drain_seconds)
            self._free(lease)

    def _free(self, lease: Lease) -> None:
        if not lease.landed and self.receiver is not None:
            self.receiver.forget(lease.request_id, lease.lease_id)
        self.engine.free(lease.request_id)
