"""``dayzero generate``: run the single-process engine on token ids and print the generated ids.

    dayzero generate --model DIR --prompt-ids 1,2,3 --max-tokens 8 [--dtype float32|bfloat16|fp8]
                     [--backend torch|triton] [--device cpu|cuda] [--temperature T --top-p P
                     --top-k K --min-p M --seed S] [--stop-ids 5,6] [--ignore-eos]

Greedy unless a sampling flag is given. Prints the generated token ids on one line, separated by
spaces. ``--dtype fp8`` on an HF checkpoint quantizes at load; on an FP8 checkpoint it loads directly.
"""

from __future__ import annotations

import argparse
import sys

from dayzero.config import ConfigError


def _ids(text: str) -> list[int]:
    try:
        ids = [int(t) for t in text.replace(" ", ",").split(",") if t]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    return ids


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, help="checkpoint directory (HF gpt-oss layout or FP8 serving format)")
    p.add_argument("--prompt-ids", required=True, type=_ids, help="prompt token ids, e.g. 1,2,3")
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--dtype", choices=("float32", "bfloat16", "fp8"), default="bfloat16")
    p.add_argument("--backend", default="torch", help="kernel backend (torch, triton)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--temperature", type=float, default=None, help="0 = greedy (the default)")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--min-p", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--stop-ids", type=_ids, default=[], help="stop token ids (the model's eos ids stop too)")
    p.add_argument("--ignore-eos", action="store_true")
    p.add_argument("--chunk-size", type=int, default=2048, help="prefill chunk (tokens per forward pass)")


def run(args: argparse.Namespace) -> int:
    from dayzero.runtime.engine import Engine, EngineConfig
    from dayzero.runtime.sampling import SamplingParams
    from dayzero.weights.safetensors_io import CheckpointError
    from dayzero.model.layers import WeightLoadError

    sampling_flags = args.top_p != 1.0 or args.top_k != 0 or args.min_p != 0.0 or args.seed is not None
    temperature = args.temperature if args.temperature is not None else (1.0 if sampling_flags else 0.0)
    params = SamplingParams(max_tokens=args.max_tokens, temperature=temperature, top_p=args.top_p, top_k=args.top_k,
                            min_p=args.min_p, seed=args.seed, stop_token_ids=tuple(args.stop_ids),
                            ignore_eos=args.ignore_eos)
    try:
        params.validate()
        if not args.prompt_ids:
            raise ValueError("--prompt-ids is empty")
        n = len(args.prompt_ids) + args.max_tokens
        config = EngineConfig(max_num_seqs=1, max_num_batched_tokens=args.chunk_size, max_model_len=n + 1)
        engine = Engine.from_dir(args.model, dtype=args.dtype, backend=args.backend, device=args.device,
                                 config=config, max_positions=n + 1)
        out = engine.generate([args.prompt_ids], params)[0]
    except (ConfigError, CheckpointError, WeightLoadError, ValueError) as e:
        print(f"dayzero generate: error: {e}", file=sys.stderr)
        return 2
    print(" ".join(str(t) for t in out if t >= 0))
    return 0
