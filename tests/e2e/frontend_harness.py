"""Processes for the frontend tests: the scripted router double and the real frontend.

``router_under_test()`` starts the scripted router TEST DOUBLE, or, when ``DAYZERO_E2E_ROUTER``
is set (``HOST:PORT`` of a real router), uses that router unscripted: tests then check only the
shape of the answers (the text of a tiny random model is random). ``start_frontend`` runs
``python -m dayzero_frontend`` and waits for ``/health`` by polling.
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from dayzero.serving.launch import free_port

REPO = Path(__file__).resolve().parents[2]
DOUBLE = REPO / "tests" / "doubles" / "scripted_router.py"
MODEL_NAME = "gpt-oss-test"
MAX_MODEL_LEN = 4096


def _read_line(proc: subprocess.Popen, timeout_s: float) -> str:
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: lines.put(proc.stdout.readline()), daemon=True).start()
    try:
        return lines.get(timeout=timeout_s)
    except queue.Empty:
        return ""


def _http(method: str, url: str, body: dict | None = None, timeout_s: float = 10):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout_s) as resp:
        return json.loads(resp.read())


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@dataclass
class RouterUnderTest:
    """A router the frontend talks to; ``scripted`` only for the test double."""

    address: str
    scripted: bool
    control_url: str | None = None
    proc: subprocess.Popen | None = None
    on_stop: "object | None" = None  # a callable that stops a real stack started for the test

    def script(self, *scripts: dict) -> None:
        if self.scripted:
            _http("POST", f"{self.control_url}/script", {"scripts": list(scripts)})

    def reset(self) -> None:
        if self.scripted:
            _http("POST", f"{self.control_url}/reset", {})

    def requests(self) -> list[dict]:
        return _http("GET", f"{self.control_url}/requests") if self.scripted else []

    def wait_for(self, predicate, timeout_s: float = 10.0) -> list[dict]:
        """Poll the recorded requests until ``predicate(records)`` holds."""
        deadline = time.monotonic() + timeout_s
        while True:
            records = self.requests()
            if predicate(records):
                return records
            if time.monotonic() > deadline:
                raise AssertionError(f"condition not met within {timeout_s}s; records: {records}")
            time.sleep(0.02)

    def stop(self) -> None:
        if self.proc is not None:
            _stop(self.proc)
        if self.on_stop is not None:
            self.on_stop()


def start_scripted_router() -> RouterUnderTest:
    proc = subprocess.Popen([sys.executable, str(DOUBLE)], stdout=subprocess.PIPE, text=True, cwd=REPO)
    line = _read_line(proc, 60)
    if not line.startswith("READY"):
        _stop(proc)
        raise RuntimeError(f"scripted router did not start: {line!r}")
    ports = dict(part.split("=") for part in line.split()[1:])
    return RouterUnderTest(f"127.0.0.1:{ports['grpc']}", True, f"http://127.0.0.1:{ports['http']}", proc)


def start_real_stack(model_dir: str, log_dir: Path) -> RouterUnderTest:
    """The real router, prefill and decode workers (tiny model, NIXL, redis-server when installed)."""
    from dayzero.serving.stack import LocalStack, StackConfig

    mml = ["--max-model-len", str(MAX_MODEL_LEN)]
    stack = LocalStack(StackConfig(model_dir=str(model_dir), with_frontend=False, transport="nixl",
                                   prefill_args=mml, decode_args=mml, log_dir=str(log_dir))).start()
    return RouterUnderTest(stack.router_address, scripted=False, on_stop=stack.stop)


def router_under_test(kind: str = "scripted", model_dir: str | None = None,
                      log_dir: Path | None = None) -> RouterUnderTest:
    """``kind``: "scripted" (the test double) or "stack" (the real services on ``model_dir``).
    ``DAYZERO_E2E_ROUTER=HOST:PORT`` points both at an already running router instead."""
    address = os.environ.get("DAYZERO_E2E_ROUTER")
    if address:
        return RouterUnderTest(address, scripted=False)
    if kind == "stack":
        return start_real_stack(model_dir, log_dir)
    return start_scripted_router()


@dataclass
class Frontend:
    base_url: str
    proc: subprocess.Popen
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        _stop(self.proc)


def vocab_dir(cache_root: Path) -> Path:
    """A verified Harmony vocabulary folder, rebuilt offline into ``cache_root`` once."""
    from dayzero.vocab import resolve_vocab

    res = resolve_vocab(cache_dir=cache_root, allow_download=False)
    return res.folder


def start_frontend(router_address: str, log_dir: Path, vocab: Path, *extra: str, env: dict | None = None,
                   timeout_s: float = 60.0) -> Frontend:
    port = free_port()
    log_path = log_dir / f"frontend-{port}.log"
    cmd = [sys.executable, "-m", "dayzero_frontend", "--host", "127.0.0.1", "--port", str(port),
           "--router", router_address, "--model-name", MODEL_NAME, "--max-model-len", str(MAX_MODEL_LEN),
           "--vocab-dir", str(vocab), "--offline", *extra]
    full_env = {k: v for k, v in os.environ.items() if k != "DAYZERO_API_KEY"}
    full_env.update(env or {})
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=REPO, env=full_env)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout_s
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"frontend exited with {proc.returncode}:\n{log_path.read_text()}")
        try:
            with urllib.request.urlopen(f"{base}/health", timeout=1) as resp:
                if resp.status == 200:
                    return Frontend(base, proc, log_path)
        except OSError:
            pass
        if time.monotonic() > deadline:
            _stop(proc)
            raise RuntimeError(f"frontend /health not up within {timeout_s}s:\n{log_path.read_text()}")
        time.sleep(0.05)


@contextmanager
def frontend_for(router: RouterUnderTest, log_dir: Path, vocab: Path, *extra: str,
                 env: dict | None = None) -> Iterator[Frontend]:
    """A started frontend in front of ``router``. On exit both stop; if the frontend does not come
    up, the router is stopped before the error propagates."""
    try:
        frontend = start_frontend(router.address, log_dir, vocab, *extra, env=env)
    except Exception:
        router.stop()
        raise
    try:
        yield frontend
    finally:
        frontend.stop()
        router.stop()


def harmony_encoding(vocab: Path):
    from dayzero.vocab import load_harmony_encoding

    enc, _ = load_harmony_encoding(vocab_dir=vocab, allow_download=False)
    return enc


def harmony_ids(enc, text: str) -> list[int]:
    """Token ids of Harmony-formatted text (special tokens as written)."""
    return enc.encode(text, allowed_special="all")


@dataclass
class ClientStack:
    """The frontend process in front of a router under test (scripted double or the real stack)."""

    router: RouterUnderTest
    frontend: Frontend
    enc: object

    def ids(self, text: str) -> list[int]:
        return harmony_ids(self.enc, text)

    def chunked(self, text: str, size: int = 3) -> dict:
        ids = self.ids(text)
        return {"chunks": [ids[i:i + size] for i in range(0, len(ids), size)]}


@contextmanager
def client_stack(kind: str, tmp_path_factory, make_ckpt) -> Iterator[ClientStack]:
    """``kind`` "scripted" (the router test double) or "stack" (router + workers on the tiny model)."""
    tmp = tmp_path_factory.mktemp("frontend-client")
    vocab = vocab_dir(tmp_path_factory.getbasetemp())
    router = router_under_test(kind, make_ckpt("tiny") if kind == "stack" else None, tmp)
    with frontend_for(router, tmp, vocab) as frontend:
        yield ClientStack(router, frontend, harmony_encoding(vocab))
