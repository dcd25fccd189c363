"""The process lifecycle the model workers share (``python -m dayzero_prefill`` / ``dayzero_decode``).

``worker_parser`` builds the command line every worker has; each service's ``build_parser()`` adds
its own flags to it. ``run_worker(role, args)`` runs one worker process from start to stop; a
``WorkerRole`` supplies only what differs between prefill and decode: engine sizing, its end of the
KV transport, the engine-thread worker object and its gRPC servicers.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import uuid
from abc import ABC, abstractmethod
from dataclasses import dataclass
from collections.abc import Callable
from typing import Any, Protocol

import grpc

from dayzero.rpc.v1 import worker_pb2, worker_pb2_grpc
from dayzero.serving.grpc_util import GrpcServer, setup_logging, wait_for_stop
from dayzero.serving.parent_watch import exit_with_parent

WORKER_SERVICE = "dayzero.rpc.v1.Worker"


class RoleWorker(Protocol):
    """A role's engine-thread object: its current load (sent with every heartbeat), how long its
    engine thread has been stuck (``stalled_for``) and ``stop()``."""

    load: worker_pb2.WorkerLoad

    def stalled_for(self) -> float: ...

    def stop(self) -> None: ...


class TransportEnd(Protocol):
    """A role's end of the KV transport (a sender on prefill, a receiver on decode)."""

    def close(self) -> None: ...


@dataclass
class Readiness:
    """What ``/ready`` answers: (ready, reason). ``problem`` (set once the engine runs) names what
    makes a started worker unready for now, e.g. a stalled engine thread."""

    ready: bool = False
    reason: str = "loading the model"
    problem: Callable[[], str] | None = None

    def __call__(self) -> tuple[bool, str]:
        if self.ready and self.problem is not None:
            problem = self.problem()
            if problem:
                return False, problem
        return self.ready, self.reason


class LoadServicer(worker_pb2_grpc.WorkerServicer):
    """Worker.GetLoad: the worker's current load, the same message its heartbeat carries."""

    def __init__(self, worker: RoleWorker):
        self.worker = worker

    async def GetLoad(self, request, context):
        return self.worker.load


class WorkerRole(ABC):
    """What one kind of model worker adds to the lifecycle that ``run_worker`` runs.

    ``name``: "prefill" or "decode" (the registry role, the log prefix, the HTTP service name).
    ``grpc_services``: the role's own gRPC services, set SERVING in grpc.health.v1 together with Worker.
    ``parallel_flags``: parallelism flags (``tp``, ``ep``) that this build accepts only at 1.
    Hooks import what they need lazily, so that importing a ``__main__`` (for ``build_parser``) stays cheap.
    """

    name: str
    grpc_services: tuple[str, ...]
    parallel_flags: tuple[str, ...] = ("tp",)

    @abstractmethod
    def create_metrics(self) -> Any:
        """The role's metrics (a dataclass with a prometheus ``registry``)."""

    @abstractmethod
    def engine_config(self, args: argparse.Namespace) -> Any:
        """The ``EngineConfig`` the engine is loaded with."""

    @abstractmethod
    def open_transport(self, args: argparse.Namespace, memory: Any, endpoint: str) -> TransportEnd:
        """This worker's end of the KV transport over the engine's KV ``memory`` (may raise TransferError)."""

    @abstractmethod
    def start_worker(self, args: argparse.Namespace, engine: Any, transport: TransportEnd, metrics: Any,
                     worker_id: str) -> RoleWorker:
        """The started engine-thread worker."""

    @abstractmethod
    def add_servicers(self, server: grpc.aio.Server, args: argparse.Namespace, worker: RoleWorker,
                      transport: TransportEnd) -> None:
        """Register the role's gRPC servicers (Worker.GetLoad and health are added by ``run_worker``)."""


def worker_parser(name: str, default_port: int) -> argparse.ArgumentParser:
    """The flags every model worker has (pinned: the Helm chart and ``dayzero serve`` pass them)."""
    p = argparse.ArgumentParser(prog=f"python -m dayzero_{name}", description=f"dayzero {name} worker")
    p.add_argument("--host", default="0.0.0.0")
    p.add_argument("--port", type=int, default=default_port)
    p.add_argument("--model", required=True, help="checkpoint directory (HF gpt-oss layout or FP8)")
    p.add_argument("--redis-url", required=True,
                   help="registry: redis://HOST:PORT[/DB], or router://HOST:PORT for the router-hosted one")
    p.add_argument("--advertise-host", default=None, help="address others use to reach this worker")
    p.add_argument("--http-port", type=int, default=9100)
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32", "fp8"))
    p.add_argument("--backend", default=None, help="kernel backend (default: torch on cpu, triton on cuda)")
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--transport", choices=("nixl", "grpc"), default="nixl")
    p.add_argument("--max-model-len", type=int, default=8192)
    p.add_argument("--heartbeat-seconds", type=float, default=1.0)
    p.add_argument("--stall-seconds", type=float, default=60.0,
                   help="an engine thread stuck this long withdraws the worker from the registry and /ready "
                        "until it moves again")
    p.add_argument("--worker-id", default=None)
    p.add_argument("--log-level", default="INFO")
    return p


