"""runtime.staging.pack: one buffer, every piece back with its dtype, shape and values."""

from __future__ import annotations

import pytest
import torch

from dayzero.runtime import staging


def test_pack_round_trips_mixed_dtypes_and_shapes():
    g = torch.Generator().manual_seed(0)
    src = {
        "ids": torch.randint(0, 1 << 40, (37,), generator=g, dtype=torch.int64),
        "cu": torch.tensor([0, 5, 37], dtype=torch.int32),
        "tables": torch.randint(-5, 1000, (3, 7), generator=g, dtype=torch.int32),
        "empty": torch.zeros(0, dtype=torch.int64),
        "empty2d": torch.zeros(2, 0, dtype=torch.int32),
        "f": torch.randn(5, generator=g),
        "odd": torch.arange(3, dtype=torch.int16),
    }
    out = staging.pack(src, torch.device("cpu"))
    assert list(out) == list(src)
    for k, t in src.items():
        assert out[k].dtype == t.dtype and out[k].shape == t.shape and torch.equal(out[k], t), k
    base = out["ids"].untyped_storage().data_ptr()
    for k in src:                                   # one buffer, 16-byte aligned pieces
        assert out[k].untyped_storage().data_ptr() == base
        assert out[k].data_ptr() % staging.ALIGN == 0
    src["cu"][0] = 99                               # a copy, not a view of the inputs
    assert out["cu"][0] == 0


def test_pack_rejects_tensors_not_on_the_host():
    with pytest.raises(ValueError, match="must be a CPU tensor"):
        staging.pack({"x": torch.zeros(3, device="meta")}, torch.device("cpu"))
