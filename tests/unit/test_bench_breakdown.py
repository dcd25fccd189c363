"""Per-op breakdown (``dayzero bench --breakdown``): the attribution rule and a real profiled forward on CPU."""

from __future__ import annotations

import pytest
import torch

from dayzero.bench import bench_decode, bench_prefill, random_model
from dayzero.bench_breakdown import OUTSIDE, OpProfiler, attribute
from dayzero.config import preset


def _x(cat, name, ts, dur, tid=1, corr=None):
    e = {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "tid": tid, "args": {}}
    if corr is not None:
        e["args"]["correlation"] = corr
    return e


def test_attribute_matches_kernels_to_the_range_that_launched_them():
    """Kernels run long after their launch (host ran ahead): each counts for the range around its launch."""
    kernels = {1: 300.0, 2: 40.0, 3: 7.0, 4: 11.0, 5: 2.0}    # correlation -> GPU duration (us)
    ev = [
        _x("user_annotation", "op:moe_experts", 0, 50),
        _x("cuda_driver", "cuLaunchKernelEx", 10, 2, corr=1),
        _x("cuda_driver", "cuLaunchKernelEx", 20, 2, corr=2),
        _x("user_annotation", "op:attention", 60, 30),
        _x("user_annotation", "op:store_kv", 70, 5),          # nested inside attention: innermost wins
        _x("cuda_runtime", "cudaLaunchKernel", 72, 1, corr=3),
        _x("cuda_runtime", "cudaLaunchKernel", 80, 1, corr=4),
        _x("cuda_runtime", "cudaLaunchKernel", 95, 1, corr=5),  # after every range: outside ops
        _x("user_annotation", "other_range", 94, 5),            # not an op range
    ]
    t = 1000.0                                                  # GPU runs the kernels much later
    for corr, dur in kernels.items():
        ev.append(_x("kernel", f"k{corr}", t, dur, tid=7, corr=corr))
        t += dur
    bd = attribute(ev)
    assert bd.mode == "profiler-gpu" and bd.gpu_events == len(kernels)
    assert bd.ops["moe_experts"].gpu_ms == pytest.approx((kernels[1] + kernels[2]) / 1e3)
    assert bd.ops["store_kv"].gpu_ms == pytest.approx(kernels[3] / 1e3)
    assert bd.ops["attention"].gpu_ms == pytest.approx(kernels[4] / 1e3)
    assert bd.outside_ms == pytest.approx(kernels[5] / 1e3)
    assert bd.total_ms == pytest.approx(sum(kernels.values()) / 1e3)
    assert list(bd.ops)[0] == "moe_experts"                     # sorted by GPU time
    assert bd.ops["attention"].calls == 1 and bd.ops["attention"].host_ms == pytest.approx(0.030)
    assert OUTSIDE not in bd.ops


def test_attribute_counts_gpu_idle_before_the_op_that_ends_it():
    """A gap between GPU activities is idle time of the op whose launch ended it (what the GPU waited for)."""
    ev = [
        _x("user_annotation", "dayzero:forward", 0, 300),          # the profiled call's own range
        _x("user_annotation", "op:attention", 0, 10),
        _x("cuda_runtime", "cudaLaunchKernel", 2, 1, corr=1),
        _x("user_annotation", "op:moe_experts", 20, 30),
        _x("cuda_runtime", "cudaLaunchKernel", 40, 1, corr=2),
        _x("cuda_runtime", "cudaLaunchKernel", 45, 1, corr=3),
        _x("cuda_runtime", "cudaLaunchKernel", 60, 1, corr=4),     # outside every op range
        _x("kernel", "k1", 100, 50, tid=7, corr=1),                # GPU busy 100-150
        _x("kernel", "k2", 170, 30, tid=7, corr=2),                # 20 us idle, then moe
        _x("kernel", "k3", 190, 40, tid=8, corr=3),                # overlaps k2 on another stream: no idle
        _x("kernel", "k4", 260, 5, tid=7, corr=4),                 # 30 us idle before an outside activity
    ]
    bd = attribute(ev)
    assert bd.ops["attention"].idle_ms == pytest.approx(0.0)
    assert bd.ops["moe_experts"].idle_ms == pytest.approx(0.020)
    assert bd.outside_idle_ms == pytest.approx(0.030)
    assert bd.idle_ms == pytest.approx(0.050)
    assert bd.gpu_span_ms == pytest.approx(0.165)
    summ = bd.summary(None)
    assert summ["gpu_idle_ms"] == pytest.approx(0.050) and summ["gpu_span_ms"] == pytest.approx(0.165)
    assert bd.to_json()["moe_experts"]["idle_ms"] == pytest.approx(0.020)
    assert bd.lead_ms == pytest.approx(0.100) and bd.tail_ms == pytest.approx(0.035)   # 0 -> 100, 265 -> 300
    assert [(g["idle_us"], g["op"], g["after"], g["before"]) for g in bd.gaps] == [
        (pytest.approx(30.0), OUTSIDE, "k3", "k4"), (pytest.approx(20.0), "moe_experts", "k1", "k2")]
    assert summ["lead_ms"] == pytest.approx(0.100) and len(summ["top_gaps"]) == 2


