"""CPU checks of bench/attention/flashinfer_compare.py's glue (the GPU run cannot be retried cheaply).

The FlashInfer call itself needs a GPU; here a test double reads the paged cache the way FlashInfer's
documentation defines it (kv_indptr / kv_indices / last_page_len, NHD pages, window_left inclusive)
and must agree with our torch attention op on the batches the benchmark builds.
"""

from __future__ import annotations

import pathlib
import subprocess
import sys

import pytest
import torch

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench" / "attention"))
import flashinfer_compare as fc  # noqa: E402

from dayzero.kernels import torch_attention  # noqa: E402


def paged_reader_double(q, kc, vc, qo_indptr, kv_indptr, kv_indices, last_len, sinks, scale, window_left):
    """FlashInfer's documented semantics, in fp32: every key comes from the pages; the new queries are
    the last tokens of each sequence; causal; a key j is visible to query i if i - j <= window_left."""
    out = torch.empty_like(q, dtype=torch.float32)
    page = kc.shape[1]
    group = q.shape[1] // kc.shape[2]
    for b in range(len(qo_indptr) - 1):
        pages = kv_indices[kv_indptr[b]:kv_indptr[b + 1]].long()
        L = page * (len(pages) - 1) + int(last_len[b])
        k = kc[pages].reshape(-1, *kc.shape[2:])[:L].float().repeat_interleave(group, 1)   # [L, Hq, D]
        v = vc[pages].reshape(-1, *vc.shape[2:])[:L].float().repeat_interleave(group, 1)
        qs = q[qo_indptr[b]:qo_indptr[b + 1]].float()
        n = qs.shape[0]
        qpos = torch.arange(L - n, L)[:, None]
        kpos = torch.arange(L)[None]
        vis = kpos <= qpos
        if window_left >= 0:
            vis &= (qpos - kpos) <= window_left
        s = torch.einsum("nhd,lhd->hnl", qs, k) * scale
        s = s.masked_fill(~vis[None], float("-inf"))
        s = torch.cat([s, sinks.float().view(-1, 1, 1).expand(-1, n, 1)], -1)
        out[qo_indptr[b]:qo_indptr[b + 1]] = torch.einsum("hnl,lhd->nhd", torch.softmax(s, -1)[..., :-1], v)
    return out


@pytest.mark.parametrize("qo,kv", [([300, 77, 100], [300, 77, 500]), ([1, 1, 1], [1000, 17, 300])])
@pytest.mark.parametrize("window", [0, fc.WINDOW])
def test_benchmark_batches_mean_the_same_for_flashinfer_and_our_op(qo, kv, window):
    c = fc.ragged_batch(qo, kv, seed=3, device="cpu")
    ref = torch_attention.attention(c["q"], c["k"], c["v"], c["kc"], c["vc"], c["bt"], c["cu"], c["cached"],
                                    c["sinks"], fc.SCALE, window)
    indptr, indices, last = fc.paged_args(c["tables"], kv)
    qo_indptr = torch.tensor([0] + qo).cumsum(0)
    got = paged_reader_double(c["q"], c["kc"], c["vc"], qo_indptr, indptr, indices, last, c["sinks"], fc.SCALE,
                              (fc.WINDOW - 1) if window else -1)
    err = float((got - ref.float()).norm() / ref.float().norm())
    assert err < 1e-2, err
    if window:  # the other convention (window_left = W) must differ: the check can tell them apart
        off = paged_reader_double(c["q"], c["kc"], c["vc"], qo_indptr, indptr, indices, last, c["sinks"],
                                  fc.SCALE, fc.WINDOW)
        if max(kv) > fc.WINDOW:
            assert float((off - ref.float()).norm() / ref.float().norm()) > 1e-2


def test_paged_args_layout():
    tables = [torch.tensor([5, 2, 7]), torch.tensor([1]), torch.tensor([0, 3, 4, 6])]
    indptr, indices, last = fc.paged_args(tables, [33, 16, 49])
    assert indptr.tolist() == [0, 3, 4, 8] and indptr.dtype == torch.int32
    assert indices.tolist() == [5, 2, 7, 1, 0, 3, 4, 6]
    assert last.tolist() == [1, 16, 1]
    with pytest.raises(ValueError):
        fc.paged_args([torch.tensor([1])], [17])                 # 17 tokens need two pages


