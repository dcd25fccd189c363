"""Async gRPC client of the router's ``Generate`` stream (proto/dayzero/rpc/v1/router.proto)."""

from __future__ import annotations

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from dayzero.rpc.v1 import router_pb2, router_pb2_grpc
from dayzero.serving.grpc_util import CHANNEL_OPTIONS

from dayzero_frontend.errors import APIError, from_grpc


class RouterStream:
    """One server-streaming Generate call. ``cancel()`` is safe at any time and idempotent."""

    def __init__(self, call: grpc.aio.UnaryStreamCall):
        self._call = call
        self.finished = False

    async def next(self) -> router_pb2.GenerateResponse | None:
        """The next message, None at the end of the stream; a router failure raises APIError."""
        if self.finished:
            return None
        try:
            msg = await self._call.read()
        except grpc.aio.AioRpcError as e:
            self.finished = True
            raise from_grpc(e.code(), e.details()) from e
        if msg is grpc.aio.EOF:
            self.finished = True
            return None
        return msg

    def cancel(self) -> bool:
        """Cancel downstream if still running; True when a cancel was actually sent."""
        if self.finished:
            return False
        self.finished = True
        return self._call.cancel()


class RouterClient:
    """Owns the channel to the router; create it inside the serving event loop (``start``)."""

    def __init__(self, address: str):
        self.address = address
        self._channel: grpc.aio.Channel | None = None
        self._stub: router_pb2_grpc.RouterStub | None = None

    async def start(self) -> None:
        # keepalive pings: a router that stops answering (host gone, process frozen) fails the
        # streams in flight with UNAVAILABLE within ~15 s instead of leaving them waiting forever
        self._channel = grpc.aio.insecure_channel(self.address, options=CHANNEL_OPTIONS)
        self._stub = router_pb2_grpc.RouterStub(self._channel)

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close(grace=None)
            self._channel = None

    def open(self, request: router_pb2.GenerateRequest) -> RouterStream:
        if self._stub is None:
            raise APIError(503, "router client is not started")
        return RouterStream(self._stub.Generate(request))

    async def ready(self, timeout_s: float = 2.0) -> tuple[bool, str]:
        """Whether the router answers its grpc.health.v1 check (SERVING)."""
        if self._channel is None:
            return False, "router client is not started"
        stub = health_pb2_grpc.HealthStub(self._channel)
        try:
            reply = await stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=timeout_s)
        except grpc.aio.AioRpcError as e:
            return False, f"router {self.address}: {e.code().name.lower()}: {e.details()}"
        ok = reply.status == health_pb2.HealthCheckResponse.SERVING
        return ok, f"router {self.address}: {health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)}"
