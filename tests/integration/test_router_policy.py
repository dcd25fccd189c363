"""Router placement policy (pure functions over registry records)."""

from __future__ import annotations

from dayzero.rpc.v1 import worker_pb2
from dayzero_router.policy import blocks_needed, order_decodes, order_prefills, plan_route


def rec(wid: str, role: str, free: int = 0, queued: int = 0, compat: str = "A") -> worker_pb2.WorkerRecord:
    return worker_pb2.WorkerRecord(worker_id=wid, role=role, compat_hash=compat,
                                   load=worker_pb2.WorkerLoad(kv_blocks_free=free, queued_tokens=queued))


def test_decode_with_most_free_kv_first_counting_what_was_just_placed():
    ds = [rec("d1", "decode", free=100), rec("d2", "decode", free=300), rec("d3", "decode", free=200)]
    assert [r.worker_id for r in order_decodes(ds, {})] == ["d2", "d3", "d1"]
    assert [r.worker_id for r in order_decodes(ds, {"d2": 250})] == ["d3", "d1", "d2"]


def test_prefill_compatible_first_then_fewest_queued_tokens():
    ps = [rec("p1", "prefill", queued=50), rec("p2", "prefill", queued=10, compat="B"),
          rec("p3", "prefill", queued=20)]
    assert [r.worker_id for r in order_prefills(ps, {}, "A")] == ["p3", "p1", "p2"]
    assert [r.worker_id for r in order_prefills(ps, {"p3": 100}, "A")] == ["p1", "p3", "p2"]


def test_conditional_disaggregation():
    ds, ps = [rec("d", "decode", free=10)], [rec("p", "prefill")]
    assert not plan_route(10, ds, ps, threshold=64, pending_blocks={}, pending_tokens={}).disaggregate
    long = plan_route(64, ds, ps, threshold=64, pending_blocks={}, pending_tokens={})
    assert long.disaggregate and [r.worker_id for r in long.prefills] == ["p"]
    # no prefill worker up: even a long prompt is prefilled on the decode worker
    assert not plan_route(1000, ds, [], threshold=64, pending_blocks={}, pending_tokens={}).disaggregate


def test_blocks_needed_counts_the_first_generated_token():
    assert blocks_needed(15, 16) == 1 and blocks_needed(16, 16) == 2 and blocks_needed(1, 16) == 1
