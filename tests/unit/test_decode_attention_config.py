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
