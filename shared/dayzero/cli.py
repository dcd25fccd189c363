"""`dayzero` command line: one subcommand per module, each module owns its arguments.

A subcommand module exposes ``add_arguments(parser)`` and ``run(args) -> int``; it is imported
only when its subcommand runs, so ``dayzero --help`` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# name -> (module, help)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "make-checkpoint": ("dayzero.weights.random_checkpoint", "write a random checkpoint in the exact HF gpt-oss layout"),
    "convert": ("dayzero.weights.convert", "convert an HF gpt-oss checkpoint to the FP8 serving format"),
    "generate": ("dayzero.runtime.generate", "generate token ids with the single-process engine"),
    "serve": ("dayzero.serve", "run the whole stack (frontend, router, prefill, decode) on one machine"),
    "vocab": ("dayzero.vocab", "resolve the Harmony vocabulary (o200k_base.tiktoken) offline"),
    "bench": ("dayzero.bench", "benchmarks (prefill, decode) on the current device"),
}


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dayzero", description="Serve OpenAI's GPT-OSS models.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    wanted = None
    if argv:
        wanted = next((a for a in argv if not a.startswith("-")), None)
    for name, (module, help_) in SUBCOMMANDS.items():
        p = sub.add_parser(name, help=help_, description=help_)
        if name == wanted:
            mod = importlib.import_module(module)
            mod.add_arguments(p)
            p.set_defaults(_run=mod.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(argv)
    args = parser.parse_args(argv)
    if not getattr(args, "_run", None):
        parser.print_help()
        return 2
    return int(args._run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
