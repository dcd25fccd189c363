"""The whole dayzero stack as local processes: redis-server (or the router's in-process registry),
router, prefill and decode workers, and the OpenAI frontend. Used by ``dayzero serve`` and by the
end-to-end tests (which kill, restart and add processes through it)."""

from __future__ import annotations

import logging
import os
import tempfile
import threading
from dataclasses import dataclass, field

from .launch import (Interrupted, ManagedProcess, PortPicker, ProcessFailed, python_module, redis_server_binary,
                     start_redis, wait_ready)

log = logging.getLogger(__name__)


@dataclass
class StackConfig:
    model_dir: str
    host: str = "127.0.0.1"
    frontend_port: int = 0                 # 0 = a free port
    with_frontend: bool = True
    transport: str = "nixl"
    block_size: int = 16
    disagg_threshold: int = 256
    use_redis: bool | None = None          # None: when redis-server is installed
    num_prefill: int = 1
    num_decode: int = 1
    prefill_args: list[str] = field(default_factory=list)
    decode_args: list[str] = field(default_factory=list)
    router_args: list[str] = field(default_factory=list)
    frontend_args: list[str] = field(default_factory=list)
    log_dir: str | None = None
    ready_timeout: float = 120.0


@dataclass
class Service:
    process: ManagedProcess
    grpc_port: int
    http_port: int
    ready_url: str


class LocalStack:
    def __init__(self, config: StackConfig):
        self.config = config
        self.log_dir = config.log_dir or tempfile.mkdtemp(prefix="dayzero-stack-")
        self.redis: ManagedProcess | None = None
        self.redis_port = 0
        self.registry_for_router = ""
        self.registry_for_workers = ""
        self.router: Service | None = None
        self.frontend: Service | None = None
        self.workers: dict[str, Service] = {}     # name -> service ("prefill-0", "decode-0", ...)
        self._stop_event: threading.Event | None = None
        self._ports = PortPicker(config.host)     # every auto-picked port of this stack, none twice
        self._env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"), PYTHONUNBUFFERED="1")

    # ---- start ------------------------------------------------------------------------------------
    def start(self, stop: threading.Event | None = None) -> "LocalStack":
        """Start every process and wait until each is ready. If one fails (``ProcessFailed``) or
        ``stop`` is set meanwhile (``Interrupted``), every process started so far is stopped first."""
        c = self.config
        self._stop_event = stop
        try:
            use_redis = c.use_redis if c.use_redis is not None else redis_server_binary() is not None
            router_port = self._ports()
            if use_redis:
                self.redis_port = self._ports()
                self.redis = start_redis(self.redis_port, self.log_dir, c.host)
                self.registry_for_router = self.registry_for_workers = f"redis://{c.host}:{self.redis_port}/0"
                log.info("registry: local redis-server on port %d", self.redis_port)
            else:
                self.registry_for_router = "memory://"
                self.registry_for_workers = f"router://{c.host}:{router_port}"
                log.info("registry: redis-server %s; using the router's in-process registry",
                         "not wanted" if c.use_redis is False else "is not installed")
            self.router = self._service("router", "dayzero_router", router_port, [
                "--redis-url", self.registry_for_router, "--disagg-threshold", str(c.disagg_threshold),
                *c.router_args])
            for i in range(c.num_decode):
                self.add_worker("decode", f"decode-{i}")
            for i in range(c.num_prefill):
                self.add_worker("prefill", f"prefill-{i}", wait=False)
            wait_ready([(s.process, s.ready_url) for s in [self.router, *self.workers.values()]], c.ready_timeout,
                       stop)
            if c.with_frontend:
                port = c.frontend_port or self._ports()
                argv = python_module("dayzero_frontend", "--host", c.host, "--port", str(port),
                                     "--router", f"{c.host}:{self.router.grpc_port}", *c.frontend_args)
                proc = ManagedProcess("frontend", argv, os.path.join(self.log_dir, "frontend.log"), self._env).start()
                self.frontend = Service(proc, port, port, f"http://{c.host}:{port}/ready")
                wait_ready([(proc, self.frontend.ready_url)], c.ready_timeout, stop)
        except BaseException:
            self.stop()
            raise
        return self

    def _service(self, name: str, module: str, grpc_port: int, args: list[str]) -> Service:
        c = self.config
        http_port = self._ports()
        argv = python_module(module, "--host", c.host, "--port", str(grpc_port), "--http-port", str(http_port), *args)
        proc = ManagedProcess(name, argv, os.path.join(self.log_dir, f"{name}.log"), self._env).start()
        return Service(proc, grpc_port, http_port, f"http://{c.host}:{http_port}/ready")

    def add_worker(self, role: str, name: str, extra: list[str] | None = None, wait: bool = False) -> Service:
        """Start one more prefill/decode worker (``extra`` args override the stack's)."""
        c = self.config
        module = {"prefill": "dayzero_prefill", "decode": "dayzero_decode"}[role]
        role_args = c.prefill_args if role == "prefill" else c.decode_args
        args = ["--model", c.model_dir, "--redis-url", self.registry_for_workers, "--advertise-host", c.host,
                "--transport", c.transport, "--block-size", str(c.block_size), "--heartbeat-seconds", "0.5",
                "--worker-id", name, *role_args, *(extra or [])]
        svc = self._service(name, module, self._ports(), args)
        self.workers[name] = svc
        if wait:
            wait_ready([(svc.process, svc.ready_url)], c.ready_timeout, self._stop_event)
        return svc

    # ---- faults and restarts ----------------------------------------------------------------------
    def restart_redis(self) -> None:
        """Stop redis-server and start an empty one on the same port (workers must re-register)."""
        if self.redis is None:
            raise RuntimeError("this stack runs without redis-server")
        self.redis.stop()
        self.redis = start_redis(self.redis_port, self.log_dir, self.config.host)

    @property
    def router_address(self) -> str:
        return f"{self.config.host}:{self.router.grpc_port}"

    @property
    def frontend_url(self) -> str:
        return f"http://{self.config.host}:{self.frontend.grpc_port}"

    def processes(self) -> list[ManagedProcess]:
        procs = [s.process for s in [self.frontend, self.router, *self.workers.values()] if s is not None]
        return procs + ([self.redis] if self.redis else [])

    def dead(self) -> list[ManagedProcess]:
        return [p for p in self.processes() if p.proc is not None and not p.alive()]

    def stop(self) -> None:
        procs = self.processes()
        for p in procs:
            p.terminate()  # all at once, then wait for each
        for p in procs:
            try:
                p.stop()
            except Exception as e:  # noqa: BLE001 - stop the rest regardless
                log.warning("stopping %s: %s", p.name, e)


__all__ = ["LocalStack", "StackConfig", "ProcessFailed", "Interrupted"]
