"""Faults on the real stack (redis-server, router, prefill, decode over NIXL, frontend):
client disconnects, kill -9 of the prefill and of the decode worker, a redis-server restart, and
a decode worker whose KV block size differs from the prefill worker's.

The prefill worker runs with small chunks and a per-chunk delay (a fault-injection flag) so that
"mid-request" is a window of seconds, found by polling the worker's load, not by sleeping.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
import urllib.request

import grpc
import pytest

import stack_harness as sh
from dayzero.registry import open_registry
from dayzero.rpc.v1 import common_pb2, router_pb2

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

THRESHOLD = 64
MAX_MODEL_LEN = 4096
LONG = 400              # tokens: ~13 chunks of 32 with 0.15 s each on the prefill worker


@pytest.fixture(scope="module")
def stack(make_ckpt, tmp_path_factory):
    s = sh.start_stack(make_ckpt("tiny"), tmp_path_factory.mktemp("faults"), threshold=THRESHOLD,
                       max_model_len=MAX_MODEL_LEN, prefill_args=["--chunk-size", "32", "--fault-chunk-delay", "0.15"],
                       decode_args=["--num-kv-blocks", "512", "--lease-seconds", "8", "--kv-wait-seconds", "10",
                                    "--kv-drain-seconds", "3"],
                       router_args=["--prefill-timeout", "30", "--token-timeout", "15"])
    yield s
    s.stop()


def _request(rid: str, n: int, max_tokens: int) -> router_pb2.GenerateRequest:
    return router_pb2.GenerateRequest(request_id=rid, prompt_token_ids=sh.random_prompt(n, hash(rid) & 0xFFFF),
                                      sampling=common_pb2.SamplingParams(max_tokens=max_tokens, ignore_eos=True))


def _free(stack, names: list[str], timeout: float = 20.0) -> None:
    sh.wait_until(lambda: sh.all_free(sh.worker_load(stack, n) for n in names), timeout, f"0 KV blocks held on {names}")


def _router_workers(stack) -> dict:
    url = f"http://127.0.0.1:{stack.router.http_port}/workers"
    with urllib.request.urlopen(url, timeout=5) as r:
        return json.loads(r.read())


def _wait_router_sees(stack, name: str, timeout: float = 30.0) -> None:
    address = f"127.0.0.1:{stack.workers[name].grpc_port}"
    sh.wait_until(lambda: any(w["address"] == address for ws in _router_workers(stack).values() for w in ws),
          timeout, f"the router to route to {name} at {address}")


def _in_background(fn):
    box: dict = {}

    def run():
        try:
            box["value"] = fn()
        except Exception as e:  # noqa: BLE001 - inspected by the test
            box["error"] = e
    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, box


def test_client_disconnect_mid_stream_frees_blocks(stack, router):
    for n, route in ((10, "local"), (LONG // 4, "disaggregated")):
        call = router.Generate(_request(f"disc-{n}", n, max_tokens=2000), timeout=120)
        seen = []
        for msg in call:
            seen.append(msg)
            if len(seen) == 3:
                break
        assert seen[0].route == route
        assert sh.worker_load(stack, "decode-0").kv_blocks_used > 0
        call.cancel()
        _free(stack, ["decode-0", "prefill-0"])


def test_client_disconnect_during_prefill_frees_both_sides(stack, router):
    call = router.Generate(_request("disc-prefill", LONG, max_tokens=8), timeout=120)
    t, box = _in_background(lambda: list(call))
    sh.wait_until(lambda: sh.worker_load(stack, "prefill-0").running_requests == 1, 20, "the prefill to start")
    assert sh.worker_load(stack, "decode-0").open_leases == 1
    call.cancel()
    t.join(10)
    assert isinstance(box.get("error"), grpc.RpcError) and box["error"].code() == grpc.StatusCode.CANCELLED
    _free(stack, ["decode-0", "prefill-0"])


def test_frontend_stream_disconnect_frees_blocks(stack):
    httpx = pytest.importorskip("httpx")
    # greedy (temperature 0): a sampled stop id cannot end this stream early
    body = {"model": "tiny", "prompt": sh.random_prompt(LONG // 4, 7), "max_tokens": 2000, "stream": True, "ignore_eos": True,
            "temperature": 0}
    with httpx.Client(base_url=stack.frontend_url, timeout=60) as client:
        with client.stream("POST", "/v1/completions", json=body) as resp:
            assert resp.status_code == 200
            events = []
            for line in resp.iter_lines():
                if line.startswith("data: "):
                    events.append(line)
                if len(events) == 3:
                    # still streaming: the blocks are held. Checked before the break: leaving the
                    # iterator closes the connection at once (httpcore closes on GeneratorExit), and
                    # the frontend's abort can reach decode before a check made after it.
                    assert not any('"error"' in e for e in events), events
                    assert sh.worker_load(stack, "decode-0").kv_blocks_used > 0, events
                    break
    _free(stack, ["decode-0", "prefill-0"])


def _stream_with_fault(stack, seed: int, fault) -> tuple[list[str], float]:
    """Stream a long completion through the frontend, call ``fault()`` after the third SSE event;
    returns (the events' data, seconds from the fault to the end of the stream)."""
    httpx = pytest.importorskip("httpx")
    body = {"model": "tiny", "prompt": sh.random_prompt(LONG // 4, seed), "max_tokens": 3000, "stream": True,
            "temperature": 0, "ignore_eos": True}
    events, t0 = [], None
    with httpx.Client(base_url=stack.frontend_url, timeout=60) as client:
        with client.stream("POST", "/v1/completions", json=body) as resp:
            assert resp.status_code == 200
            for line in resp.iter_lines():
                if line.startswith("data: "):
                    events.append(line[6:])
                if len(events) == 3 and t0 is None:
                    t0 = time.monotonic()
                    fault()
    return events, time.monotonic() - t0


def test_a_frozen_router_ends_the_frontend_stream_with_an_error(stack, router):
    """The router stops answering without closing its connections (SIGSTOP: like a host that
    vanished): the frontend's keepalive notices, and the stream ends with an error event."""
    pid = stack.router.process.pid
    try:
        events, elapsed = _stream_with_fault(stack, 13, lambda: os.kill(pid, signal.SIGSTOP))
    finally:
        os.kill(pid, signal.SIGCONT)
    assert events[-1] == "[DONE]"
    error = json.loads(events[-2]).get("error")
    assert error and "router" in error["message"], events[-2]
    assert elapsed < 40, elapsed
    _free(stack, ["decode-0", "prefill-0"], timeout=30)
    msgs = list(router.Generate(_request("after-frozen-router", 10, 3), timeout=60))
    assert sum(len(m.token_ids) for m in msgs) == 3


def test_kill_prefill_mid_request_gives_a_clear_error_and_frees_the_lease(stack, router):
    call = router.Generate(_request("kill-prefill", LONG, max_tokens=8), timeout=60)
    t, box = _in_background(lambda: list(call))
    sh.wait_until(lambda: sh.worker_load(stack, "prefill-0").running_requests == 1, 20, "the prefill to start")
    t0 = time.monotonic()
    stack.workers["prefill-0"].process.kill9()
    t.join(30)
    elapsed = time.monotonic() - t0
    err = box.get("error")
    assert isinstance(err, grpc.RpcError), box
    assert err.code() == grpc.StatusCode.UNAVAILABLE and "prefill" in err.details(), err.details()
    assert elapsed < 30, elapsed
    _free(stack, ["decode-0"])
    stack.add_worker("prefill", "prefill-0", wait=True)
    _wait_router_sees(stack, "prefill-0")
    tokens = [t for m in router.Generate(_request("after-prefill-restart", LONG // 4, 3), timeout=60)
              for t in m.token_ids]
    assert len(tokens) == 3


def test_kill_one_of_two_prefill_workers_the_other_answers_correctly(stack, router):
    want = [t for m in router.Generate(_request("two-prefills", LONG, 4), timeout=60) for t in m.token_ids]
    stack.add_worker("prefill", "prefill-1", wait=True)
    _wait_router_sees(stack, "prefill-1")
    call = router.Generate(_request("two-prefills", LONG, 4), timeout=60)
    t, box = _in_background(lambda: list(call))
    busy = sh.wait_until(lambda: [n for n in ("prefill-0", "prefill-1") if sh.worker_load(stack, n).running_requests == 1], 20,
                 "one prefill worker to start")
    stack.workers[busy[0]].process.kill9()
    t.join(60)
    assert "error" not in box, box.get("error")
    msgs = box["value"]
    assert msgs[0].route == "disaggregated"
    assert [t for m in msgs for t in m.token_ids] == want  # greedy: the retry gives the same answer
    if busy[0] == "prefill-0":
        stack.add_worker("prefill", "prefill-0", wait=True)
    stack.workers.pop("prefill-1").process.stop()
    sh.wait_until(lambda: {r.worker_id for r in open_registry(stack.registry_for_router).list("prefill")} == {"prefill-0"},
          20, "prefill-1 to leave the registry")
    _wait_router_sees(stack, "prefill-0")
    _free(stack, ["decode-0", "prefill-0"])


def test_kill_decode_mid_stream_ends_the_stream_with_an_error(stack, router):
    events, elapsed = _stream_with_fault(stack, 11, stack.workers["decode-0"].process.kill9)
    assert events[-1] == "[DONE]"
    error = json.loads(events[-2]).get("error")
    assert error and "decode" in error["message"], events[-2]
    assert elapsed < 15, elapsed
    _free(stack, ["prefill-0"])
    stack.add_worker("decode", "decode-0", wait=True)
    _wait_router_sees(stack, "decode-0")
    msgs = list(router.Generate(_request("after-decode-restart", LONG // 4, 3), timeout=60))
    assert msgs[0].route == "disaggregated" and sum(len(m.token_ids) for m in msgs) == 3


def test_redis_restart_workers_reregister_and_requests_succeed(stack, router):
    registry = open_registry(stack.registry_for_router)
    assert {r.worker_id for r in registry.list()} == {"prefill-0", "decode-0"}
    stack.restart_redis()  # a new, empty redis-server: every record present afterwards was re-written
    sh.wait_until(lambda: {r.worker_id for r in registry.list()} == {"prefill-0", "decode-0"}, 20,
          "both workers to re-register in the new redis-server")
    _wait_router_sees(stack, "prefill-0")
    _wait_router_sees(stack, "decode-0")
    for n, route in ((10, "local"), (LONG // 4, "disaggregated")):
        msgs = list(router.Generate(_request(f"after-redis-{n}", n, 3), timeout=60))
        assert msgs[0].route == route and sum(len(m.token_ids) for m in msgs) == 3


def test_lease_expires_when_the_kv_never_arrives(stack):
    from dayzero.rpc.v1 import decode_pb2, decode_pb2_grpc

    with grpc.insecure_channel(f"127.0.0.1:{stack.workers['decode-0'].grpc_port}") as ch:
        decode = decode_pb2_grpc.DecodeStub(ch)
        a = decode.Allocate(decode_pb2.AllocateRequest(request_id="orphan", prompt_tokens=300, lease_seconds=0.5),
                            timeout=10).allocation
        assert len(a.layers) == 2 and a.lease_id
        assert sh.worker_load(stack, "decode-0").open_leases == 1
        _free(stack, ["decode-0"], timeout=10)  # nobody wrote the KV: the lease ends by itself
        with pytest.raises(grpc.RpcError) as e:  # a late Generate on it gets a clear answer
            list(decode.Generate(decode_pb2.DecodeRequest(
                request_id="orphan", prompt_token_ids=sh.random_prompt(300, 1), lease_id=a.lease_id, first_token_id=1,
                sampling=common_pb2.SamplingParams(max_tokens=2)), timeout=10))
        assert e.value.code() == grpc.StatusCode.NOT_FOUND and "expired" in e.value.details()
    url = f"http://127.0.0.1:{stack.workers['decode-0'].http_port}/metrics"
    with urllib.request.urlopen(url, timeout=5) as r:
        assert "dayzero_decode_leases_expired_total 1.0" in r.read().decode()


def test_backpressure_when_every_decode_worker_is_full(stack, router):
    """Leases taken straight from the decode worker fill its KV cache; the router then answers
    RESOURCE_EXHAUSTED on both routes (the frontend: 503), and serves again once they are released."""
    from dayzero.rpc.v1 import decode_pb2, decode_pb2_grpc

    httpx = pytest.importorskip("httpx")
    with grpc.insecure_channel(f"127.0.0.1:{stack.workers['decode-0'].grpc_port}") as ch:
        decode = decode_pb2_grpc.DecodeStub(ch)
        leases = []
        size = 4000
        while size >= 1:  # allocate until not even one token fits (512 blocks of 16 tokens)
            try:
                a = decode.Allocate(decode_pb2.AllocateRequest(request_id=f"filler-{len(leases)}", prompt_tokens=size),
                                    timeout=10)
                leases.append(a.allocation)
            except grpc.RpcError as e:
                assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, e
                size //= 2
            assert len(leases) < 40
        try:
            for n in (10, LONG):
                with pytest.raises(grpc.RpcError) as e:
                    list(router.Generate(_request(f"full-{n}", n, 3), timeout=30))
                assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, e.value.details()
                assert "full" in e.value.details()
            r = httpx.post(stack.frontend_url + "/v1/completions",
                           json={"model": "tiny", "prompt": sh.random_prompt(LONG, 3), "max_tokens": 3}, timeout=30)
            assert r.status_code == 503, r.text
        finally:
            for a in leases:
                decode.Release(decode_pb2.ReleaseRequest(request_id=a.request_id, lease_id=a.lease_id), timeout=10)
    _free(stack, ["decode-0", "prefill-0"])
    msgs = list(router.Generate(_request("after-full", LONG, 3), timeout=60))
    assert msgs[0].route == "disaggregated" and sum(len(m.token_ids) for m in msgs) == 3


def test_decode_with_a_different_block_size_is_refused_naming_the_mismatch(stack, router):
    stack.workers["decode-0"].process.stop()
    stack.add_worker("decode", "decode-bs32", extra=["--block-size", "32"], wait=True)
    sh.wait_until(lambda: [w["worker_id"] for w in _router_workers(stack)["decode"]] == ["decode-bs32"], 20,
          "the router to see only the block-size-32 decode worker")
    with pytest.raises(grpc.RpcError) as e:
        list(router.Generate(_request("mismatch", LONG // 4, 3), timeout=60))
    assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "block_size" in e.value.details() and "16" in e.value.details() and "32" in e.value.details()
    _free(stack, ["decode-bs32", "prefill-0"])
    msgs = list(router.Generate(_request("mismatch-local", 10, 3), timeout=60))  # no KV handoff: still served
    assert msgs[0].route == "local" and sum(len(m.token_ids) for m in msgs) == 3
