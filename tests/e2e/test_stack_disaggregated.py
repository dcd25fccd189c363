"""The whole stack as real processes on the tiny model: redis-server, router, one prefill and one
decode worker (KV over NIXL on host memory), and the OpenAI frontend.

- greedy output through the stack equals the single-process engine token for token, for 20
  prompts of 1..600 tokens; short prompts take the local route, long ones the NIXL route;
- 32 concurrent streams complete, after which every worker holds 0 KV blocks;
- the official openai client gets a chat completion (stream and not) through the frontend.
"""

from __future__ import annotations

import concurrent.futures
import time

import pytest

import stack_harness as sh
from dayzero.rpc.v1 import common_pb2, router_pb2, worker_pb2

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

THRESHOLD = 64          # prompts with fewer tokens are prefilled on the decode worker
MAX_MODEL_LEN = 4096
LENGTHS = [1, 2, 3, 7, 15, 16, 17, 31, 33, 63, 64, 65, 100, 128, 129, 200, 257, 333, 480, 600]


@pytest.fixture(scope="module")
def ckpt(make_ckpt):
    return make_ckpt("tiny")


@pytest.fixture(scope="module")
def stack(ckpt, tmp_path_factory):
    s = sh.start_stack(ckpt, tmp_path_factory.mktemp("stack"), threshold=THRESHOLD, max_model_len=MAX_MODEL_LEN,
                       prefill_args=["--chunk-size", "256"], decode_args=["--num-kv-blocks", "1024"])
    yield s
    s.stop()


def _generate(router, rid: str, prompt: list[int], max_tokens: int, timeout: float = 120):
    msgs = list(router.Generate(router_pb2.GenerateRequest(
        request_id=rid, prompt_token_ids=prompt,
        sampling=common_pb2.SamplingParams(max_tokens=max_tokens, ignore_eos=True)), timeout=timeout))
    tokens = [t for m in msgs for t in m.token_ids]
    return tokens, msgs


def _loads(stack) -> dict[str, worker_pb2.WorkerLoad]:
    return {name: sh.worker_load(stack, name) for name in stack.workers}


def _wait_all_free(stack, timeout: float = 20.0) -> dict[str, worker_pb2.WorkerLoad]:
    deadline = time.monotonic() + timeout
    while True:
        loads = _loads(stack)
        if sh.all_free(loads.values()):
            return loads
        if time.monotonic() > deadline:
            return loads
        time.sleep(0.05)


def test_greedy_matches_single_process_engine_on_both_routes(stack, router, ckpt):
    from dayzero.runtime.engine import Engine, EngineConfig
    from dayzero.runtime.sampling import SamplingParams

    max_tokens = 4
    prompts = [sh.random_prompt(n, seed=n) for n in LENGTHS]
    got, routes = [], []
    for i, p in enumerate(prompts):
        tokens, msgs = _generate(router, f"eq-{i}", p, max_tokens)
        got.append(tokens)
        routes.append(msgs[0].route)
        assert msgs[0].prompt_tokens == len(p)
        assert all(m.request_id == f"eq-{i}" for m in msgs)
        assert msgs[-1].finish_reason == common_pb2.FINISH_REASON_LENGTH
    engine = Engine.from_dir(ckpt, config=EngineConfig(block_size=16, max_num_seqs=1, max_model_len=MAX_MODEL_LEN),
                             max_positions=MAX_MODEL_LEN)
    want = [engine.generate([p], SamplingParams(max_tokens=max_tokens, ignore_eos=True))[0] for p in prompts]
    for n, r, g, w in zip(LENGTHS, routes, got, want):
        assert r == ("local" if n < THRESHOLD else "disaggregated"), n
        assert g == w, f"prompt of {n} tokens via {r}: {g} != engine {w}"
    assert routes.count("disaggregated") >= 8 and routes.count("local") >= 8
    # exactly the prompt's blocks travelled: every full-attention block, and for sliding layers only
    # the ring blocks of the last window (the prefill worker sends them in several writes)
    spec = engine.kv.spec
    expected = 0
    for n in LENGTHS:
        if n >= THRESHOLD:
            nblk = -(-n // spec.block_size)
            first_ring = max(0, n - spec.window) // spec.block_size
            blocks = len(spec.full_layers) * nblk + len(spec.sliding_layers) * (nblk - first_ring)
            expected += 2 * blocks * spec.block_nbytes
    metrics = _metrics(stack, "prefill-0")
    assert _metric_value(metrics, 'dayzero_kv_transfer_bytes_total{transport="nixl"}') == expected


def _metrics(stack, name: str) -> str:
    import urllib.request

    svc = stack.workers[name] if name in stack.workers else stack.router
    with urllib.request.urlopen(f"http://127.0.0.1:{svc.http_port}/metrics", timeout=5) as r:
        return r.read().decode()


def _metric_value(text: str, series: str) -> float:
    for line in text.splitlines():
        if line.startswith(series + " "):
            return float(line.split()[-1])
    raise AssertionError(f"{series} not in /metrics")


def test_32_concurrent_streams_complete_and_free_every_block(stack, router):
    n = 32
    lengths = [5 + (i * 37) % 250 for i in range(n)]  # both routes

    def one(i: int):
        tokens, msgs = _generate(router, f"conc-{i}", sh.random_prompt(lengths[i], seed=1000 + i), max_tokens=6, timeout=300)
        return len(tokens), msgs[0].route, msgs[-1].finish_reason

    with concurrent.futures.ThreadPoolExecutor(n) as pool:
        results = list(pool.map(one, range(n)))
    assert all(r == (6, "local" if lengths[i] < THRESHOLD else "disaggregated", common_pb2.FINISH_REASON_LENGTH)
               for i, r in enumerate(results)), results
    loads = _wait_all_free(stack)
    for name, load in loads.items():
        assert load.kv_blocks_used == 0 and load.open_leases == 0, (name, load)
    text = _metrics(stack, "router")
    assert _metric_value(text, 'dayzero_router_requests_total{outcome="length",route="disaggregated"}') >= 1
    assert "dayzero_router_time_to_first_token_seconds_bucket" in text
    assert "dayzero_decode_kv_blocks_used 0.0" in _metrics(stack, "decode-0")


def test_openai_client_chat_completion_through_the_frontend(stack):
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=stack.frontend_url + "/v1", api_key="unused", max_retries=0, timeout=120)
    resp = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "Hello"}],
                                          max_tokens=8)
    choice = resp.choices[0]
    assert choice.finish_reason in ("stop", "length")
    assert resp.usage.completion_tokens >= 1 and resp.usage.prompt_tokens > 0
    chunks = list(client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "Hi"}],
                                                 max_tokens=8, stream=True))
    assert chunks and chunks[-1].choices[-1].finish_reason in ("stop", "length")
