"""``python -m dayzero_prefill``: a prefill worker (gRPC + HTTP health/metrics + registry heartbeat).

The process lifecycle is ``dayzero.serving.worker_main``'s; ``PrefillRole`` adds what is prefill's.
"""

from __future__ import annotations

import argparse
import sys

from dayzero.serving.worker_main import WorkerRole, worker_main, worker_parser


def build_parser() -> argparse.ArgumentParser:
    p = worker_parser("prefill", default_port=50061)
    p.add_argument("--block-size", type=int, default=16, help="must equal the decode workers' block size")
    p.add_argument("--chunk-size", type=int, default=2048, help="prefill chunk (tokens per forward pass)")
    p.add_argument("--max-queued-tokens", type=int, default=1 << 20, help="backpressure: refuse beyond this")
    p.add_argument("--transfer-timeout", type=float, default=30.0)
    p.add_argument("--fault-chunk-delay", type=float, default=0.0, help=argparse.SUPPRESS)  # tests: sleep per chunk
    return p


class PrefillRole(WorkerRole):
    """Prefill: KV for one full-length sequence at a time, a KV sender, and the Prefill service."""

    name = "prefill"
    grpc_services = ("dayzero.rpc.v1.Prefill",)

    def create_metrics(self):
        from dayzero.serving.metrics import PrefillMetrics

        return PrefillMetrics.create()

    def engine_config(self, args):
        from dayzero.runtime.engine import EngineConfig

        blocks = -(-args.max_model_len // args.block_size) + 1  # batch 1: one full-length sequence
        return EngineConfig(block_size=args.block_size, num_kv_blocks=blocks, max_num_seqs=1,
                            max_num_batched_tokens=args.chunk_size, max_model_len=args.max_model_len, max_kv_seqs=2,
                            cuda_graphs=False)  # prefill only: no decode steps to replay

    def open_transport(self, args, memory, endpoint):
        from dayzero.transfer import make_sender

        return make_sender(args.transport, memory)

    def start_worker(self, args, engine, sender, metrics, worker_id):
        from .worker import PrefillWorker

        return PrefillWorker(engine, sender, metrics, worker_id, args.max_queued_tokens, args.transfer_timeout,
                             args.fault_chunk_delay).start()

    def add_servicers(self, server, args, worker, sender):
        from dayzero.rpc.v1 import prefill_pb2_grpc

        from .server import PrefillServicer

        prefill_pb2_grpc.add_PrefillServicer_to_server(PrefillServicer(worker), server)


def main(argv: list[str] | None = None) -> int:
    return worker_main(PrefillRole(), build_parser(), argv)


if __name__ == "__main__":
    sys.exit(main())
