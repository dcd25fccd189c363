"""NIXL (UCX) KV transport: one-sided WRITEs from the prefill worker's pools into the decode
worker's pools, on host memory (DRAM) on a CPU box and on device memory (VRAM) on GPUs.

The receiver registers its pools and publishes its agent metadata (``info()``, sent out of band
in the Allocate reply); the sender loads that metadata, WRITEs the planned blocks as one
transfer request and attaches a notification naming the request, which the receiver sees in
``poll_landed`` after the data is in place.
"""

from __future__ import annotations

import collections
import logging
import os
import socket
import threading
import time
import uuid
from dataclasses import dataclass

import numpy as np

from dayzero.rpc.v1 import transfer_pb2

from .base import KVMemory, KVReceiver, KVSender, TransferPlan, TransferResult, landed_tag, parse_tag, stopped_tag
from .handshake import IncompatiblePeer, TransferError, check_compatible

log = logging.getLogger(__name__)


def _nixl_api():
    try:
        from nixl_cu13 import _api
    except Exception as e:  # noqa: BLE001 - any load failure means the same thing to the user
        raise TransferError(f"NIXL cannot load ({type(e).__name__}: {e}); install nixl-cu13 or choose the "
                            "gRPC byte-stream fallback explicitly with --transport grpc") from None
    return _api


def agent_name(role: str) -> str:
    return f"dz-{role}-{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def _make_agent(name: str, memory: KVMemory):
    api = _nixl_api()
    # no progress thread: it busy-polls a core even when idle; transfers progress in our own
    # calls instead (check_xfer_state on the sender, get_new_notifs on the receiver)
    agent = api.nixl_agent(name, api.nixl_agent_config(enable_prog_thread=False, backends=["UCX"]))
    if "UCX" not in agent.backends:
        raise TransferError("NIXL loaded but its UCX backend did not start; use --transport grpc")
    reg = agent.register_memory([p.tensor for p in memory.pools])
    if reg is None:
        raise TransferError("NIXL could not describe the KV pools for registration")
    return agent, reg


class NixlReceiver(KVReceiver):
    """Registers the local pools with NIXL and turns notifications into landed requests.

    A small progress thread polls the agent every millisecond while transfers are expected
    (``expect``/``forget``), so writes that need the target's progress (UCX over TCP) move even
    while the owner is busy, e.g. inside a decode step; idle, it polls twice a second.
    """

    name = "nixl"
    remote_writes = True   # one-sided WRITEs: a sender may still write a lease after ``forget``

    def __init__(self, memory: KVMemory, role: str = "decode", poll_seconds: float = 0.001):
        super().__init__(memory)
        self.agent_name = agent_name(role)
        self._agent, self._reg = _make_agent(self.agent_name, memory)
        self._metadata = self._agent.get_agent_metadata()
        self._lock = threading.Lock()
        self._landed: collections.deque[tuple[str, str]] = collections.deque()
        self._stopped: collections.deque[tuple[str, str]] = collections.deque()
        self._expected = 0
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._poll_seconds = poll_seconds
        self._thread = threading.Thread(target=self._progress, name="nixl-receiver", daemon=True)
        self._thread.start()

    def info(self) -> transfer_pb2.KVReceiverInfo:
        return transfer_pb2.KVReceiverInfo(
            transport="nixl", compat=self.memory.compat.to_proto(), agent_name=self.agent_name,
            agent_metadata=self._metadata, memory_type=self.memory.memory_type,
            regions=[p.to_proto() for p in self.memory.pools])

    def expect(self, request_id: str, lease_id: str) -> None:
        with self._lock:
            self._expected += 1
        self._wake.set()

    def forget(self, request_id: str, lease_id: str) -> None:
        with self._lock:
            self._expected = max(0, self._expected - 1)

    def _poll(self) -> None:
        with self._lock:
            notifs = self._agent.get_new_notifs()
        for msgs in notifs.values():
            for m in msgs:
                tag = parse_tag(m)
                if tag is None:
                    log.warning("ignoring unknown NIXL notification %r", m[:64])
                else:
                    (self._landed if tag[0] == "landed" else self._stopped).append(tag[1:])

    def _progress(self) -> None:
        while not self._stop.is_set():
            try:
                self._poll()
            except Exception:  # noqa: BLE001 - keep progressing; the owner sees missing landings
                log.exception("NIXL notification poll failed")
            if self._expected:
                time.sleep(self._poll_seconds)
            else:
                self._wake.wait(0.5)
                self._wake.clear()

    def poll_landed(self) -> list[tuple[str, str]]:
        out = []
        while self._landed:
            out.append(self._landed.popleft())
        return out

    def poll_stopped(self) -> list[tuple[str, str]]:
        out = []
        while self._stopped:
            out.append(self._stopped.popleft())
        return out

    def close(self) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout=2)
        with self._lock:
            try:
                self._agent.deregister_memory(self._reg)
            except Exception:  # noqa: BLE001 - best effort at shutdown
                pass


@dataclass
class PostedWrite:
    remote: str
    handle: object | None       # nixl_xfer_handle; None once released or when nothing was written
    state: str                  # "PROC" | "DONE" | "ERR" when posted
    nbytes: int
    t0: float


