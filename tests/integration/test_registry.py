"""Registry: real redis-server (TTL, load, re-registration after a restart) and the in-process one."""

from __future__ import annotations

import logging
import tempfile
import time

import pytest

from dayzero.registry import Heartbeat, RegistryError, open_registry
from dayzero.registry.memory import InProcessRegistry
from dayzero.rpc.v1 import worker_pb2
from dayzero.serving import launch

needs_redis = pytest.mark.skipif(launch.redis_server_binary() is None, reason="redis-server is not installed")


def _wait(cond, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


@pytest.fixture
def redis_port():
    port = launch.free_port()
    with tempfile.TemporaryDirectory() as d:
        proc = launch.start_redis(port, d)
        yield port, proc, d
        proc.stop()


def _record(worker_id: str, queued: int, role: str = "prefill") -> worker_pb2.WorkerRecord:
    return worker_pb2.WorkerRecord(worker_id=worker_id, role=role, address=f"127.0.0.1:{queued + 1}",
                                   load=worker_pb2.WorkerLoad(worker_id=worker_id, role=role, queued_tokens=queued))


@needs_redis
def test_redis_records_expire_without_heartbeat(redis_port):
    port, _, _ = redis_port
    reg = open_registry(f"redis://127.0.0.1:{port}/0")
    rec = _record("p1", 7)
    rec.ttl_seconds = 0.3
    reg.put(rec)
    got = reg.list("prefill")
    assert [r.worker_id for r in got] == ["p1"] and got[0].load.queued_tokens == 7
    assert reg.list("decode") == []
    assert _wait(lambda: reg.list("prefill") == [], timeout=5)


@needs_redis
def test_heartbeat_carries_fresh_load_and_reregisters_after_redis_restart(redis_port, caplog):
    port, proc, d = redis_port
    url = f"redis://127.0.0.1:{port}/0"
    load = {"queued": 1}
    hb = Heartbeat(open_registry(url), lambda: _record("d1", load["queued"], role="decode"), interval=0.1, ttl=0.5)
    reader = open_registry(url)
    caplog.set_level(logging.INFO, logger="dayzero.registry.heartbeat")
    hb.start()
    try:
        assert hb.registered.wait(10)
        load["queued"] = 42
        assert _wait(lambda: [r.load.queued_tokens for r in reader.list("decode")] == [42])
        proc.stop()  # redis-server gone: the heartbeat keeps trying
        with pytest.raises(RegistryError):
            reader.list("decode")
        assert _wait(lambda: hb.failures > 0)
        proc2 = launch.start_redis(port, d)  # a fresh, empty redis on the same port
        try:
            assert _wait(lambda: [r.worker_id for r in reader.list("decode")] == ["d1"])
            assert "re-registered" in caplog.text
        finally:
            hb.stop()
            assert reader.list("decode") == []  # deregistered on stop
            proc2.stop()
    finally:
        hb.stop(deregister=False)


def test_in_process_registry_expires_by_ttl():
    now = [100.0]
    reg = InProcessRegistry(clock=lambda: now[0])
    rec = _record("p1", 3)
    rec.ttl_seconds = 2.0
    reg.put(rec)
    rec2 = _record("d1", 0, role="decode")
    rec2.ttl_seconds = 10.0
    reg.put(rec2)
    assert [r.worker_id for r in reg.list()] == ["d1", "p1"]
    now[0] += 2.5
    assert [r.worker_id for r in reg.list()] == ["d1"]
    reg.remove("decode", "d1")
    assert reg.list() == []


def test_router_hosted_registry_over_grpc():
    import asyncio
    import grpc
    from dayzero.registry.memory import RegistryServicer
    from dayzero.rpc.v1 import worker_pb2_grpc

    async def main():
        server = grpc.aio.server()
        backing = InProcessRegistry()
        worker_pb2_grpc.add_RegistryServicer_to_server(RegistryServicer(backing), server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        try:
            client = open_registry(f"router://127.0.0.1:{port}")
            hb = Heartbeat(client, lambda: _record("p9", 5), interval=0.05)
            await asyncio.to_thread(hb.beat)
            assert [r.load.queued_tokens for r in backing.list("prefill")] == [5]
            listed = await asyncio.to_thread(client.list, "prefill")
            assert [r.worker_id for r in listed] == ["p9"]
            await asyncio.to_thread(hb.stop)
            assert backing.list() == []
        finally:
            await server.stop(None)

    asyncio.run(main())


def test_unknown_registry_url_is_a_clear_error():
    with pytest.raises(ValueError, match="redis://"):
        open_registry("http://nope")
