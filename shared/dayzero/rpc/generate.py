"""Regenerate the gRPC modules under shared/dayzero/rpc/v1 from proto/dayzero/rpc/v1/*.proto.

Run from the repository root: ``python -m dayzero.rpc.generate`` (needs grpcio-tools).
"""

from __future__ import annotations

import glob
import os
import sys


def repo_root() -> str:
    here = os.path.dirname(os.path.abspath(__file__))
    return os.path.abspath(os.path.join(here, "..", "..", ".."))


def generate(out_dir: str | None = None) -> list[str]:
    from grpc_tools import protoc
    import grpc_tools

    root = repo_root()
    proto_root = os.path.join(root, "proto")
    out = out_dir or os.path.join(root, "shared")
    files = sorted(glob.glob(os.path.join(proto_root, "dayzero", "rpc", "v1", "*.proto")))
    if not files:
        raise SystemExit(f"no .proto files under {proto_root}")
    well_known = os.path.join(os.path.dirname(grpc_tools.__file__), "_proto")
    args = ["protoc", f"-I{proto_root}", f"-I{well_known}", f"--python_out={out}", f"--pyi_out={out}",
            f"--grpc_python_out={out}", *files]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")
    return files


if __name__ == "__main__":
    for f in generate(sys.argv[1] if len(sys.argv) > 1 else None):
        print("generated from", os.path.relpath(f, repo_root()))