def worker_main(role: WorkerRole, parser: argparse.ArgumentParser, argv: list[str] | None = None) -> int:
    """Parse the command line and run the worker (the body of each worker's ``main``)."""
    args = parser.parse_args(argv)
    exit_with_parent()
    os.environ.setdefault("OMP_NUM_THREADS", "2")
    return asyncio.run(run_worker(role, args))


async def run_worker(role: WorkerRole, args: argparse.Namespace) -> int:
    """Run one worker until SIGTERM/SIGINT. Returns the exit code: 0, or 2 for unsupported
    parallelism, a transport that cannot be opened, or a gRPC port that cannot be bound.

    Start: HTTP /health /ready /metrics (not ready while loading), the engine and its KV memory, the
    transport end, the worker thread, gRPC (the role's servicers, Worker.GetLoad, grpc.health.v1), then
    the registry heartbeat; /ready turns true after the first registration. Stop: not ready, gRPC
    NOT_SERVING, heartbeat stopped, then gRPC server, worker, transport and HTTP.
    """
    log = setup_logging(role.name, args.log_level)
    from dayzero.registry import Heartbeat, open_registry
    from dayzero.runtime.engine import Engine
    from dayzero.serving.http import HealthServer
    from dayzero.serving.protocol import model_id
    from dayzero.transfer import TransferError
    from dayzero.transfer.engine_memory import kv_memory

    if any(getattr(args, flag) != 1 for flag in role.parallel_flags):
        log.error("%s > 1 needs the multi-rank launcher, which this build does not have; use %s",
                  "/".join(f"--{f}" for f in role.parallel_flags), " ".join(f"--{f} 1" for f in role.parallel_flags))
        return 2
    advertise = args.advertise_host or socket.gethostname()
    address = f"{advertise}:{args.port}"
    worker_id = args.worker_id or f"{role.name}-{advertise}-{args.port}-{uuid.uuid4().hex[:6]}"
    metrics = role.create_metrics()
    readiness = Readiness()
    http = HealthServer(args.host, args.http_port, metrics.registry, readiness, role.name).start()
    log.info("HTTP /health /ready /metrics on port %d", http.port)
    backend = args.backend or ("triton" if args.device.startswith("cuda") else "torch")
    config = role.engine_config(args)
    engine = await asyncio.to_thread(Engine.from_dir, args.model, dtype=args.dtype, backend=backend,
                                     device=args.device, config=config, max_positions=args.max_model_len)
    graphs = await asyncio.to_thread(engine.warmup)  # capture decode CUDA graphs before reporting ready
    if graphs:
        log.info("captured %d decode CUDA graphs", graphs)
    memory = kv_memory(engine.kv, model_id(args.model), args.tp)
    try:
        transport = role.open_transport(args, memory, address)
    except TransferError as e:
        log.error("%s", e)
        return 2
    log.info("KV transport %s; compat %s (block size %d)", args.transport, memory.compat.hash(), args.block_size)
    worker = role.start_worker(args, engine, transport, metrics, worker_id)

    server = GrpcServer([*role.grpc_services, WORKER_SERVICE])
    role.add_servicers(server.server, args, worker, transport)
    worker_pb2_grpc.add_WorkerServicer_to_server(LoadServicer(worker), server.server)
    if not await server.start(args.host, args.port, log):
        return 2
    await server.set_serving(True)

    def record() -> worker_pb2.WorkerRecord:
        return worker_pb2.WorkerRecord(worker_id=worker_id, role=role.name, address=address,
                                       http_address=f"{advertise}:{http.port}", compat_hash=memory.compat.hash(),
                                       transport=args.transport, load=worker.load, block_size=args.block_size)

    def problem() -> str:
        stalled = worker.stalled_for()
        if stalled > args.stall_seconds:
            return f"engine thread stuck for {stalled:.1f}s (--stall-seconds {args.stall_seconds:g})"
        return ""

    readiness.problem = problem
    heartbeat = Heartbeat(open_registry(args.redis_url), record, interval=args.heartbeat_seconds,
                          problem=problem).start()
    readiness.reason = "registering in " + heartbeat.registry.url

    async def ready_when_registered():
        await asyncio.to_thread(heartbeat.registered.wait)
        readiness.ready, readiness.reason = True, ""
        log.info("%s worker %s ready on %s:%d", role.name, worker_id, args.host, args.port)

    waiter = asyncio.create_task(ready_when_registered())
    await wait_for_stop(log)
    waiter.cancel()
    heartbeat.registered.set()  # lets the waiter's thread finish
    readiness.ready, readiness.reason = False, "stopping"
    await server.set_serving(False)
    await asyncio.to_thread(heartbeat.stop)
    await server.stop(2)
    worker.stop()
    transport.close()
    http.stop()
    return 0
