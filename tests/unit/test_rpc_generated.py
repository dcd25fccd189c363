"""The committed gRPC modules are exactly what `python -m dayzero.rpc.generate` produces."""

import filecmp
import os

import pytest

from dayzero.rpc import generate


def test_generated_code_is_up_to_date(tmp_path):
    pytest.importorskip("grpc_tools")
    files = generate.generate(str(tmp_path))
    assert files, "no .proto files found"
    committed = os.path.join(generate.repo_root(), "shared", "dayzero", "rpc", "v1")
    fresh = tmp_path / "dayzero" / "rpc" / "v1"
    names = sorted(n for n in os.listdir(fresh) if n.endswith((".py", ".pyi")))
    assert names
    stale = [n for n in names if not filecmp.cmp(fresh / n, os.path.join(committed, n), shallow=False)]
    assert not stale, f"regenerate with `python -m dayzero.rpc.generate`: stale {stale}"
