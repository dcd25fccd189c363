"""KV leases and request ownership at the workers' gRPC boundary, on the real stack (redis-server,
router, prefill and decode over NIXL; no frontend).

- a Generate stream owns its request: a failing duplicate Generate with the same id leaves the
  live one alone, and a Release by request id ends the victim's stream (ABORT) instead of leaving
  it waiting forever;
- Release answers bad input with INVALID_ARGUMENT.
"""

from __future__ import annotations

import grpc
import pytest

import stack_harness as sh
from dayzero.rpc.v1 import common_pb2, decode_pb2, decode_pb2_grpc, prefill_pb2_grpc, router_pb2

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

THRESHOLD = 64
LEASE = 1.0            # the decode worker's default lease (seconds)
CHUNK_DELAY = 0.4      # per 64-token prefill chunk: a 200-token prompt occupies the prefill worker ~1.6 s


@pytest.fixture(scope="module")
def stack(make_ckpt, tmp_path_factory):
    s = sh.start_stack(make_ckpt("tiny"), tmp_path_factory.mktemp("leases"), threshold=THRESHOLD, max_model_len=1024,
                       prefill_args=["--chunk-size", "64", "--fault-chunk-delay", str(CHUNK_DELAY)],
                       decode_args=["--num-kv-blocks", "40", "--lease-seconds", str(LEASE)],
                       router_args=["--prefill-timeout", "30", "--token-timeout", "15"], with_frontend=False)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def router(stack):
    with sh.router_stub(stack) as stub:
        yield stub


@pytest.fixture(scope="module")
def decode(stack):
    with sh.worker_channel(stack, "decode-0") as ch:
        yield decode_pb2_grpc.DecodeStub(ch)


@pytest.fixture(scope="module")
def prefill(stack):
    with sh.worker_channel(stack, "prefill-0") as ch:
        yield prefill_pb2_grpc.PrefillStub(ch)


@pytest.fixture(autouse=True)
def nothing_held_afterwards(stack):
    yield
    sh.wait_until(lambda: sh.all_free(sh.worker_load(stack, n) for n in ("decode-0", "prefill-0")), 15,
                  "0 KV blocks held on both workers")


def _greedy(max_tokens: int) -> common_pb2.SamplingParams:
    return common_pb2.SamplingParams(max_tokens=max_tokens, ignore_eos=True)


def _router_tokens(router, rid: str, prompt: list[int], max_tokens: int) -> tuple[list[int], str]:
    msgs = list(router.Generate(router_pb2.GenerateRequest(request_id=rid, prompt_token_ids=prompt,
                                                           sampling=_greedy(max_tokens)), timeout=60))
    return [t for m in msgs for t in m.token_ids], msgs[0].route


def _full_blocks(alloc) -> set[int]:
    """The blocks of the allocation's full-attention layer (the layer with the most blocks)."""
    return set(max((list(layer.block_ids) for layer in alloc.layers), key=len))


def test_a_failing_duplicate_generate_leaves_the_live_request_alone(decode):
    live = decode.Generate(decode_pb2.DecodeRequest(request_id="dup", prompt_token_ids=[1, 2, 3],
                                                    sampling=_greedy(200)), timeout=30)
    first = next(live)
    with pytest.raises(grpc.RpcError) as e:
        list(decode.Generate(decode_pb2.DecodeRequest(request_id="dup", prompt_token_ids=[1, 2, 3],
                                                      sampling=_greedy(5)), timeout=10))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "already in use" in e.value.details()
    rest = list(live)  # a stream that was aborted behind its back would hang here until the deadline
    assert len(first.token_ids) + sum(len(m.token_ids) for m in rest) == 200
    assert rest[-1].finish_reason == common_pb2.FINISH_REASON_LENGTH


def test_release_by_request_id_ends_the_running_stream(decode):
    call = decode.Generate(decode_pb2.DecodeRequest(request_id="released", prompt_token_ids=[4, 5, 6],
                                                    sampling=_greedy(500)), timeout=20)
    next(call)
    reply = decode.Release(decode_pb2.ReleaseRequest(request_id="released"), timeout=10)
    assert reply.released and reply.blocks_freed > 0
    rest = list(call)  # ends promptly (a hang would surface as DEADLINE_EXCEEDED)
    assert rest[-1].finish_reason == common_pb2.FINISH_REASON_ABORT
    assert sum(len(m.token_ids) for m in rest) < 500


def test_release_answers_bad_and_unknown_ids(decode):
    with pytest.raises(grpc.RpcError) as e:
        decode.Release(decode_pb2.ReleaseRequest(), timeout=10)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "request_id" in e.value.details()
    reply = decode.Release(decode_pb2.ReleaseRequest(request_id="never-seen"), timeout=10)
    assert not reply.released and reply.blocks_freed == 0  # idempotent: not an error, but says so


