"""bench/targets_table.py: which issue-5 / issue-6 targets a device call's JSON meets, read from files shaped as the
benchmarks write them (flashinfer_compare, gluon_window_bench, bench_small, bench_gluon, bench_kernels, dayzero bench)."""

from __future__ import annotations

import json
import sys
import tarfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import targets_table  # noqa: E402


def write(path: Path, rows: list, key: str = "rows", **meta) -> Path:
    path.write_text(json.dumps({"meta": {"commit": "abc123def4567890", **meta}, key: rows}))
    return path


def status(checks, table: str, case: str):
    (ch,) = [c for c in checks if c.table.startswith(table) and c.case == case]
    return ch.met


def test_attention_targets_from_a_flashinfer_run_and_the_window_bench(tmp_path):
    fi = [dict(kind="prefill", impl="ours", n=8192, window=0, ms=1.0, tflops=450.0),
          dict(kind="prefill", impl="fa3", n=8192, window=0, ms=1.0, tflops=460.0),     # fa3 faster: missed
          dict(kind="prefill", impl="ours", n=32768, window=0, ms=1.0, tflops=500.0),
          dict(kind="prefill", impl="fa3", n=32768, window=0, ms=1.0, tflops=450.0),
          dict(kind="prefill", impl="fa2", n=8192, window=128, ms=0.2, tflops=10.0),
          dict(kind="decode", impl="ours", batch=64, context=8192, us=40.0, tbps=3.4),   # 80 % and faster
          dict(kind="decode", impl="fa2", batch=64, context=8192, us=50.0, tbps=2.7),
          dict(kind="decode", impl="ours", batch=8, context=1024, us=9.0, tbps=1.8),     # 42 %: missed
          dict(kind="decode", impl="fa2", batch=8, context=1024, us=16.0, tbps=1.0),
          dict(kind="decode", impl="ours", batch=1, context=8192, us=9.0, tbps=1.8),
          dict(kind="decode", impl="fa2", batch=1, context=8192, us=14.0, tbps=1.2)]
    win = [dict(n=8192, impl="registered", ms=0.1, graph_ms=0.050, floor_ms=0.0354, x_floor=1.41),
           dict(n=32768, impl="registered", ms=0.3, graph_ms=0.270, floor_ms=0.142, x_floor=1.90),
           dict(n=8192, impl="triton", ms=0.1, graph_ms=0.098, floor_ms=0.0354, x_floor=2.77)]
    checks = targets_table.attention_checks(targets_table.load(
        [str(write(tmp_path / "fi.json", fi, key="results")), str(write(tmp_path / "win.json", win))]))
    assert status(checks, "causal", "N=8192") is False
    assert status(checks, "causal", "N=32768") is True
    assert status(checks, "sliding", "N=8192") is True
    assert status(checks, "sliding", "N=32768") is False
    assert len([c for c in checks if c.table.startswith("sliding")]) == 2      # only the registered op's rows
    assert status(checks, "decode, paged", "B=64 ctx=8192") is True
    assert status(checks, "decode, paged", "B=8 ctx=1024") is False
    assert status(checks, "decode batch 1", "B=1 ctx=8192") is True
    assert all(c.commit == "abc123def456" for c in checks)


def test_moe_and_linear_targets_and_engine_rows_from_a_packed_call(tmp_path):
    small = [dict(section="small_graph", variant="split_wg_d64_s2_qt", shipped=True, E=32, T=1, us=34.8,
                  frac_copy=0.672, mb_touched=99.6),
             dict(section="small_graph", variant="old_small", shipped=False, E=32, T=1, us=60.0, frac_copy=0.4,
                  mb_touched=99.6),
             dict(section="small_graph", variant="split_bn64_x16", shipped=True, E=128, T=64, us=800.0,
                  frac_copy=0.80, mb_touched=2758.4)]
    gluon = [dict(section="moe_gluon", variant="op", E=128, T=8192, balanced=False, tflops_useful_graph=710.0,
                  layer_ms_graph=2.3, tflops_useful=800.0),
             dict(section="moe_gluon", variant="op", E=32, T=8192, balanced=True, tflops_useful_graph=870.0,
                  layer_ms_graph=1.87, tflops_useful=869.0),
             dict(section="moe_gluon", variant="gluon64", E=32, T=8192, balanced=True, tflops_useful_graph=999.0,
                  layer_ms_graph=1.0, tflops_useful=999.0)]
    linear = [dict(section="linear_prefill", shape="qkv", M=8192, variant="linear_op_total", tflops=969.0),
              dict(section="linear_prefill", shape="o", M=8192, variant="linear_op_total", tflops=880.0),
              dict(section="linear_prefill", shape="o", M=8192, variant="cublas_block", tflops=1000.0)]
    engine = [dict(mode="prefill", tokens=8192, seconds=0.08, usd_per_1m_input_tokens=0.0081),
              dict(mode="decode", batch=1, context=1024, tokens_per_s=432.5, cuda_graphs=True, qkv="stacked")]
    for name, rows in (("moe-small", small), ("moe-gluon", gluon), ("linear", linear)):
        write(tmp_path / f"{name}.json", rows)
    write(tmp_path / "bench-all-20b.json", engine, model="20b")
    with tarfile.open(tmp_path / "call.tgz", "w:gz") as tar:
        for name in ("moe-small", "moe-gluon", "linear"):
            tar.add(tmp_path / f"{name}.json", arcname=f"part/{name}.json")
    rows = targets_table.load([str(tmp_path / "call.tgz"), str(tmp_path / "bench-all-20b.json")])
    checks = targets_table.moe_checks(rows)
    assert status(checks, "MoE decode", "20B T=1") is False
    assert status(checks, "MoE decode", "120B T=64") is True
    assert len([c for c in checks if c.table.startswith("MoE decode")]) == 2     # the shipped rows only
    assert status(checks, "MoE prefill", "120B T=8192 random") is False
    assert status(checks, "MoE prefill", "20B T=8192 balanced") is True
    assert len([c for c in checks if c.table.startswith("MoE prefill")]) == 2    # variant op only
    assert status(checks, "dense", "qkv M=8192") is True
    assert status(checks, "dense", "o M=8192") is False
    text = targets_table.render(checks, targets_table.engine_rows(rows))
    assert "| prefill | 20b | 8192 tokens | 0.0800 s |" in text
    assert "432.5 tok/s" in text and "3 of 6 checks met" in text
