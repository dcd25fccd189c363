"""Build a Triton or Gluon kernel for sm_90 on a machine without a GPU and read what the GPU would
run: registers per thread (cuobjdump's resource usage), shared memory, SASS, PTX and TTGIR, and the
programs per SM that registers / shared memory / threads allow (65536 registers, ~227 KB shared
memory, 2048 threads, 32 programs; each program reserves 1 KB of shared memory). Uses Triton's
bundled cuobjdump. The bench compile checks (attention, MoE decode, Gluon MoE) share it.
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from dataclasses import dataclass

import triton
from triton.backends.compiler import GPUTarget

BIN = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")


@dataclass
class Sm90Build:
    regs: int          # registers per thread at launch
    smem: int          # bytes of shared memory per program, incl. the 1 KB reserve
    threads: int       # per program
    sass: str
    ptx: str
    ttgir: str

    @property
    def programs_per_sm(self) -> int:
        by_regs = 65536 // (self.threads * -(-self.regs // 8) * 8)
        return min(by_regs, 227 * 1024 // self.smem, 2048 // self.threads, 32)

    @property
    def spills(self) -> int:
        """Local-memory loads and stores in the SASS (register spills)."""
        return self.sass.count("LDL") + self.sass.count("STL")


def build_sm90(src, num_warps: int, **options) -> Sm90Build:
    """``src``: an ``ASTSource`` (Triton) or ``GluonASTSource``; ``options``: num_stages, maxnreg, ..."""
    k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=num_warps, **options))
    with tempfile.TemporaryDirectory() as d:
        cubin = os.path.join(d, "k.cubin")
        with open(cubin, "wb") as f:
            f.write(k.asm["cubin"])
        res, sass = (subprocess.run([os.path.join(BIN, "cuobjdump"), flag, cubin], capture_output=True,
                                    text=True).stdout for flag in ("-res-usage", "-sass"))
    return Sm90Build(regs=int(re.search(r"REG:(\d+)", res).group(1)), smem=k.metadata.shared + 1024,
                     threads=32 * num_warps, sass=sass, ptx=k.asm["ptx"], ttgir=k.asm["ttgir"])
