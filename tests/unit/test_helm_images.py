"""The container images the chart runs: one Dockerfile beside each service, the right base, the
entrypoint module and ports the chart uses, and slim images whose service imports without torch."""

from __future__ import annotations

import json
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
        assert any(k == "RUN" and '".[nixl,vocab]"' in a for k, a in ins)
        # the Harmony vocabulary baked in (structured output compiles JSON Schemas against it)
        assert any(k == "RUN" and a.strip() == "dayzero vocab" for k, a in ins)
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


SLIM_IMPORT = """
import importlib, importlib.abc, json, sys
blocked = set(json.loads(sys.argv[1]))


class NotInImage(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in blocked:
            raise ModuleNotFoundError(f"No module named {name!r} (not in the image)", name=name)
        return None


sys.meta_path.insert(0, NotInImage())
for name in sys.argv[2:]:
    importlib.import_module(name)
"""


def pip_installs(ins: list[tuple[str, str]]) -> set[str]:
    """Distribution names a Dockerfile's RUN pip install lines name (the project itself excluded)."""
    from packaging.requirements import Requirement

    names = set()
    for k, a in ins:
        if k != "RUN":
            continue
        for part in a.split("&&"):
            words = part.split()
            if words[:2] != ["pip", "install"]:
                continue
            for w in words[2:]:
                w = w.strip("'\"")
                if w and not w.startswith("-") and not w.startswith("."):
                    names.add(Requirement(w).name)
    return names


def requirement_closure(names: set[str]) -> set[str]:
    """The named distributions and everything they require (markers evaluated, extras skipped)."""
    from importlib import metadata
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    seen: set[str] = set()
    todo = [canonicalize_name(n) for n in names]
    while todo:
        n = todo.pop()
        if n in seen:
            continue
        seen.add(n)
        try:
            reqs = metadata.requires(n) or []
        except metadata.PackageNotFoundError:
            continue
        for r in map(Requirement, reqs):
            if r.marker is None or r.marker.evaluate({"extra": ""}):
                todo.append(canonicalize_name(r.name))
    return seen


@pytest.mark.parametrize("svc", ["frontend", "router"])
def test_slim_image_holds_what_the_service_imports(svc):
    """The slim images install the package without its dependencies plus a short list: every
    module of the service must import with only that list's closure (and no torch) present."""
    from packaging.utils import canonicalize_name

    pkg = ROOT / "services" / svc / f"dayzero_{svc}"
    modules = sorted(f"{pkg.name}.{p.stem}" for p in pkg.glob("*.py") if p.stem != "__main__")
    if not modules:
        pytest.skip(f"dayzero_{svc} has no modules yet")
    if svc == "router":
        modules += ["kubernetes.client", "kubernetes.config"]  # the planner imports them lazily
    available = requirement_closure(pip_installs(instructions(ROOT / "services" / svc / "Dockerfile")))
    assert "torch" not in available
    # Every installed top-level module that no distribution of the image provides is made
    # unimportable; optional imports (try/except) then fail as they would in the image.
    from importlib import metadata

    blocked = sorted(top for top, dists in metadata.packages_distributions().items()
                     if not {canonicalize_name(d) for d in dists} & available
                     and top not in ("dayzero", pkg.name))
    assert "torch" in blocked
    env = {"PYTHONPATH": f"{ROOT / 'services' / svc}{os.pathsep}{ROOT / 'shared'}",
           "OMP_NUM_THREADS": "1", "PATH": os.environ.get("PATH", "")}
    r = subprocess.run([sys.executable, "-c", SLIM_IMPORT, json.dumps(blocked), *modules],
                       capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, f"dayzero_{svc} needs something its image lacks:\n{r.stderr[-2000:]}"
