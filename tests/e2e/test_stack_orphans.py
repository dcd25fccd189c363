"""An allocation whose caller is gone leaves no lease behind.

The decode worker's engine thread is made to stall after each allocation (a fault-injection flag,
testing only), so the allocation completes after the caller's deadline: nobody ever learns the
lease id. Without a release on the decode side (handler cancelled) and on the router side (Allocate
DEADLINE_EXCEEDED), the blocks would stay held until the lease expires (600 s here).
"""

from __future__ import annotations

import grpc
import pytest

import stack_harness as sh
from dayzero.rpc.v1 import common_pb2, decode_pb2, decode_pb2_grpc, router_pb2

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

THRESHOLD = 32
STALL = 0.6           # the engine thread stalls this long after each allocation
DEADLINE = 0.15       # every caller gives up before the allocation returns


@pytest.fixture(scope="module")
def stack(make_ckpt, tmp_path_factory):
    s = sh.start_stack(make_ckpt("tiny"), tmp_path_factory.mktemp("orphans"), threshold=THRESHOLD, max_model_len=512,
                       decode_args=["--num-kv-blocks", "64", "--fault-allocate-delay", str(STALL)],
                       router_args=["--allocate-timeout", str(DEADLINE)], with_frontend=False)
    yield s
    s.stop()


def _decode_free(stack) -> bool:
    return sh.all_free([sh.worker_load(stack, "decode-0")])


def _after_engine_queue(stack) -> None:
    """Return once the decode engine thread has run every call queued before this one (it runs
    calls in order): a barrier allocation, released at once. The load it reports is refreshed
    after each round of calls, so it no longer predates the orphaned allocation."""
    with sh.worker_channel(stack, "decode-0") as ch:
        stub = decode_pb2_grpc.DecodeStub(ch)
        barrier = stub.Allocate(decode_pb2.AllocateRequest(request_id="barrier", prompt_tokens=16), timeout=30)
        stub.Release(decode_pb2.ReleaseRequest(request_id="barrier", lease_id=barrier.allocation.lease_id,
                                               kv_senders=0), timeout=10)


def test_allocate_past_the_callers_deadline_is_freed(stack):
    with sh.worker_channel(stack, "decode-0") as ch:
        with pytest.raises(grpc.RpcError) as e:
            decode_pb2_grpc.DecodeStub(ch).Allocate(
                decode_pb2.AllocateRequest(request_id="late", prompt_tokens=200, lease_seconds=600), timeout=DEADLINE)
    assert e.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    _after_engine_queue(stack)
    sh.wait_until(lambda: _decode_free(stack), 3 * STALL + 5, "the orphaned allocation to be freed")


def test_router_whose_allocate_times_out_leaves_no_lease(stack):
    with sh.router_stub(stack) as router:
        with pytest.raises(grpc.RpcError) as e:
            list(router.Generate(router_pb2.GenerateRequest(
                request_id="orphan", prompt_token_ids=sh.random_prompt(100, 5),
                sampling=common_pb2.SamplingParams(max_tokens=4, ignore_eos=True)), timeout=30))
    assert e.value.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED), e.value.details()
    _after_engine_queue(stack)
    sh.wait_until(lambda: _decode_free(stack), 3 * STALL + 5, "the router's orphaned allocation to be freed")
