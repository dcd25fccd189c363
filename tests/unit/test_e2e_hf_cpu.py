"""bench/moe/e2e_hf.py on CPU with the tiny model: every section's code path (HF's flex_attention refuses
sinks on CPU, so the HF rows there come from its eager attention, and the run says so)."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_e2e_hf_cpu_smoke(tmp_path):
    pytest.importorskip("triton")                     # bench/moe/common.py times with triton.testing
    env = dict(os.environ, PYTHONPATH=str(ROOT / "shared"), OMP_NUM_THREADS="2")
    cmd = [sys.executable, str(ROOT / "bench/moe/e2e_hf.py"), "--device", "cpu", "--model", "tiny", "--tokens", "40",
           "--prefill-tokens", "48,64", "--decode-batches", "1,2", "--decode-context", "16", "--decode-steps", "2",
           "--breakdown", "--out", str(tmp_path)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    doc = json.loads((tmp_path / "e2e-hf-tiny.json").read_text())
    assert doc["errors"] == [], doc["errors"]
    rows = doc["rows"]
    by = lambda n: [r for r in rows if r["name"] == n]  # noqa: E731
    assert doc["meta"]["transformers"] and doc["meta"]["device"] == "cpu"
    # the FP8 engine against HF bf16 on the same weights: close, not identical (FP8 weights)
    cmp = by("torch_fp8_vs_hf_bf16")[0]
    assert 0.95 < cmp["cos_mean"] < 1.0 and cmp["top1_agree"] > 0.5
    fast = by("hf_fast_vs_hf_eager") or by("hf_fast_unavailable")
    assert fast, "the flex attention attempt must be reported either way"
    pre = by("hf_fast_prefill")
    assert [r["tokens"] for r in pre] == [48, 64] and all(r["seconds"] > 0 and r["experts"] == "grouped_mm" for r in pre)
    dec = by("hf_fast_decode")
    assert {r["batch"] for r in dec} == {1, 2} and all(r["tokens_per_s"] > 0 for r in dec)
    assert [r["tokens"] for r in by("engine_prefill")] == [48, 64]
    assert [r["batch"] for r in by("engine_decode")] == [1, 2]
    side = by("side_by_side")
    assert {(r["mode"], r.get("tokens", r.get("batch"))) for r in side} == {("prefill", 48), ("prefill", 64),
                                                                           ("decode", 1), ("decode", 2)}
    assert "breakdown_ms" in by("engine_prefill")[0] and "breakdown_ms" in by("engine_decode")[0]
