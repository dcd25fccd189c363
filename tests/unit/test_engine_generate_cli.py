"""``dayzero generate``: a real subprocess prints the engine's tokens; flags and bad input."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys

import pytest

from dayzero.cli import main
from dayzero.runtime.engine import Engine, EngineConfig
from dayzero.runtime.sampling import SamplingParams

PROMPT = [3, 1, 4, 1, 5, 9, 2, 6]


def _run_cli(args: list[str]) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-m", "dayzero", "generate", *args], capture_output=True, text=True,
                          timeout=300, env=env)


def test_generate_subprocess_prints_engine_tokens(make_ckpt):
    d = make_ckpt("tiny2")
    r = _run_cli(["--model", d, "--prompt-ids", ",".join(map(str, PROMPT)), "--max-tokens", "6",
                  "--dtype", "float32", "--ignore-eos"])
    assert r.returncode == 0, r.stderr
    got = [int(t) for t in r.stdout.split()]
    want = Engine.from_dir(d, dtype="float32", config=EngineConfig(num_kv_blocks=8), max_positions=64).generate(
        [PROMPT], SamplingParams(max_tokens=6, ignore_eos=True))[0]
    assert got == want and len(got) == 6


def test_generate_sampling_flags_and_fp8(make_ckpt, capsys):
    d = make_ckpt("tiny2")
    base = ["generate", "--model", d, "--prompt-ids", "1,2,3", "--max-tokens", "8", "--ignore-eos"]
    outs = []
    for extra in (["--seed", "7", "--top-k", "50"], ["--seed", "7", "--top-k", "50"], ["--seed", "8", "--top-k", "50"],
                  ["--dtype", "fp8"]):
        assert main(base + extra) == 0
        outs.append(capsys.readouterr().out.split())
    assert outs[0] == outs[1] and len(outs[0]) == 8      # a seed reproduces
    assert outs[0] != outs[2]                            # another seed differs
    assert len(outs[3]) == 8                             # FP8 quantized at load


@pytest.mark.parametrize("args,msg,argparse_error", [
    (["--prompt-ids", "1,2,x"], "comma-separated integers", True),
    (["--prompt-ids", "1,99999999"], "outside the vocabulary", False),
    (["--prompt-ids", "1,2", "--top-p", "0"], "top_p", False),
])
def test_generate_bad_input(make_ckpt, capsys, args, msg, argparse_error):
    d = make_ckpt("tiny2")
    with pytest.raises(SystemExit) if argparse_error else contextlib.nullcontext():
        assert main(["generate", "--model", d, "--max-tokens", "2", *args]) == 2
    assert msg in capsys.readouterr().err


def test_generate_missing_model_dir(tmp_path):
    r = _run_cli(["--model", str(tmp_path / "nope"), "--prompt-ids", "1"])
    assert r.returncode == 2
    assert "config.json not found" in r.stderr and "Traceback" not in r.stderr

