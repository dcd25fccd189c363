"""KV leases and request ownership at the workers' gRPC boundary, on the real stack (redis-server,
router, prefill and decode over NIXL; no frontend).

- a prefill worker never writes into a lease that has ended: the decode worker may already have
  given those blocks to another request (shown by a victim request whose greedy output must not
  change), and a prompt queued longer than the decode worker's default lease still completes
  through the router (the router asks for a lease as long as it waits for the prefill);
- a Generate stream owns its request: a failing duplicate Generate with the same id leaves the
  live one alone, and a Release by request id ends the victim's stream (ABORT) instead of leaving
  it waiting forever;
- Release and Prefill answer bad input with INVALID_ARGUMENT;
- a call that stays silent for many keepalive pings (a Generate waiting for its KV, a long
  prefill) is not cut off by the server's ping policy;
- the blocks of a lease released while its prefill worker may still write them (NIXL writes are
  one-sided) are not handed to another request until that worker says it stopped or its KV
  landed; a cancelled prefill says so at once, so a released lease does not sit out the timeout.

The decode worker has 40 full-attention blocks (a 400-token prompt takes 26) and hands freed
blocks out first-in first-out, so a second 400-token allocation made after the first one ended
must reuse some of its blocks; the test checks that premise rather than assuming it.
"""

from __future__ import annotations

import threading
import time

import grpc
import pytest

import stack_harness as sh
from dayzero.rpc.v1 import common_pb2, decode_pb2, decode_pb2_grpc, prefill_pb2, prefill_pb2_grpc, router_pb2
from dayzero.serving.grpc_util import CHANNEL_OPTIONS, MIN_PING_INTERVAL_MS

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

THRESHOLD = 64
LEASE = 1.0            # the decode worker's default lease (seconds)
DRAIN = 4.0            # the decode worker's --kv-drain-seconds
CHUNK_DELAY = 0.4      # per 64-token prefill chunk: a 200-token prompt occupies the prefill worker ~1.6 s


@pytest.fixture(scope="module")
def stack(make_ckpt, tmp_path_factory):
    s = sh.start_stack(make_ckpt("tiny"), tmp_path_factory.mktemp("leases"), threshold=THRESHOLD, max_model_len=1024,
                       prefill_args=["--chunk-size", "64", "--fault-chunk-delay", str(CHUNK_DELAY)],
                       decode_args=["--num-kv-blocks", "40", "--lease-seconds", str(LEASE),
                                    "--kv-drain-seconds", str(DRAIN)],
                       router_args=["--prefill-timeout", "30", "--token-timeout", "15"], with_frontend=False)
    yield s
    s.stop()


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


def test_prefill_refuses_an_ended_lease_so_blocks_reused_by_another_request_stay_intact(stack, decode, prefill):
    victim = sh.random_prompt(400, 21)
    alone = decode.Generate(decode_pb2.DecodeRequest(request_id="victim-alone", prompt_token_ids=victim,
                                                     sampling=_greedy(8)), timeout=30)
    want = [t for m in alone for t in m.token_ids]  # prefilled by the decode worker itself: no lease involved
    assert len(want) == 8
    stale = decode.Allocate(decode_pb2.AllocateRequest(request_id="stale", prompt_tokens=400, lease_seconds=0.2),
                            timeout=10)
    # it ends; nobody was writing it, so its blocks are free again once the drain timeout passes
    sh.wait_until(lambda: sh.all_free([sh.worker_load(stack, "decode-0")]), DRAIN + 10, "the short lease to end")
    mine = decode.Allocate(decode_pb2.AllocateRequest(request_id="victim", prompt_tokens=400, lease_seconds=30),
                           timeout=10)
    assert _full_blocks(mine.allocation) & _full_blocks(stale.allocation), "premise: the victim reuses blocks of the ended lease"
    first = prefill.Prefill(prefill_pb2.PrefillRequest(request_id="victim", prompt_token_ids=victim,
                                                       sampling=_greedy(8), target=mine.allocation,
                                                       receiver=mine.receiver), timeout=30)
    with pytest.raises(grpc.RpcError) as e:  # a late prefill for the ended lease (a very different prompt)
        prefill.Prefill(prefill_pb2.PrefillRequest(request_id="stale", prompt_token_ids=[7] * 400,
                                                   sampling=_greedy(8), target=stale.allocation,
                                                   receiver=stale.receiver), timeout=30)
    assert e.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED, e.value.details()
    assert "lease" in e.value.details() and "expired" in e.value.details()
    rest = decode.Generate(decode_pb2.DecodeRequest(request_id="victim", prompt_token_ids=victim,
                                                    sampling=_greedy(8), lease_id=mine.allocation.lease_id,
                                                    first_token_id=first.first_token_id), timeout=30)
    assert [first.first_token_id] + [t for m in rest for t in m.token_ids] == want


def test_a_prompt_queued_longer_than_the_decode_lease_still_completes(router):
    """Two 200-token prompts at once: the second waits ~1.6 s for the batch-1 prefill worker,
    longer than the decode worker's 1 s default lease."""
    results: dict[int, object] = {}

    def run(i: int) -> None:
        try:
            results[i] = _router_tokens(router, f"queued-{i}", sh.random_prompt(200, 100 + i), 3)
        except grpc.RpcError as e:
            results[i] = e

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for i in range(2):
        assert not isinstance(results[i], grpc.RpcError), f"request {i}: {results[i].details()}"
        tokens, route = results[i]
        assert route == "disaggregated" and len(tokens) == 3


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


