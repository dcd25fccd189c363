"""Decode attention configs: the split-KV presets' tiles stay with the split-KV kernel (a preset's
BLOCK_N 64 once reached the one-split kernel too and cost 9-21 % at batch 64-256, bench/NOTES.md)."""
import pytest

pytest.importorskip("triton")
torch = pytest.importorskip("torch")

from dayzero.kernels import triton_attention_decode as dec  # noqa: E402


@pytest.mark.parametrize("preset", sorted(dec.DECODE_PRESETS))
def test_one_split_keeps_its_tiles(monkeypatch, preset):
    monkeypatch.setenv("DAYZERO_DECODE_ATTENTION", preset)
    base = dec.default_decode_config(64, 0, split=False)
    assert base["BLOCK_N"] == 128 and base["MERGE"] == "combine"
    q = torch.zeros(4, 8, 64)
    k = torch.zeros(4, 2, 64)
    plan = dec.DecodePlan.make(q, k, torch.zeros(4, dtype=torch.int32), 1, 0, None)
    assert plan.cfg["BLOCK_N"] == 128 and plan.num_splits == 1
    split = dec.default_decode_config(64, 0, split=True)
    assert {k: split[k] for k in dec.DECODE_PRESETS[preset]} == dec.DECODE_PRESETS[preset]


def test_unknown_preset_is_refused(monkeypatch):
    monkeypatch.setenv("DAYZERO_DECODE_ATTENTION", "nope")
    with pytest.raises(ValueError, match="DAYZERO_DECODE_ATTENTION"):
        dec.default_decode_config(64, 0)


def test_pdl_switch(monkeypatch):
    monkeypatch.delenv("DAYZERO_DECODE_PDL", raising=False)
    assert dec.default_decode_config(64, 0)["PDL"] is dec.DEFAULT_PDL
    monkeypatch.setenv("DAYZERO_DECODE_PDL", "0")
    assert dec.default_decode_config(64, 0)["PDL"] is False
    assert dec.default_decode_config(64, 128)["PDL"] is False
    monkeypatch.setenv("DAYZERO_DECODE_PDL", "1")   # on where the KV is split: full and sliding layers
    assert dec.default_decode_config(64, 0)["PDL"] is None
    assert dec.default_decode_config(64, 128)["PDL"] is None
    monkeypatch.setenv("DAYZERO_DECODE_PDL", "yes")
    with pytest.raises(ValueError, match="DAYZERO_DECODE_PDL"):
        dec.default_decode_config(64, 0)


def test_one_split_preset(monkeypatch):
    monkeypatch.setenv("DAYZERO_DECODE_ONESPLIT", "strided_n64")
    cfg = dec.default_decode_config(64, 0, split=False)
    assert cfg["MERGE"] == "kernel" and cfg["STRIDED"] and cfg["BLOCK_N"] == 64
    assert dec.default_decode_config(64, 128, split=False)["MERGE"] == "combine"   # windows keep theirs
    monkeypatch.setenv("DAYZERO_DECODE_ONESPLIT", "nope")
    with pytest.raises(ValueError, match="DAYZERO_DECODE_ONESPLIT"):
        dec.default_decode_config(64, 0, split=False)


def test_split_counts():
    c = dec.choose_num_splits
    assert [c(1, 8, L) for L in (1024, 2048, 4096, 8192, 32768, 65536, 131072)] == [16, 32, 32, 32, 32, 64, 64]
    assert c(8, 8, 131072) == 8 and c(64, 8, 131072) == 1 and c(1, 8, 100) == 2
    assert c(1, 8, 8192, window=128) == 2
