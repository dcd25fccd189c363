"""The real stack for the e2e suites that drive it (test_stack_disaggregated, test_faults_stack):
redis-server, the router, prefill and decode workers (KV over NIXL on host memory) and the OpenAI
frontend as real processes on the tiny random model, plus the small probes those suites share.
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager

import grpc
import pytest

from dayzero.config import preset
from dayzero.rpc.v1 import router_pb2_grpc, worker_pb2, worker_pb2_grpc
from dayzero.serving.launch import redis_server_binary
from dayzero.serving.stack import LocalStack, StackConfig

MODEL_NAME = "tiny"                     # the model id the frontend serves
VOCAB = preset(MODEL_NAME).vocab_size


def start_stack(model_dir: str, log_dir, *, threshold: int, max_model_len: int, prefill_args: Sequence[str] = (),
                decode_args: Sequence[str] = (), router_args: Sequence[str] = (),
                with_frontend: bool = True) -> LocalStack:
    """A started stack with redis-server (the test fails without one), NIXL, and (unless
    ``with_frontend`` is False) a frontend that serves ``MODEL_NAME`` offline from a vocabulary
    rebuilt into ``log_dir``. ``max_model_len`` goes to the workers and the frontend; prompts under
    ``threshold`` tokens stay on decode."""
    if redis_server_binary() is None:
        pytest.fail("redis-server is not installed (scripts/test installs it; apt-get install redis-server)")
    mml = ["--max-model-len", str(max_model_len)]
    frontend_args: list[str] = []
    if with_frontend:
        from dayzero.vocab import resolve_vocab

        vocab = resolve_vocab(cache_dir=log_dir, allow_download=False).folder
        frontend_args = ["--vocab-dir", str(vocab), "--offline", "--model-name", MODEL_NAME, *mml]
    config = StackConfig(model_dir=model_dir, transport="nixl", disagg_threshold=threshold, use_redis=True,
                         prefill_args=[*mml, *prefill_args], decode_args=[*mml, *decode_args],
                         router_args=list(router_args), with_frontend=with_frontend, frontend_args=frontend_args,
                         log_dir=str(log_dir))
    return LocalStack(config).start()


@contextmanager
def router_stub(stack: LocalStack) -> Iterator[router_pb2_grpc.RouterStub]:
    """A Router client on the stack's router, its channel closed on exit."""
    channel = grpc.insecure_channel(stack.router_address)
    try:
        yield router_pb2_grpc.RouterStub(channel)
    finally:
        channel.close()


@contextmanager
def worker_channel(stack: LocalStack, name: str) -> Iterator[grpc.Channel]:
    """A channel to the stack's worker ``name`` (e.g. "decode-0"), closed on exit: wrap it in
    ``decode_pb2_grpc.DecodeStub`` or ``prefill_pb2_grpc.PrefillStub`` to call it directly."""
    channel = grpc.insecure_channel(f"127.0.0.1:{stack.workers[name].grpc_port}")
    try:
        yield channel
    finally:
        channel.close()


def wait_until(cond, timeout: float, what: str):
    """Poll ``cond()`` until it is truthy (returned) or ``timeout`` seconds pass (AssertionError)."""
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.03)


def random_prompt(n: int, seed: int) -> list[int]:
    """``n`` token ids drawn uniformly from the tiny model's vocabulary."""
    rng = random.Random(seed)
    return [rng.randrange(VOCAB) for _ in range(n)]


def worker_load(stack: LocalStack, name: str) -> worker_pb2.WorkerLoad:
    """Worker.GetLoad of the stack's worker ``name`` (e.g. "prefill-0", "decode-0")."""
    with grpc.insecure_channel(f"127.0.0.1:{stack.workers[name].grpc_port}") as ch:
        return worker_pb2_grpc.WorkerStub(ch).GetLoad(worker_pb2.LoadRequest(), timeout=5)


def all_free(loads: Iterable[worker_pb2.WorkerLoad]) -> bool:
    """No KV block held, no lease open, no request running on any of these workers."""
    return all(l.kv_blocks_used == 0 and l.open_leases == 0 and l.running_requests == 0 for l in loads)
