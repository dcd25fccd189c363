"""``dayzero serve`` as a user runs it: first run writes the tiny checkpoint, the stack is ready
in under a minute, a chat completion answers over plain HTTP, and a signal stops every child.

Two runs: the default (local redis-server, NIXL) stopped with SIGTERM, and ``--no-redis
--transport grpc`` (the router's in-process registry, the byte-stream fallback) stopped with
SIGINT (Ctrl-C), where a long prompt must take the disaggregated route.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request

import pytest

from dayzero.serving.launch import free_port, http_ok, redis_server_binary

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]


def _children(pid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                out.append(int(entry))
    return out


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _post(url: str, body: dict) -> dict:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        assert r.status == 200
        return json.loads(r.read())


def _serve(tmp_path, *extra: str):
    port = free_port()
    log_path = tmp_path / "serve.log"
    env = dict(os.environ, DAYZERO_CACHE=str(tmp_path / "cache"), OMP_NUM_THREADS="1")
    with open(log_path, "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "dayzero", "serve", "--port", str(port),
                                 "--log-dir", str(tmp_path / "logs"), *extra],
                                stdout=log, stderr=subprocess.STDOUT, env=env)
    t0 = time.monotonic()
    while not http_ok(f"http://127.0.0.1:{port}/ready"):
        assert proc.poll() is None, log_path.read_text()
        assert time.monotonic() - t0 < 120, "not ready after 120s:\n" + log_path.read_text()
        time.sleep(0.2)
    return proc, port, time.monotonic() - t0, log_path


def _stop_and_check(proc, sig, log_path):
    children = _children(proc.pid)
    assert len(children) >= 4, children  # frontend, router, prefill, decode (+ redis-server)
    proc.send_signal(sig)
    assert proc.wait(60) == 0, log_path.read_text()
    deadline = time.monotonic() + 10
    while any(_alive(c) for c in children) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [c for c in children if _alive(c)], "children left running after the stop"


@pytest.mark.skipif(redis_server_binary() is None, reason="the default run uses redis-server")
def test_dayzero_serve_first_run_answers_and_sigterm_stops_everything(tmp_path):
    proc, port, ready_s, log_path = _serve(tmp_path)
    try:
        assert ready_s < 60, f"ready after {ready_s:.1f}s"
        text = log_path.read_text()
        assert "writing the tiny random checkpoint" in text and "redis-server registry" in text
        resp = _post(f"http://127.0.0.1:{port}/v1/chat/completions",
                     {"model": "gpt-oss", "messages": [{"role": "user", "content": "Say hi"}], "max_tokens": 8})
        assert resp["object"] == "chat.completion" and resp["choices"][0]["finish_reason"] in ("stop", "length")
        assert resp["usage"]["completion_tokens"] >= 1
        _stop_and_check(proc, signal.SIGTERM, log_path)
    finally:
        if proc.poll() is None:
            proc.kill()


def test_dayzero_serve_in_process_registry_grpc_transport_and_ctrl_c(tmp_path):
    proc, port, ready_s, log_path = _serve(tmp_path, "--no-redis", "--transport", "grpc", "--disagg-threshold", "32")
    try:
        assert "in-process registry" in log_path.read_text()
        resp = _post(f"http://127.0.0.1:{port}/v1/completions",
                     {"model": "gpt-oss", "prompt": list(range(1000, 1100)), "max_tokens": 4, "ignore_eos": True,
                      "temperature": 0})
        assert resp["choices"][0]["finish_reason"] == "length"
        router_http = int(re.search(r"router: grpc \S+, http (\d+)", log_path.read_text()).group(1))
        with urllib.request.urlopen(f"http://127.0.0.1:{router_http}/metrics", timeout=5) as r:
            metrics = r.read().decode()
        assert 'dayzero_router_requests_total{outcome="length",route="disaggregated"} 1.0' in metrics
        _stop_and_check(proc, signal.SIGINT, log_path)
    finally:
        if proc.poll() is None:
            proc.kill()


def test_dayzero_serve_ctrl_c_during_start_up_stops_every_child_at_once(tmp_path, make_ckpt):
    """A worker still loading its model (here: frozen with SIGSTOP before it is ready) must not
    hold Ctrl-C hostage until the start-up timeout: serve stops every child and exits."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    log_path = tmp_path / "serve.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "dayzero", "serve", "--port", str(free_port()), "--model",
                                 make_ckpt("tiny"), "--log-dir", str(tmp_path / "logs")],
                                stdout=log, stderr=subprocess.STDOUT, env=env)
    frozen, children = None, []
    try:
        deadline = time.monotonic() + 60
        while frozen is None:
            assert proc.poll() is None and time.monotonic() < deadline, log_path.read_text()
            for child in _children(proc.pid):
                try:
                    with open(f"/proc/{child}/cmdline", "rb") as f:
                        if b"dayzero_decode" in f.read():
                            os.kill(child, signal.SIGSTOP)
                            frozen = child
                except OSError:
                    pass
            time.sleep(0.01)
        time.sleep(1.0)
        children = _children(proc.pid)
        assert not http_ok(f"http://127.0.0.1:{_decode_http_port(frozen)}/ready", timeout=0.5)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(40) == 0, log_path.read_text()  # the frozen worker gets SIGKILL after the grace period
        assert "stopped before the stack was ready" in log_path.read_text()
        deadline = time.monotonic() + 10
        while any(_alive(c) for c in children) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not [c for c in children if _alive(c)], "children left running after the stop"
    finally:
        if proc.poll() is None:
            proc.kill()
        for child in children or ([frozen] if frozen else []):  # nothing outlives a failed test
            if _alive(child):
                os.kill(child, signal.SIGKILL)


def _decode_http_port(pid: int) -> int:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        argv = f.read().decode().split("\0")
    return int(argv[argv.index("--http-port") + 1])


def _descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        kids = _children(todo.pop())
        out += kids
        todo += kids
    return out


@pytest.mark.skipif(redis_server_binary() is None, reason="the default run uses redis-server")
def test_children_end_when_serve_is_sigkilled(tmp_path):
    """``kill -9`` of ``dayzero serve`` leaves nothing running: each service watches its parent,
    and redis-server runs under the same watch (``dayzero.serving.parent_watch``)."""
    proc, _port, _ready_s, log_path = _serve(tmp_path)
    family = _descendants(proc.pid)
    try:
        names = []
        for pid in family:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                names.append(f.read().replace(b"\0", b" ").decode(errors="replace"))
        assert any("redis-server" in n and "parent_watch" not in n for n in names), names
        assert sum("dayzero_" in n for n in names) >= 4, names
        proc.kill()
        proc.wait(10)
        deadline = time.monotonic() + 40
        while any(_alive(p) for p in family) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not [p for p in family if _alive(p)], "processes outlived a SIGKILLed serve:\n" + log_path.read_text()
    finally:
        for pid in family:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