def test_prefill_refuses_blocks_outside_the_receivers_pool(decode, prefill):
    alloc = decode.Allocate(decode_pb2.AllocateRequest(request_id="bad-blocks", prompt_tokens=100), timeout=10)
    try:
        target = alloc.allocation
        full = max(range(len(target.layers)), key=lambda i: len(target.layers[i].block_ids))
        target.layers[full].block_ids[0] = 10_000
        with pytest.raises(grpc.RpcError) as e:
            prefill.Prefill(prefill_pb2.PrefillRequest(request_id="bad-blocks", prompt_token_ids=[1] * 100,
                                                       sampling=_greedy(2), target=target, receiver=alloc.receiver),
                            timeout=30)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, e.value.details()
        assert "10000" in e.value.details()
    finally:
        decode.Release(decode_pb2.ReleaseRequest(request_id="bad-blocks"), timeout=10)


def _prefill_in_background(prefill, rid: str, prompt: list[int], alloc):
    call = prefill.Prefill.future(prefill_pb2.PrefillRequest(request_id=rid, prompt_token_ids=prompt,
                                                             sampling=_greedy(2), target=alloc.allocation,
                                                             receiver=alloc.receiver), timeout=60)
    return call


def test_blocks_of_a_lease_released_mid_prefill_are_not_reused_while_the_prefill_writes(stack, decode, prefill):
    """The router's Release can overtake its cancel of the Prefill call; here the call is not
    cancelled at all, so the prefill worker keeps computing and writing the lease for seconds."""
    a = decode.Allocate(decode_pb2.AllocateRequest(request_id="mid", prompt_tokens=400, lease_seconds=30), timeout=10)
    held = _full_blocks(a.allocation)
    call = _prefill_in_background(prefill, "mid", sh.random_prompt(400, 31), a)
    sh.wait_until(lambda: sh.worker_load(stack, "prefill-0").running_requests == 1, 20, "the prefill to start")
    reply = decode.Release(decode_pb2.ReleaseRequest(request_id="mid", lease_id=a.allocation.lease_id, kv_senders=1),
                           timeout=10)
    assert reply.released
    overlap: set[int] = set()
    try:
        other = decode.Allocate(decode_pb2.AllocateRequest(request_id="other", prompt_tokens=400, lease_seconds=30),
                                timeout=10)
        overlap = _full_blocks(other.allocation) & held
        decode.Release(decode_pb2.ReleaseRequest(request_id="other"), timeout=10)
    except grpc.RpcError as e:  # the held blocks leave too few for it: fine
        assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, e.details()
    assert sh.worker_load(stack, "prefill-0").running_requests == 1, "premise: the prefill was still writing"
    assert not overlap, f"blocks {sorted(overlap)} handed to another request while the prefill worker writes them"
    call.result()  # the prefill itself completes; its landed notification frees the blocks


def test_a_cancelled_prefill_says_it_stopped_so_its_released_lease_is_freed_at_once(stack, decode, prefill):
    for release_first in (True, False):  # the router's Release before or after the prefill worker stopped
        rid = f"cancelled-{release_first}"
        a = decode.Allocate(decode_pb2.AllocateRequest(request_id=rid, prompt_tokens=400, lease_seconds=30),
                            timeout=10)
        call = _prefill_in_background(prefill, rid, sh.random_prompt(400, 41), a)
        sh.wait_until(lambda: sh.worker_load(stack, "prefill-0").running_requests == 1, 20, "the prefill to start")
        call.cancel()
        t0 = time.monotonic()
        if not release_first:
            sh.wait_until(lambda: sh.worker_load(stack, "prefill-0").running_requests == 0, 20, "the prefill to stop")
        decode.Release(decode_pb2.ReleaseRequest(request_id=rid, lease_id=a.allocation.lease_id, kv_senders=1),
                       timeout=10)
        sh.wait_until(lambda: sh.all_free(sh.worker_load(stack, n) for n in ("decode-0", "prefill-0")), DRAIN,
                      "both workers to free everything")
        assert time.monotonic() - t0 < DRAIN / 2, "the decode worker waited for the drain timeout"


def test_a_call_silent_for_many_keepalive_pings_is_not_cut_off(stack, decode):
    """The router's channels ping idle connections (keepalive). gRPC's default server policy
    answers the third such ping with GOAWAY too_many_pings, which failed every call silent for
    ~40 s (a long prefill, a Generate waiting for its KV) with UNAVAILABLE. This client pings as
    often as the servers promise to accept; its Generate waits for KV that never comes."""
    options = [o for o in CHANNEL_OPTIONS if o[0] != "grpc.keepalive_time_ms"]
    options.append(("grpc.keepalive_time_ms", MIN_PING_INTERVAL_MS))
    wait = 8 * MIN_PING_INTERVAL_MS / 1000
    alloc = decode.Allocate(decode_pb2.AllocateRequest(request_id="silent", prompt_tokens=100, lease_seconds=30),
                            timeout=10).allocation
    with grpc.insecure_channel(f"127.0.0.1:{stack.workers['decode-0'].grpc_port}", options=options) as ch:
        t0 = time.monotonic()
        with pytest.raises(grpc.RpcError) as e:
            list(decode_pb2_grpc.DecodeStub(ch).Generate(decode_pb2.DecodeRequest(
                request_id="silent", prompt_token_ids=[1] * 100, sampling=_greedy(2), lease_id=alloc.lease_id,
                first_token_id=1, kv_wait_seconds=wait), timeout=60))
    assert e.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED, e.value.details()
    assert "did not land" in e.value.details() and time.monotonic() - t0 >= wait