class NixlSender(KVSender):
    """WRITEs planned blocks into a remote NIXL receiver, then notifies it."""

    name = "nixl"
    overlaps = True

    def __init__(self, memory: KVMemory, role: str = "prefill"):
        super().__init__(memory)
        self.agent_name = agent_name(role)
        self._agent, self._reg = _make_agent(self.agent_name, memory)
        self._remotes: set[str] = set()
        self._lock = threading.Lock()

    def _descriptors(self, receiver: transfer_pb2.KVReceiverInfo, plan: TransferPlan):
        """(local rows, remote rows) as uint64 [N, 3] arrays of (address, length, device)."""
        local, remote = [], []
        for region in receiver.regions:
            if region.layer >= len(plan.pairs):
                raise TransferError(f"receiver region for layer {region.layer} but the plan has {len(plan.pairs)} layers")
            pool = self.memory.pool(region.layer, region.kind)
            if pool.block_bytes != region.block_bytes:
                raise IncompatiblePeer(f"KV transfer refused: block_bytes of layer {region.layer} {region.kind}: "
                                       f"ours {pool.block_bytes}, peer {region.block_bytes}", ["block_bytes"])
            for src, dst in plan.pairs[region.layer]:
                if not 0 <= src < pool.num_blocks or not 0 <= dst < region.num_blocks:
                    raise TransferError(f"block out of range in plan for {plan.request_id}: layer {region.layer} "
                                        f"src {src}/{pool.num_blocks} dst {dst}/{region.num_blocks}")
                local.append((pool.base_address + src * pool.block_bytes, pool.block_bytes, pool.device_id))
                remote.append((region.base_address + dst * region.block_bytes, region.block_bytes, region.device_id))
        return np.array(local, dtype=np.uint64).reshape(-1, 3), np.array(remote, dtype=np.uint64).reshape(-1, 3)

    def post(self, receiver: transfer_pb2.KVReceiverInfo, plan: TransferPlan, notify: bool = True) -> "PostedWrite":
        """Start WRITEs of ``plan`` without waiting (the caller keeps computing); ``wait`` ends them.
        With ``notify`` the receiver is told the request's KV is complete once this write lands."""
        if receiver.transport != "nixl":
            raise TransferError(f"this worker sends KV over nixl but the receiver expects {receiver.transport!r}; "
                                "start both with the same --transport")
        check_compatible(self.memory.compat, receiver.compat, "decode worker")
        t0 = time.perf_counter()
        local, remote = self._descriptors(receiver, plan)
        tag = landed_tag(plan.request_id, plan.lease_id) if notify else b""
        nbytes = int(local[:, 1].sum()) if len(local) else 0
        with self._lock:
            if receiver.agent_name not in self._remotes:
                self._agent.add_remote_agent(receiver.agent_metadata)
                self._remotes.add(receiver.agent_name)
            if len(local) == 0:
                if notify:
                    self._agent.send_notif(receiver.agent_name, tag)
                return PostedWrite(receiver.agent_name, None, "DONE", nbytes, t0)
            try:
                ldesc = self._agent.get_xfer_descs(local, self.memory.memory_type)
                rdesc = self._agent.get_xfer_descs(remote, receiver.memory_type or "DRAM")
                handle = self._agent.initialize_xfer("WRITE", ldesc, rdesc, receiver.agent_name, tag)
                state = self._agent.transfer(handle)
            except Exception as e:  # noqa: BLE001 - NIXL raises its own types; ours names the peer
                self._forget(receiver.agent_name)
                raise TransferError(f"NIXL write to {receiver.agent_name} could not start: {e}") from None
        return PostedWrite(receiver.agent_name, handle, state, nbytes, t0)

    def wait(self, posted: "PostedWrite", timeout: float = 30.0) -> TransferResult:
        deadline = time.perf_counter() + timeout
        try:
            state = posted.state
            while state == "PROC":
                if time.perf_counter() > deadline:
                    raise TransferError(f"NIXL write to {posted.remote} timed out after {timeout:.0f}s")
                time.sleep(0.0002)
                with self._lock:
                    state = self._agent.check_xfer_state(posted.handle)
            if state != "DONE":
                raise TransferError(f"NIXL write to {posted.remote} failed (state {state})")
        except TransferError:
            with self._lock:
                self._forget(posted.remote)
            raise
        finally:
            if posted.handle is not None:
                with self._lock:
                    try:
                        posted.handle.release()  # releasing an unfinished transfer aborts it
                    except Exception as e:  # noqa: BLE001
                        log.warning("releasing NIXL transfer handle: %s", e)
                posted.handle = None
        return TransferResult(bytes=posted.nbytes, seconds=time.perf_counter() - posted.t0, transport="nixl")

    def send(self, receiver: transfer_pb2.KVReceiverInfo, plan: TransferPlan, timeout: float = 30.0) -> TransferResult:
        return self.wait(self.post(receiver, plan, notify=True), timeout)

    def stopped(self, receiver: transfer_pb2.KVReceiverInfo, request_id: str, lease_id: str) -> None:
        if receiver.transport != "nixl" or not receiver.agent_name:
            return
        try:
            with self._lock:
                if receiver.agent_name not in self._remotes:
                    self._agent.add_remote_agent(receiver.agent_metadata)
                    self._remotes.add(receiver.agent_name)
                self._agent.send_notif(receiver.agent_name, stopped_tag(request_id, lease_id))
        except Exception as e:  # noqa: BLE001 - best effort: the receiver frees the lease after a timeout
            log.warning("could not tell %s that lease %s is stopped: %s", receiver.agent_name, lease_id, e)

    def _forget(self, remote: str) -> None:
        self._remotes.discard(remote)
        try:
            self._agent.remove_remote_agent(remote)
        except Exception:  # noqa: BLE001 - the peer may already be gone
            pass

    def close(self) -> None:
        with self._lock:
            for r in list(self._remotes):
                self._forget(r)
            try:
                self._agent.deregister_memory(self._reg)
            except Exception:  # noqa: BLE001
                pass