def test_save_copies_a_result_under_its_date(tmp_path):
    doc = {"meta": {"date_utc": "2026-11-30T16:00:00+00:00"}, "results": []}
    src = tmp_path / "flashinfer.json"
    src.write_text(__import__("json").dumps(doc))
    out = subprocess.run([sys.executable, str(ROOT / "bench/attention/flashinfer_compare.py"), "--save", str(src),
                          "--results-dir", str(tmp_path)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    dst = pathlib.Path(out.stdout.strip())
    assert dst == tmp_path / "flashinfer-2026-11-30T160000Z.json" and dst.exists()


class _FakeSinkWrapper:
    """Test double of flashinfer.BatchAttentionWithAttentionSinkWrapper (the documented calls, on CPU)."""

    def __init__(self, workspace, kv_layout, backend, q_data_type, kv_data_type, head_dim_qk, head_dim_vo,
                 window_left, use_cuda_graph=False, **bufs):
        assert kv_layout == "NHD" and backend in ("fa2", "fa3") and head_dim_qk == head_dim_vo == fc.D
        assert q_data_type == kv_data_type == torch.bfloat16
        assert not use_cuda_graph or set(bufs) == {"qo_indptr_buf", "paged_kv_indptr_buf", "paged_kv_indices_buf",
                                                   "paged_kv_last_page_len_buf"}
        self.sliding = window_left >= 0

    def plan(self, qo_indptr, kv_indptr, kv_indices, last, hq, hkv, d, page, causal, window_left,
             q_data_type, kv_data_type):
        assert (hq, hkv, d, page, causal) == (fc.HQ, fc.HKV, fc.D, fc.BS, True)
        assert (window_left >= 0) == self.sliding, "window variant built for the other mask"
        self.p = (qo_indptr, kv_indptr, kv_indices, last, window_left)

    def run(self, q, kv, sinks, scale, out=None):
        assert sinks.dtype == torch.float32 and isinstance(scale, float)
        qo, ind, idx, last, wl = self.p
        res = paged_reader_double(q, kv[0], kv[1], qo, ind, idx, last, sinks, scale, wl).to(q.dtype)
        if out is None:
            return res
        out.copy_(res)
        return out


def test_cases_run_with_test_doubles_for_the_gpu_parts(tmp_path, monkeypatch):
    """fi_cases' check / prefill / decode code paths on CPU: FlashInfer, our Triton op and the GPU timers
    replaced by doubles (torch op, a paged reader, plain calls); the glue around them is the real code."""
    pytest.importorskip("triton")
    import types

    import fi_cases

    fake = types.ModuleType("flashinfer")
    fake.BatchAttentionWithAttentionSinkWrapper = _FakeSinkWrapper
    fake.__version__ = "double"
    monkeypatch.setitem(sys.modules, "flashinfer", fake)

    def ours_double(*a, max_seqlen_q=None, max_seqlen_k=None, out=None):
        res = torch_attention.attention(*a)
        return res if out is None else out.copy_(res)

    def timed(fn, rep=100):
        fn()
        return 0.5

    def graph_timed(fns):
        for f in fns:
            f()
        return 0.25

    monkeypatch.setattr(fi_cases, "DEV", "cpu")
    monkeypatch.setattr(fi_cases, "ours", ours_double)
    monkeypatch.setattr(fi_cases, "time_ms", timed)
    monkeypatch.setattr(fi_cases, "graph_time_ms", graph_timed)
    monkeypatch.setattr(fi_cases, "run_meta", lambda: {"gpu": "cpu", "commit": "test", "date_utc": "now"})
    run = fc.Run(tmp_path, deadline=__import__("time").time() + 600)
    run.part("meta", fi_cases.meta, run)
    run.doc["builds"] = [dict(backend=b, window=w, ok=True) for b, w in fc.VARIANTS]
    run.part("check", fi_cases.check, run, ["fa2", "fa3"])
    run.part("prefill", fi_cases.prefill_case, run, ["fa2"], 512, 0)
    run.part("prefill", fi_cases.prefill_case, run, ["fa3"], 512, fc.WINDOW)
    pool = tuple(torch.randn(64, fc.BS, fc.HKV, fc.D).bfloat16() for _ in range(2))
    run.part("decode", fi_cases.decode_case, run, ["fa2"], pool, 2, 100)
    doc = run.doc
    assert not doc["errors"], doc["errors"]
    assert doc["meta"]["flashinfer_import"] == "double"
    assert all(c["ok"] for c in doc["checks"]), doc["checks"]
    assert doc["window_left"] == {"fa2/128": fc.WINDOW - 1, "fa3/128": fc.WINDOW - 1, "fa2/0": -1, "fa3/0": -1}
    pre = [r for r in doc["results"] if r["kind"] == "prefill"]
    assert {(r["impl"], r["window"]) for r in pre} == {("ours", 0), ("fa2", 0), ("sdpa", 0), ("ours", fc.WINDOW),
                                                       ("fa3", fc.WINDOW), ("sdpa", fc.WINDOW)}
    assert all(r["rel_err"] < 1e-2 for r in pre if r["impl"] != "sdpa")
    dec = [r for r in doc["results"] if r["kind"] == "decode"]
    assert {r["impl"] for r in dec} == {"ours", "fa2"} and all(r["method"] == "graph" for r in dec)
    assert dec[0]["kv_bytes"] == 2 * 100 * fc.HKV * fc.D * 4 and dec[0]["rotations"] >= 2
    assert (tmp_path / "flashinfer.json").exists()
