"""``python -m dayzero_prefill``: a prefill worker (gRPC + HTTP health/metrics + registry heartbeat)."""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import sys
import uuid

import grpc

from dayzero.serving.grpc_util import SERVER_OPTIONS, add_health, install_stop_handlers, set_serving, setup_logging


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m dayzero_prefill", description="dayzero prefill worker")
    p.add_argument("--host", default="0.0.0.0")
    p.add_argument("--port", type=int, default=50061)
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
    p.add_argument("--block-size", type=int, default=16, help="must equal the decode workers' block size")
    p.add_argument("--max-model-len", type=int, default=8192)
    p.add_argument("--chunk-size", type=int, default=2048, help="prefill chunk (tokens per forward pass)")
    p.add_argument("--max-queued-tokens", type=int, default=1 << 20, help="backpressure: refuse beyond this")
    p.add_argument("--transfer-timeout", type=float, default=30.0)
    p.add_argument("--heartbeat-seconds", type=float, default=1.0)
    p.add_argument("--worker-id", default=None)
    p.add_argument("--log-level", default="INFO")
    p.add_argument("--fault-chunk-delay", type=float, default=0.0, help=argparse.SUPPRESS)  # tests: sleep per chunk
    return p


async def serve(args) -> int:
    log = setup_logging("prefill", args.log_level)
    from dayzero.registry import Heartbeat, open_registry
    from dayzero.rpc.v1 import prefill_pb2_grpc, worker_pb2, worker_pb2_grpc
    from dayzero.runtime.engine import Engine, EngineConfig
    from dayzero.serving.http import HealthServer
    from dayzero.serving.metrics import PrefillMetrics
    from dayzero.serving.protocol import model_id
    from dayzero.transfer import TransferError, make_sender
    from dayzero.transfer.engine_memory import kv_memory

    from .server import PrefillServicer, WorkerServicer
    from .worker import PrefillWorker

    if args.tp != 1:
        log.error("--tp > 1 needs the multi-rank launcher, which this build does not have; use --tp 1")
        return 2
    advertise = args.advertise_host or socket.gethostname()
    worker_id = args.worker_id or f"prefill-{advertise}-{args.port}-{uuid.uuid4().hex[:6]}"
    metrics = PrefillMetrics.create()
    state = {"ready": False, "reason": "loading the model"}
    http = HealthServer(args.host, args.http_port, metrics.registry,
                        lambda: (state["ready"], state["reason"]), "prefill").start()
    log.info("HTTP /health /ready /metrics on port %d", http.port)
    backend = args.backend or ("triton" if args.device.startswith("cuda") else "torch")
    blocks = -(-args.max_model_len // args.block_size) + 1  # batch 1: one full-length sequence
    config = EngineConfig(block_size=args.block_size, num_kv_blocks=blocks, max_num_seqs=1,
                          max_num_batched_tokens=args.chunk_size, max_model_len=args.max_model_len, max_kv_seqs=2)
    engine = await asyncio.to_thread(Engine.from_dir, args.model, dtype=args.dtype, backend=backend,
                                     device=args.device, config=config, max_positions=args.max_model_len)
    memory = kv_memory(engine.kv, model_id(args.model), args.tp)
    try:
        sender = make_sender(args.transport, memory)
    except TransferError as e:
        log.error("%s", e)
        return 2
    log.info("KV transport %s; compat %s (block size %d)", args.transport, memory.compat.hash(), args.block_size)
    worker = PrefillWorker(engine, sender, metrics, worker_id, args.max_queued_tokens, args.transfer_timeout,
                           args.fault_chunk_delay).start()

    server = grpc.aio.server(options=SERVER_OPTIONS)
    prefill_pb2_grpc.add_PrefillServicer_to_server(PrefillServicer(worker), server)
    worker_pb2_grpc.add_WorkerServicer_to_server(WorkerServicer(worker), server)
    health = add_health(server, [])
    if server.add_insecure_port(f"{args.host}:{args.port}") == 0:
        log.error("cannot bind gRPC port %s:%d", args.host, args.port)
        return 2
    await server.start()
    await set_serving(health, ["dayzero.rpc.v1.Prefill", "dayzero.rpc.v1.Worker"], True)

    def record() -> worker_pb2.WorkerRecord:
        return worker_pb2.WorkerRecord(worker_id=worker_id, role="prefill", address=f"{advertise}:{args.port}",
                                       http_address=f"{advertise}:{http.port}", compat_hash=memory.compat.hash(),
                                       transport=args.transport, load=worker.load, block_size=args.block_size)

    heartbeat = Heartbeat(open_registry(args.redis_url), record, interval=args.heartbeat_seconds).start()
    state["reason"] = "registering in " + heartbeat.registry.url

    async def ready_when_registered():
        await asyncio.to_thread(heartbeat.registered.wait)
        state.update(ready=True, reason="")
        log.info("prefill worker %s ready on %s:%d", worker_id, args.host, args.port)

    waiter = asyncio.create_task(ready_when_registered())
    stop = asyncio.Event()
    install_stop_handlers(stop)
    await stop.wait()
    log.info("stopping")
    waiter.cancel()
    state.update(ready=False, reason="stopping")
    await set_serving(health, ["dayzero.rpc.v1.Prefill", "dayzero.rpc.v1.Worker"], False)
    heartbeat.registered.set()
    await asyncio.to_thread(heartbeat.stop)
    await server.stop(2)
    worker.stop()
    sender.close()
    http.stop()
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "2")
    return asyncio.run(serve(args))


if __name__ == "__main__":
    sys.exit(main())
