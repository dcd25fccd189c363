"""Starting and stopping local processes: redis-server, the services, readiness polling.

Used by ``dayzero serve`` and by the tests that run the real stack. Every child gets its own
process group so a stop reaches its children too; ``stop`` sends SIGTERM, then SIGKILL after a
grace period. Every child also ends by itself if this process dies without stopping it
(``parent_watch``).
"""

from __future__ import annotations

import logging
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field

from dayzero.serving.parent_watch import PARENT_ENV

log = logging.getLogger(__name__)


def _ephemeral_low() -> int:
    """Lowest port of the kernel's ephemeral range (outgoing connections take their ports there)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _bindable(host: str, port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
        return True


class PortPicker:
    """Free ports for children that bind them seconds later, none handed out twice.

    A port the kernel picks (bind to 0) lies in the ephemeral range, where any outgoing connection may
    take it before the child binds it ("Address already in use", seen in the e2e suite under load);
    so ports are drawn at random below that range and checked bindable, falling back to the kernel's
    pick when the range below is too small."""

    LOWEST = 10000

    def __init__(self, host: str = "127.0.0.1", rng: random.Random | None = None):
        self.host = host
        self._given: set[int] = set()
        self._rng = rng or random.Random()

    def __call__(self) -> int:
        top = _ephemeral_low() - 1
        for _ in range(200 if top - self.LOWEST >= 1000 else 0):
            port = self._rng.randint(self.LOWEST, top)
            if port not in self._given and _bindable(self.host, port):
                self._given.add(port)
                return port
        while True:
            with socket.socket() as s:
                s.bind((self.host, 0))
                port = s.getsockname()[1]
            if port not in self._given:
                self._given.add(port)
                return port


def free_port(host: str = "127.0.0.1") -> int:
    """One free port (see ``PortPicker``; a stack that needs several uses one picker)."""
    return PortPicker(host)()


class ProcessFailed(RuntimeError):
    """A child exited (or never became ready); the message carries the tail of its log."""


class Interrupted(RuntimeError):
    """A stop was requested (SIGINT/SIGTERM) while waiting for children to become ready."""


@dataclass
class ManagedProcess:
    name: str
    argv: list[str]
    log_path: str
    env: dict[str, str] | None = None
    proc: subprocess.Popen | None = field(default=None, repr=False)

    def start(self) -> "ManagedProcess":
        os.makedirs(os.path.dirname(self.log_path) or ".", exist_ok=True)
        out = open(self.log_path, "ab")
        env = dict(os.environ if self.env is None else self.env)
        env[PARENT_ENV] = str(os.getpid())  # the child ends when we do (parent_watch)
        try:
            self.proc = subprocess.Popen(self.argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         env=env, start_new_session=True)
        finally:
            out.close()
        return self

    @property
    def pid(self) -> int:
        return self.proc.pid if self.proc else -1

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, n: int = 30) -> str:
        try:
            with open(self.log_path, "rb") as f:
                lines = f.read().decode(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(lines[-n:])

    def kill9(self) -> None:
        """SIGKILL the process itself (fault tests: a crash, no cleanup)."""
        if self.alive():
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def terminate(self) -> None:
        """SIGTERM its process group (does not wait)."""
        if self.alive():
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass

    def stop(self, grace: float = 10.0) -> None:
        if not self.alive():
            return
        self.terminate()
        try:
            self.proc.wait(grace)
        except subprocess.TimeoutExpired:
            log.warning("%s did not stop within %.0fs: killing", self.name, grace)
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait(10)


def http_ok(url: str, timeout: float = 1.0) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


def wait_ready(procs: list[tuple[ManagedProcess, str]], timeout: float, stop: threading.Event | None = None) -> None:
    """Poll each (process, ready URL) until all answer 200; raise ``ProcessFailed`` if one exits,
    ``Interrupted`` as soon as ``stop`` is set (a model that loads for minutes must not delay Ctrl-C)."""
    deadline = time.monotonic() + timeout
    pending = list(procs)
    while pending:
        if stop is not None and stop.is_set():
            raise Interrupted("stop requested while waiting for " + ", ".join(p.name for p, _ in pending))
        for p, url in list(pending):
            if not p.alive():
                raise ProcessFailed(f"{p.name} exited (code {p.proc.returncode if p.proc else '?'}) before it was "
                                    f"ready; last log lines:\n{p.log_tail()}")
            if http_ok(url):
                pending.remove((p, url))
        if not pending:
            return
        if time.monotonic() > deadline:
            names = ", ".join(p.name for p, _ in pending)
            raise ProcessFailed(f"not ready after {timeout:.0f}s: {names}; last log lines of "
                                f"{pending[0][0].name}:\n{pending[0][0].log_tail()}")
        time.sleep(0.1)


def redis_server_binary() -> str | None:
    return shutil.which("redis-server")


def redis_ping(port: int, host: str = "127.0.0.1") -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5) as s:
            s.sendall(b"PING\r\n")
            return s.recv(16).startswith(b"+PONG")
    except OSError:
        return False


def start_redis(port: int, log_dir: str, host: str = "127.0.0.1", timeout: float = 10.0) -> ManagedProcess:
    """A throwaway redis-server on ``port`` (no persistence); raises if none is installed."""
    binary = redis_server_binary()
    if binary is None:
        raise ProcessFailed("redis-server is not installed")
    argv = [binary, "--port", str(port), "--bind", host, "--save", "", "--appendonly", "no",
            "--protected-mode", "no", "--dir", log_dir]
    argv = python_module("dayzero.serving.parent_watch", "--", *argv)  # redis cannot watch its parent
    p = ManagedProcess("redis-server", argv, os.path.join(log_dir, f"redis-{port}.log")).start()
    deadline = time.monotonic() + timeout
    while not redis_ping(port, host):
        if not p.alive():
            raise ProcessFailed(f"redis-server exited: {p.log_tail()}")
        if time.monotonic() > deadline:
            p.stop()
            raise ProcessFailed(f"redis-server not answering on port {port}")
        time.sleep(0.05)
    return p


def python_module(module: str, *args: str) -> list[str]:
    return [sys.executable, "-m", module, *args]
