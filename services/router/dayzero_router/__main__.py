"""``python -m dayzero_router``: the router (Router.Generate over gRPC, HTTP health/metrics).

``--redis-url`` names the registry: ``redis://HOST:PORT[/DB]``, or ``memory://`` to host an
in-process registry here (workers then use ``--redis-url router://THIS_HOST:PORT``).
"""

from __future__ import annotations

import argparse
import asyncio
import sys

from dayzero.serving.grpc_util import GrpcServer, setup_logging, wait_for_stop
from dayzero.serving.parent_watch import exit_with_parent


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m dayzero_router", description="dayzero router")
    p.add_argument("--host", default="0.0.0.0")
    p.add_argument("--port", type=int, default=50051)
    p.add_argument("--redis-url", required=True, help="redis://HOST:PORT[/DB], or memory:// (in-process registry)")
    p.add_argument("--http-port", type=int, default=9100)
    p.add_argument("--disagg-threshold", type=int, default=256,
                   help="prompts shorter than this many tokens are prefilled on the decode worker")
    p.add_argument("--allocate-timeout", type=float, default=10.0)
    p.add_argument("--prefill-timeout", type=float, default=120.0)
    p.add_argument("--token-timeout", type=float, default=60.0, help="longest wait for the next decode message")
    p.add_argument("--kv-wait-seconds", type=float, default=30.0)
    p.add_argument("--log-level", default="INFO")
    return p


async def serve(args) -> int:
    log = setup_logging("router", args.log_level)
    from dayzero.registry import open_registry
    from dayzero.registry.memory import InProcessRegistry, RegistryServicer
    from dayzero.rpc.v1 import router_pb2_grpc, worker_pb2_grpc
    from dayzero.serving.http import HealthServer
    from dayzero.serving.metrics import RouterMetrics

    from .server import RouterConfig, RouterServicer
    from .workers import WorkerView

    try:
        registry = open_registry(args.redis_url)
    except ValueError as e:
        log.error("%s", e)
        return 2
    if isinstance(registry, InProcessRegistry):
        log.info("no Redis: hosting an in-process registry (workers heartbeat to router://<this host>:%d)", args.port)
    metrics = RouterMetrics.create()
    view = WorkerView(registry)
    config = RouterConfig(disagg_threshold=args.disagg_threshold, allocate_timeout=args.allocate_timeout,
                          prefill_timeout=args.prefill_timeout, token_timeout=args.token_timeout,
                          kv_wait_seconds=args.kv_wait_seconds)
    server = GrpcServer(["dayzero.rpc.v1.Router"])
    router_pb2_grpc.add_RouterServicer_to_server(RouterServicer(view, config, metrics), server.server)
    if isinstance(registry, InProcessRegistry):
        worker_pb2_grpc.add_RegistryServicer_to_server(RegistryServicer(registry), server.server)
    if not await server.start(args.host, args.port, log):
        return 2
    view.start()

    def ready() -> tuple[bool, str]:
        if not view.registry_ok:
            return False, f"registry unreadable: {view.registry_error}"
        for role in ("prefill", "decode"):
            metrics.workers.labels(role).set(len(view.live(role)))
        if not view.live("decode"):
            return False, "no decode worker registered"
        return True, ""

    def workers() -> dict:
        """GET /workers: what the router routes to now (live = not suspected after a failure)."""
        return {role: [{"worker_id": r.worker_id, "address": r.address, "compat_hash": r.compat_hash,
                        "block_size": r.block_size, "kv_blocks_free": r.load.kv_blocks_free,
                        "queued_tokens": r.load.queued_tokens} for r in view.live(role)]
                for role in ("prefill", "decode")}

    http = HealthServer(args.host, args.http_port, metrics.registry, ready, "router", {"/workers": workers}).start()
    await server.set_serving(True)
    log.info("router serving on %s:%d (HTTP %d), registry %s, disaggregation threshold %d tokens",
             args.host, args.port, http.port, registry.url, args.disagg_threshold)
    await wait_for_stop(log)
    await server.set_serving(False)
    await server.stop(2)
    await view.close()
    http.stop()
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    exit_with_parent()
    return asyncio.run(serve(args))


if __name__ == "__main__":
    sys.exit(main())