def test_attribute_falls_back_to_the_external_id_when_the_launch_is_missing():
    rng = _x("user_annotation", "op:linear[8x8]", 0, 10)
    rng["args"]["External id"] = 42
    k = _x("kernel", "gemm", 500, 3.0, tid=7, corr=99)          # correlation 99 has no launch event
    k["args"]["External id"] = 42
    stray = _x("kernel", "add", 600, 5.0, tid=7, corr=100)
    bd = attribute([rng, k, stray])
    assert bd.ops["linear[8x8]"].gpu_ms == pytest.approx(0.003)
    assert bd.outside_ms == pytest.approx(0.005) and bd.unmatched_launches == 2


def test_attribute_with_the_launch_under_another_thread_id():
    ev = [_x("user_annotation", "op:rope", 0, 10, tid=1), _x("cuda_runtime", "cudaLaunchKernel", 5, 1, tid=99, corr=1),
          _x("kernel", "rope_kernel", 50, 4.0, tid=7, corr=1)]
    assert attribute(ev).ops["rope"].gpu_ms == pytest.approx(0.004)


def test_attribute_without_gpu_events_uses_host_ranges():
    bd = attribute([_x("user_annotation", "op:rms_norm", 0, 40), _x("user_annotation", "op:rms_norm", 100, 60)])
    assert bd.mode == "profiler-host"
    assert bd.ops["rms_norm"].calls == 2 and bd.ops["rms_norm"].gpu_ms == pytest.approx(0.1)


@pytest.fixture(scope="module")
def tiny_model():
    torch.manual_seed(0)
    return random_model(preset("tiny"), "float32", "torch", "cpu", seed=0, max_positions=256)


def test_prefill_breakdown_on_cpu_counts_every_op_call(tiny_model):
    cfg = tiny_model.cfg
    row = bench_prefill(tiny_model, tokens=48, repeat=1, breakdown=True, usd=3.0, seed=0)
    assert "breakdown_error" not in row, row.get("breakdown_error")
    bd, check = row["breakdown_ms"], row["breakdown_check"]
    layers = cfg.num_hidden_layers
    for op in ("attention", "store_kv", "router_topk", "moe_experts", "rope"):
        assert bd[op]["calls"] == layers, (op, bd[op])
    linear_calls = sum(v["calls"] for k, v in bd.items() if k.startswith("linear["))
    fused = tiny_model.model.layers[0].self_attn.qkv_lw is not None
    assert fused                                                # float32: q/k/v always stack
    assert linear_calls == layers * 3 + 1                       # qkv, o, router per layer + lm_head
    assert check["mode"] == "profiler-host"
    assert 0 < check["ops_sum_ms"] <= check["profiled_wall_ms"]   # op ranges lie inside the forward
    assert check["untimed_forward_ms"] == pytest.approx(row["seconds"] * 1e3)
    assert tiny_model.ops.table["attention"].__name__ != "ranged"  # the op table is restored


def test_decode_breakdown_on_cpu(tiny_model):
    row = bench_decode(tiny_model, batch=2, context=16, steps=2, seed=0, breakdown=True)
    assert row["breakdown_ms"]["attention"]["calls"] == tiny_model.cfg.num_hidden_layers
    assert row["breakdown_check"]["ops_sum_ms"] <= row["breakdown_check"]["profiled_wall_ms"]


def test_bad_mode_is_refused(tiny_model):
    with pytest.raises(ValueError, match="breakdown mode"):
        OpProfiler(tiny_model, "events")
