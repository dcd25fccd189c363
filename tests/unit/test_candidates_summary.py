"""bench/candidates_summary.py on rows in the formats the device benchmarks write (the device call cannot be redone
cheaply to find a summariser bug): best time per implementation, the shipped row found, unknown files listed."""

from __future__ import annotations

import json
import pathlib
import shutil
import subprocess
import sys
import tarfile

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
import candidates_summary as cs  # noqa: E402

ROWS = [
    {"kind": "decode_s6", "batch": 8, "context": 1024, "config": "default", "num_splits": 4, "us": 9.6},
    {"kind": "decode_s6", "batch": 8, "context": 1024, "config": "default", "num_splits": 8, "us": 9.8},
    {"kind": "decode_s6", "batch": 8, "context": 1024, "config": "tma_p4_s4", "num_splits": 4, "us": 8.0},
    {"n": 8192, "impl": "registered", "graph_ms": 0.0632, "x_floor": 1.77},
    {"n": 8192, "impl": "pk3sr", "graph_ms": 0.0520, "x_floor": 1.45},
    {"section": "moe_gluon", "E": 128, "T": 8192, "balanced": False, "variant": "op", "ms": 2.25},
    {"section": "moe_gluon_interleaved", "E": 128, "T": 8192, "balanced": False, "variant": "gluon128_fold16",
     "layer_ms_graph_il": 2.02},
    {"section": "small_graph", "E": 32, "T": 8, "variant": "split_bn64_r_x16", "us": 160.0},
    {"shape": "qkv", "x": "fp8", "m": 1, "kernel": "gemv bf16 bn64 split4 w4 s4", "us": 15.0},
    {"shape": "qkv", "x": "fp8", "m": 1, "kernel": "gemv swap bn64 split4 w4 s4", "us": 7.0},
    {"section": "ceiling", "name": "copy_1GiB", "ms": 0.5},
]


def test_best_time_per_implementation_and_kinds():
    got = cs.summarise(ROWS)
    dec = got["decode attention"]["B=8 ctx=1024"]
    assert dec == {"default s4": 9.6, "default s8": 9.8, "tma_p4_s4 s4": 8.0}
    assert abs(got["window prefill"]["n=8192"]["pk3sr"] - 52.0) < 1e-6
    assert got["MoE prefill"]["E=128 T=8192 random"] == {"op": 2250.0}
    assert abs(got["MoE prefill, interleaved graphs"]["E=128 T=8192 random"]["gluon128_fold16"] - 2020.0) < 1e-6
    assert got["decode MoE"]["E=32 T=8"] == {"split_bn64_r_x16": 160.0}
    assert got["small-M linear"]["qkv x=fp8 M=1"]["gemv swap bn64 split4 w4 s4"] == 7.0
    assert sum(len(c) for k in got.values() for c in k.values()) == 10   # the ceiling row is no case


def test_cli_marks_the_shipped_row_and_lists_unknown_files(tmp_path):
    # the rows inside a part's .tgz, as bench/candidates.sh packs them, and a file of no known kind beside it
    part = tmp_path / "part"
    part.mkdir()
    (part / "a.json").write_text(json.dumps({"meta": {}, "rows": ROWS}))
    with tarfile.open(tmp_path / "part.tgz", "w:gz") as tar:
        tar.add(part, arcname="part")
    shutil.rmtree(part)
    (tmp_path / "b.json").write_text(json.dumps({"meta": {}, "rows": [{"what": 1}]}))
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "candidates_summary.py"), str(tmp_path)],
                         capture_output=True, text=True, check=True).stdout
    assert "9.60 us  default s4 (shipped)" in out
    assert "8.00 us  tma_p4_s4 s4  +20.0 % vs shipped" in out
    assert "7.00 us  gemv swap bn64 split4 w4 s4 +114.3 % vs shipped" in out
    assert "not understood:" in out and "b.json" in out
