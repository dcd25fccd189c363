"""Worker registry with TTL heartbeats carrying load: Redis, in-process, router-hosted client."""

from .base import ROLES, Registry, RegistryError, open_registry
from .heartbeat import Heartbeat

__all__ = ["ROLES", "Registry", "RegistryError", "open_registry", "Heartbeat"]
