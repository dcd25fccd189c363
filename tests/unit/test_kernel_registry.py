"""Kernel registry: backend resolution, fallbacks recorded, GPU backends refused clearly on CPU."""

import pytest
import torch

from dayzero.kernels.registry import OP_NAMES, BackendUnavailable, get_ops


def test_torch_backend_has_every_op():
    ops = get_ops("torch")
    assert ops.backend == "torch" and ops.fallbacks == ()
    for name in OP_NAMES:
        assert callable(getattr(ops, name))


def test_unknown_backend_is_named():
    with pytest.raises(ValueError, match="unknown kernel backend 'nope'"):
        get_ops("nope")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only refusal")
def test_triton_refused_without_cuda():
    with pytest.raises(BackendUnavailable, match="needs a CUDA device"):
        get_ops("triton", "cpu")
