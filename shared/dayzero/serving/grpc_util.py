"""gRPC helpers shared by the services: server options, the standard health service, shutdown."""

from __future__ import annotations

import asyncio
import logging
import signal

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

MAX_MESSAGE_BYTES = 64 * 1024 * 1024
SERVER_OPTIONS = [("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                  ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                  ("grpc.so_reuseport", 0)]
CHANNEL_OPTIONS = [("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                   ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                   ("grpc.keepalive_time_ms", 10000),
                   ("grpc.keepalive_timeout_ms", 5000),
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


def install_stop_handlers(stop: asyncio.Event) -> None:
    """SIGTERM / SIGINT set ``stop`` (graceful shutdown of the asyncio main)."""
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        try:
            loop.add_signal_handler(sig, stop.set)
        except (NotImplementedError, RuntimeError):
            pass


def setup_logging(service: str, level: str = "INFO") -> logging.Logger:
    logging.basicConfig(level=getattr(logging, level.upper(), logging.INFO),
                        format=f"%(asctime)s {service} %(levelname)s %(name)s: %(message)s")
    return logging.getLogger(service)
