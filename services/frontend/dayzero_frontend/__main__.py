"""``python -m dayzero_frontend``: the OpenAI-compatible HTTP frontend in front of the router."""

from __future__ import annotations

import argparse
import logging
import os
import sys

from dayzero.serving.parent_watch import exit_with_parent

DEFAULT_MODEL_NAME = "gpt-oss"
DEFAULT_MAX_MODEL_LEN = 131072


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m dayzero_frontend", description=__doc__)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--router", required=True, help="router gRPC address HOST:PORT")
    p.add_argument("--api-key", default=os.environ.get("DAYZERO_API_KEY") or None,
                   help="require `Authorization: Bearer KEY` (default: env DAYZERO_API_KEY; none = open)")
    p.add_argument("--model-name", default=DEFAULT_MODEL_NAME, help="the model id clients use")
    p.add_argument("--max-model-len", type=int, default=DEFAULT_MAX_MODEL_LEN,
                   help="context length: prompt + generated tokens")
    p.add_argument("--metrics-port", type=int, default=None, help="also serve /metrics on this port")
    p.add_argument("--vocab-dir", default=None, help="folder holding o200k_base.tiktoken (see `dayzero vocab`)")
    p.add_argument("--offline", action="store_true", help="never download the Harmony vocabulary")
    p.add_argument("--log-level", default="info")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    exit_with_parent()
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.max_model_len < 2:
        print("error: --max-model-len must be at least 2", file=sys.stderr)
        return 2

    from dayzero.vocab import VocabError, load_harmony_encoding

    try:
        encoding, resolution = load_harmony_encoding(args.vocab_dir, allow_download=not args.offline)
    except VocabError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    logging.getLogger("dayzero.frontend").info("Harmony vocabulary: %s (%s)", resolution.folder, resolution.source)

    import uvicorn
    from prometheus_client import start_http_server

    from dayzero_frontend.app import create_app
    from dayzero_frontend.harmony import HarmonyChat
    from dayzero_frontend.router_client import RouterClient
    from dayzero_frontend.state import FrontendState
    from dayzero_frontend.validation import Limits

    state = FrontendState(chat=HarmonyChat(encoding), router=RouterClient(args.router),
                          limits=Limits(args.model_name, args.max_model_len), api_key=args.api_key)
    if args.metrics_port:
        start_http_server(args.metrics_port, addr=args.host, registry=state.metrics.registry)
    uvicorn.run(create_app(state), host=args.host, port=args.port, log_level=args.log_level.lower(),
                timeout_graceful_shutdown=5)
    return 0


if __name__ == "__main__":
    sys.exit(main())
