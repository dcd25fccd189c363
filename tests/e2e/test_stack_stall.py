"""A worker that is alive but stuck stops being picked.

A second decode worker's engine thread is made to stall inside an allocation (the testing-only
``--fault-allocate-delay``) for longer than its ``--stall-seconds``: its heartbeat marks its record
in redis unavailable (with the reason) and its /ready turns 503, so the router sends new requests
to the healthy worker at once; once the thread moves again the mark clears and it is ready again.
"""

from __future__ import annotations

import threading
import time
import urllib.error
import urllib.request

import pytest

import stack_harness as sh
from dayzero.registry import open_registry
from dayzero.rpc.v1 import common_pb2, decode_pb2, decode_pb2_grpc, router_pb2

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

THRESHOLD = 32
STALL = 15.0      # the stuck worker's engine thread sleeps this long inside an allocation
LIMIT = 1.0       # its --stall-seconds


@pytest.fixture(scope="module")
def stack(make_ckpt, tmp_path_factory):
    s = sh.start_stack(make_ckpt("tiny"), tmp_path_factory.mktemp("stall"), threshold=THRESHOLD, max_model_len=512,
                       decode_args=["--num-kv-blocks", "64"], with_frontend=False)
    try:
        s.add_worker("decode", "decode-stuck", ["--stall-seconds", str(LIMIT), "--fault-allocate-delay", str(STALL)],
                     wait=True)
    except BaseException:
        s.stop()
        raise
    yield s
    s.stop()


def _ready(stack, name: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(stack.workers[name].ready_url, timeout=2) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def _available(registry, name: str) -> bool | None:
    """True/False: registered and (un)available; None: not registered."""
    for r in registry.list("decode"):
        if r.worker_id == name:
            return not r.unavailable
    return None


def test_stuck_decode_worker_is_withdrawn_and_returns(stack):
    registry = open_registry(f"redis://127.0.0.1:{stack.redis_port}")
    try:
        sh.wait_until(lambda: _available(registry, "decode-stuck") and _available(registry, "decode-0"), 10,
                      "both decode workers registered")
        result: dict = {}

        def allocate():
            with sh.worker_channel(stack, "decode-stuck") as ch:
                result["alloc"] = decode_pb2_grpc.DecodeStub(ch).Allocate(
                    decode_pb2.AllocateRequest(request_id="stuck", prompt_tokens=16), timeout=STALL + 20)

        t = threading.Thread(target=allocate)
        t.start()
        sh.wait_until(lambda: _available(registry, "decode-stuck") is False, LIMIT + 4, "the stuck worker marked")
        rec = next(r for r in registry.list("decode") if r.worker_id == "decode-stuck")
        assert "stuck" in rec.unavailable, rec
        code, body = _ready(stack, "decode-stuck")
        assert code == 503 and "stuck" in body, (code, body)
        assert t.is_alive(), "the stall ended before the checks ran; raise STALL"
        # while it is stuck, disaggregated requests go to the healthy decode worker and finish
        with sh.router_stub(stack) as router:
            for i in range(3):
                t0 = time.monotonic()
                out = list(router.Generate(router_pb2.GenerateRequest(
                    request_id=f"during-{i}", prompt_token_ids=sh.random_prompt(100, i),
                    sampling=common_pb2.SamplingParams(max_tokens=4, ignore_eos=True)), timeout=30))
                assert out[-1].finish_reason == common_pb2.FINISH_REASON_LENGTH, out[-1]
                assert time.monotonic() - t0 < 5, f"request {i} waited on the stuck worker"
        assert t.is_alive(), "the stall ended before the requests ran; raise STALL"
        t.join(STALL + 25)
        lease = result["alloc"].allocation.lease_id
        sh.wait_until(lambda: _available(registry, "decode-stuck"), 10, "the mark cleared")
        sh.wait_until(lambda: _ready(stack, "decode-stuck")[0] == 200, 10, "the worker ready again")
        with sh.worker_channel(stack, "decode-stuck") as ch:
            decode_pb2_grpc.DecodeStub(ch).Release(
                decode_pb2.ReleaseRequest(request_id="stuck", lease_id=lease, kv_senders=0), timeout=10)
    finally:
        registry.close()
