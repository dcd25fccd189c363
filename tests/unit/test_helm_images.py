"""The container images the chart runs: one Dockerfile beside each service, the right base, the
entrypoint module and ports the chart uses, and slim images whose service imports without torch."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "dayzero"
SERVICES = {"frontend": "slim", "router": "slim", "prefill": "cuda", "decode": "cuda"}
PORTS = {"frontend": {8000}, "router": {50051, 9100}, "prefill": {50061, 9100}, "decode": {50071, 9100}}


def instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with line continuations joined and comments dropped."""
    out, buf = [], ""
    for line in path.read_text().splitlines():
        if not buf and (not line.strip() or line.lstrip().startswith("#")):
            continue
        buf += line.rstrip("\\").strip() + " "
        if not line.rstrip().endswith("\\"):
            word, _, rest = buf.strip().partition(" ")
            out.append((word.upper(), rest.strip()))
            buf = ""
    return out


def base_image(ins: list[tuple[str, str]]) -> str:
    args = dict(a.split("=", 1) for k, a in ins if k == "ARG" and "=" in a)
    (frm,) = [a for k, a in ins if k == "FROM"]
    return re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], frm)


@pytest.mark.parametrize("svc", sorted(SERVICES))
def test_dockerfile_matches_the_chart(svc):
    path = ROOT / "services" / svc / "Dockerfile"
    ins = instructions(path)
    base = base_image(ins)
    if SERVICES[svc] == "cuda":
        assert base.startswith("nvidia/cuda:"), base
        env = " ".join(a for k, a in ins if k == "ENV")
        assert "NCCL_NVLS_ENABLE=0" in env and "TORCH_SYMM_MEM_DISABLE_MULTICAST=1" in env
        assert any(k == "RUN" and '".[nixl]"' in a for k, a in ins)
    else:
        assert base.startswith("python:") and base.endswith("-slim"), base
        assert not any(k == "RUN" and "torch" in a for k, a in ins)
    (entry,) = [a for k, a in ins if k == "ENTRYPOINT"]
    assert yaml.safe_load(entry) == ["python", "-m", f"dayzero_{svc}"]
    exposed = {int(p) for k, a in ins if k == "EXPOSE" for p in a.split()}
    assert PORTS[svc] <= exposed
    copied = {a.split()[0] for k, a in ins if k == "COPY"}
    assert {"shared", "services", "proto", "pyproject.toml"} <= copied
    ignore = (path.parent / "Dockerfile.dockerignore").read_text()
    assert "!shared/" in ignore and "!services/" in ignore


def test_chart_image_names_match_services():
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    for svc in SERVICES:
        assert values["image"][svc] == f"dayzero/{svc}"


@pytest.mark.parametrize("svc", ["frontend", "router"])
def test_slim_service_imports_without_torch(svc):
    """The slim images install the package without torch: no module of the service may need it."""
    pkg = ROOT / "services" / svc / f"dayzero_{svc}"
    modules = sorted(f"{pkg.name}.{p.stem}" for p in pkg.glob("*.py") if p.stem != "__main__")
    if not modules:
        pytest.skip(f"dayzero_{svc} has no modules yet")
    code = ("import importlib, sys\n"
            "sys.modules['torch'] = None  # any 'import torch' now raises ImportError\n"
            f"for name in {modules!r}:\n"
            "    importlib.import_module(name)\n")
    env = {"PYTHONPATH": f"{ROOT / 'services' / svc}{os.pathsep}{ROOT / 'shared'}",
           "OMP_NUM_THREADS": "1", "PATH": os.environ.get("PATH", "")}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
