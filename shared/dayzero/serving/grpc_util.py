"""gRPC helpers shared by the services: server options, the standard health service, shutdown."""

from __future__ import annotations

import asyncio
import logging
import signal

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

MAX_MESSAGE_BYTES = 64 * 1024 * 1024
KEEPALIVE_MS = 10000            # our channels ping an idle connection this often (a dead peer shows in ~15 s)
MIN_PING_INTERVAL_MS = 1000     # our servers accept pings this often, calls or not (must be <= KEEPALIVE_MS:
                                # gRPC's default, 5 min, answers a third early ping with GOAWAY too_many_pings,
                                # failing every call that has been silent ~40 s, e.g. a long prefill)
SERVER_OPTIONS = [("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                  ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                  ("grpc.so_reuseport", 0),
                  ("grpc.keepalive_permit_without_calls", 1),
                  ("grpc.http2.min_ping_interval_without_data_ms", MIN_PING_INTERVAL_MS)]
CHANNEL_OPTIONS = [("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                   ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                   ("grpc.keepalive_time_ms", KEEPALIVE_MS),
                   ("grpc.keepalive_timeout_ms", 5000),
                   ("grpc.http2.ping_timeout_ms", 5000),  # what bounds the wait for a ping's ack (default 60 s)
                   ("grpc.keepalive_permit_without_calls", 1),
                   ("grpc.http2.max_pings_without_data", 0)]


def add_health(server: grpc.aio.Server, services: list[str]) -> health.aio.HealthServicer:
    """Register grpc.health.v1 with every service NOT_SERVING until ``set_serving``."""
    servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    return servicer


async def set_serving(servicer, services: list[str], serving: bool) -> None:
    status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
    for name in ["", *services]:
        await servicer.set(name, status)


class GrpcServer:
    """A grpc.aio server (SERVER_OPTIONS) with grpc.health.v1, whose ``services`` (full gRPC service
    names) turn SERVING / NOT_SERVING together with the server's overall status."""

    def __init__(self, services: list[str]):
        self.server = grpc.aio.server(options=SERVER_OPTIONS)
        self.services = list(services)
        self.health = add_health(self.server, self.services)

    async def start(self, host: str, port: int, log: logging.Logger) -> bool:
        """Bind ``host:port`` and start; False (logged on ``log``) when the port cannot be bound."""
        try:
            bound = self.server.add_insecure_port(f"{host}:{port}")
        except RuntimeError as e:  # grpc.aio raises where the sync server returned 0
            log.error("cannot bind gRPC port %s:%d: %s", host, port, e)
            return False
        if bound == 0:
            log.error("cannot bind gRPC port %s:%d", host, port)
            return False
        await self.server.start()
        return True

    async def set_serving(self, serving: bool) -> None:
        await set_serving(self.health, self.services, serving)

    async def stop(self, grace: float = 2.0) -> None:
        await self.server.stop(grace)


def install_stop_handlers(stop: asyncio.Event) -> None:
    """SIGTERM / SIGINT set ``stop`` (graceful shutdown of the asyncio main)."""
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        try:
            loop.add_signal_handler(sig, stop.set)
        except (NotImplementedError, RuntimeError):
            pass


async def wait_for_stop(log: logging.Logger) -> None:
    """Return once SIGTERM or SIGINT arrives (logging "stopping")."""
    stop = asyncio.Event()
    install_stop_handlers(stop)
    await stop.wait()
    log.info("stopping")


def setup_logging(service: str, level: str = "INFO") -> logging.Logger:
    logging.basicConfig(level=getattr(logging, level.upper(), logging.INFO),
                        format=f"%(asctime)s {service} %(levelname)s %(name)s: %(message)s")
    return logging.getLogger(service)
