"""Worker registry: where workers announce themselves (with their load) and the router looks.

Records are ``WorkerRecord`` protos (typed; the same message the router-hosted registry speaks).
A record lives ``ttl_seconds`` after its last heartbeat; a worker that stops heartbeating drops
out by itself. Implementations: Redis (``redis://``), in-process (``memory://``, inside the
router), and a client of the router-hosted one (``router://HOST:PORT``, for workers when the
router runs the in-process registry).
"""

from __future__ import annotations

import abc

from dayzero.rpc.v1 import worker_pb2

ROLES = ("prefill", "decode")


class RegistryError(RuntimeError):
    """The registry cannot be reached or answered nonsense."""


class Registry(abc.ABC):
    """Put/remove/list worker records. Every call may raise ``RegistryError``."""

    url: str = ""

    @abc.abstractmethod
    def put(self, record: worker_pb2.WorkerRecord) -> None:
        """Create or refresh ``record`` for ``record.ttl_seconds``."""

    @abc.abstractmethod
    def remove(self, role: str, worker_id: str) -> None:
        ...

    @abc.abstractmethod
    def list(self, role: str = "") -> list[worker_pb2.WorkerRecord]:
        """Live records of ``role`` (all roles when empty)."""

    def close(self) -> None:
        pass

    @property
    def kind(self) -> str:
        return type(self).__name__


def open_registry(url: str) -> Registry:
    """The registry for ``url``: redis://, rediss://, unix:// | memory:// | router://HOST:PORT."""
    if not url:
        raise ValueError("empty registry URL (use redis://HOST:PORT, memory:// or router://HOST:PORT)")
    scheme = url.split("://", 1)[0].lower() if "://" in url else ""
    if scheme in ("redis", "rediss", "unix"):
        from .redis_store import RedisRegistry
        return RedisRegistry(url)
    if scheme == "memory":
        from .memory import InProcessRegistry
        return InProcessRegistry()
    if scheme == "router":
        from .memory import RouterRegistryClient
        return RouterRegistryClient(url.split("://", 1)[1])
    raise ValueError(f"unsupported registry URL {url!r} (use redis://HOST:PORT, memory:// or router://HOST:PORT)")
