"""``dayzero serve``: the whole stack on this machine (frontend, router, one prefill and one decode
worker, plus a local redis-server when one is installed, else the router's in-process registry).

    dayzero serve [--model DIR] [--port 8000] [--host 127.0.0.1] [--transport nixl|grpc]

Without ``--model`` it serves the tiny random checkpoint, written on first run into the cache
directory (``$DAYZERO_CACHE`` or ``~/.cache/dayzero``). Ctrl-C or SIGTERM stops every child; if a
child dies, the rest are stopped and the command exits non-zero.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
import time

log = logging.getLogger("dayzero.serve")


def cache_dir() -> str:
    return os.environ.get("DAYZERO_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "dayzero")


def tiny_checkpoint(root: str) -> str:
    """The tiny random checkpoint under ``root``, written once (atomically) on first use."""
    path = os.path.join(root, "tiny-random-seed0")
    if os.path.exists(os.path.join(path, ".complete")):
        return path
    from dayzero.config import preset
    from dayzero.weights.random_checkpoint import write_random_checkpoint

    log.info("first run: writing the tiny random checkpoint to %s", path)
    tmp = f"{path}.tmp-{os.getpid()}"
    write_random_checkpoint(preset("tiny"), tmp, seed=0)
    open(os.path.join(tmp, ".complete"), "w").close()
    try:
        os.replace(tmp, path)
    except OSError:  # another process won the race
        import shutil
        shutil.rmtree(tmp, ignore_errors=True)
    return path


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None, help="checkpoint directory (default: the tiny random model)")
    p.add_argument("--port", type=int, default=8000, help="frontend HTTP port")
    p.add_argument("--host", default="127.0.0.1", help="address every service binds")
    p.add_argument("--transport", choices=("nixl", "grpc"), default="nixl",
                   help="KV transport between prefill and decode (grpc = byte-stream fallback)")
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--disagg-threshold", type=int, default=256,
                   help="prompts shorter than this are prefilled on the decode worker")
    p.add_argument("--no-redis", action="store_true", help="use the router's in-process registry")
    p.add_argument("--log-dir", default=None,
                   help="service logs (default: a temporary folder, removed after a clean stop)")
    p.add_argument("--max-model-len", type=int, default=8192)


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s serve %(levelname)s: %(message)s")
    from dayzero.serving.launch import Interrupted, ProcessFailed, redis_server_binary
    from dayzero.serving.stack import LocalStack, StackConfig

    if args.transport == "nixl":
        from dayzero.transfer import TransferError
        from dayzero.transfer.nixl import _nixl_api
        try:
            _nixl_api()
        except TransferError as e:
            print(f"dayzero serve: error: {e}", file=sys.stderr)
            return 2
    t0 = time.monotonic()
    model = args.model or tiny_checkpoint(cache_dir())
    if not os.path.exists(os.path.join(model, "config.json")):
        print(f"dayzero serve: error: {model} has no config.json (not a checkpoint directory)", file=sys.stderr)
        return 2
    use_redis = False if args.no_redis else redis_server_binary() is not None
    if not args.no_redis and not use_redis:
        log.info("redis-server is not installed: using the router's in-process registry")
    mml = ["--max-model-len", str(args.max_model_len)]
    config = StackConfig(model_dir=model, host=args.host, frontend_port=args.port, transport=args.transport,
                         block_size=args.block_size, disagg_threshold=args.disagg_threshold, use_redis=use_redis,
                         prefill_args=mml, decode_args=mml, frontend_args=["--max-model-len", str(args.max_model_len)],
                         log_dir=args.log_dir)
    stack = LocalStack(config)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    log.info("starting frontend, router, prefill and decode (%s registry); logs in %s",
             "redis-server" if use_redis else "in-process", stack.log_dir)
    try:
        stack.start(stop)  # a signal during start-up (a model loading for minutes) stops it at once
    except Interrupted:
        log.info("stopped before the stack was ready; every service stopped")
        return 0
    except ProcessFailed as e:
        print(f"dayzero serve: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        stack.stop()
        return 130
    log.info("router: grpc %s, http %d", stack.router_address, stack.router.http_port)
    for name, svc in stack.workers.items():
        log.info("%s: grpc %s:%d, http %d", name, args.host, svc.grpc_port, svc.http_port)
    log.info("ready in %.1fs: http://%s:%d/v1/chat/completions (model %s)", time.monotonic() - t0, args.host,
             args.port, model)
    rc = 0
    while not stop.wait(0.5):
        dead = stack.dead()
        if dead:
            log.error("%s exited (code %s); stopping the stack. Last log lines:\n%s", dead[0].name,
                      dead[0].proc.returncode, dead[0].log_tail())
            rc = 1
            break
    log.info("stopping every service")
    stack.stop()
    if args.log_dir is None and rc == 0:  # our temporary log folder; kept when something failed
        import shutil
        shutil.rmtree(stack.log_dir, ignore_errors=True)
    return rc
