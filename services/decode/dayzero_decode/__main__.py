"""``python -m dayzero_decode``: a decode worker (gRPC + HTTP health/metrics + registry heartbeat).

The process lifecycle is ``dayzero.serving.worker_main``'s; ``DecodeRole`` adds what is decode's.
"""

from __future__ import annotations

import argparse
import sys

from dayzero.serving.worker_main import WorkerRole, worker_main, worker_parser


def build_parser() -> argparse.ArgumentParser:
    p = worker_parser("decode", default_port=50071)
    p.add_argument("--num-kv-blocks", type=int, default=None, help="full-attention KV blocks (default: engine's)")
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--max-batch", type=int, default=64, help="running sequences per step")
    p.add_argument("--chunk-size", type=int, default=2048, help="tokens per forward pass (local prefill chunk)")
    p.add_argument("--ep", type=int, default=1)
    p.add_argument("--lease-seconds", type=float, default=30.0,
                   help="an allocation whose caller names no lease time is freed after this if its KV never "
                        "lands (the router names one covering its prefill wait); landed KV waits this long for "
                        "its Generate")
    p.add_argument("--kv-wait-seconds", type=float, default=30.0, help="Generate waits this long for the KV")
    p.add_argument("--fault-allocate-delay", type=float, default=0.0,
                   help="testing only: the engine thread stalls this long after each allocation")
    p.add_argument("--kv-drain-seconds", type=float, default=10.0,
                   help="the blocks of a lease released before its KV landed are reused only after its prefill "
                        "worker said it stopped writing, or after this long")
    return p


class DecodeRole(WorkerRole):
    """Decode: a paged KV pool sized by flags, a KV receiver, and the Decode (+ KVTransfer) services."""

    name = "decode"
    grpc_services = ("dayzero.rpc.v1.Decode",)
    parallel_flags = ("tp", "ep")

    def create_metrics(self):
        from dayzero.serving.metrics import DecodeMetrics

        return DecodeMetrics.create()

    def engine_config(self, args):
        from dayzero.runtime.engine import EngineConfig

        return EngineConfig(block_size=args.block_size, num_kv_blocks=args.num_kv_blocks, max_num_seqs=args.max_batch,
                            max_num_batched_tokens=args.chunk_size, max_model_len=args.max_model_len)

    def open_transport(self, args, memory, endpoint):
        from dayzero.transfer import make_receiver

        return make_receiver(args.transport, memory, endpoint=endpoint)

    def start_worker(self, args, engine, receiver, metrics, worker_id):
        from .worker import DecodeWorker

        return DecodeWorker(engine, receiver, metrics, worker_id, args.lease_seconds,
                            drain_seconds=args.kv_drain_seconds,
                            fault_allocate_delay=args.fault_allocate_delay).start()

    def add_servicers(self, server, args, worker, receiver):
        from dayzero.rpc.v1 import decode_pb2_grpc, transfer_pb2_grpc

        from .server import DecodeServicer

        decode_pb2_grpc.add_DecodeServicer_to_server(DecodeServicer(worker, receiver.info(), args.kv_wait_seconds),
                                                     server)
        if args.transport == "grpc":
            transfer_pb2_grpc.add_KVTransferServicer_to_server(receiver.servicer(), server)


def main(argv: list[str] | None = None) -> int:
    return worker_main(DecodeRole(), build_parser(), argv)


if __name__ == "__main__":
    sys.exit(main())
