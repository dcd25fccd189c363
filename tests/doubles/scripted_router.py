"""TEST DOUBLE of the router: a real gRPC server (proto Router.Generate + grpc.health.v1) that
answers from scripts of token ids instead of a model.

Run: ``python tests/doubles/scripted_router.py [--grpc-port 0] [--http-port 0]``; it prints
``READY grpc=PORT http=PORT`` once both ports listen. A small HTTP control API drives it:

- ``POST /script`` ``{"scripts": [SCRIPT, ...]}`` queues scripts; each Generate call takes the next.
- ``POST /reset`` drops queued scripts and recorded requests.
- ``GET /requests`` what each call received and what became of it (sent ids, cancelled, ...).

SCRIPT (JSON): ``chunks`` (list of token-id lists, one GenerateResponse each), optional ``finish``
("stop" | "length" | "abort", used when the chunks run out; default "length"), ``error``
(``{"code": "RESOURCE_EXHAUSTED", "message": "...", "after_chunks": 0}``), ``hang`` (after the
chunks, wait until cancelled), ``ignore_stop`` (keep sending after a stop id, like a broken
router), ``delay_s`` (between chunks). Like a real router it honours ``sampling.max_tokens``
(finish "length") and ``sampling.stop_token_ids`` (finish "stop", the stop id included).
With ``logprobs`` requested it sends logprob ``-(id % 97) / 8`` and top alternatives ``id+1..id+k``
(arbitrary but reproducible, recorded in ``sent_logprobs``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import threading
from dataclasses import asdict, dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import grpc
from google.protobuf.json_format import MessageToDict
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from dayzero.rpc.v1 import common_pb2, router_pb2, router_pb2_grpc

FINISH = {"stop": common_pb2.FINISH_REASON_STOP, "length": common_pb2.FINISH_REASON_LENGTH,
          "abort": common_pb2.FINISH_REASON_ABORT}


@dataclass
class Record:
    request_id: str
    prompt_token_ids: list[int]
    sampling: dict
    sent: list[int] = field(default_factory=list)
    sent_logprobs: list[dict] = field(default_factory=list)
    finish: str | None = None
    error: str | None = None
    cancelled: bool = False
    done: bool = False


class Scripts:
    """Queued scripts and recorded calls, shared by the gRPC loop and the HTTP thread."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.queue: list[dict] = []
        self.records: list[Record] = []

    def take(self, record: Record) -> dict | None:
        with self.lock:
            self.records.append(record)
            return self.queue.pop(0) if self.queue else None


def fake_logprob(token_id: int, top: int) -> common_pb2.TokenLogprob:
    lp = common_pb2.TokenLogprob(token_id=token_id, logprob=-(token_id % 97) / 8)
    for k in range(top):
        lp.top.append(common_pb2.TopLogprob(token_id=token_id + 1 + k, logprob=-(token_id % 97) / 8 - (k + 1)))
    return lp


class ScriptedRouter(router_pb2_grpc.RouterServicer):
    def __init__(self, scripts: Scripts):
        self.scripts = scripts

    async def Generate(self, request, context):  # noqa: N802 - gRPC method name
        s = request.sampling
        record = Record(request.request_id, list(request.prompt_token_ids),
                        MessageToDict(s, preserving_proto_field_name=True))
        script = self.scripts.take(record)
        try:
            if script is None:
                record.error = "FAILED_PRECONDITION"
                await context.abort(grpc.StatusCode.FAILED_PRECONDITION, "scripted router: no script queued")
            await self._play(script, request, context, record)
        except asyncio.CancelledError:
            record.cancelled = True
            raise
        finally:
            record.done = True

    async def _play(self, script: dict, request, context, record: Record) -> None:
        s = request.sampling
        stops = set(s.stop_token_ids)
        error = script.get("error")
        chunks = script.get("chunks", [])
        first = True
        for n, chunk in enumerate(chunks):
            if error and error.get("after_chunks", 0) == n:
                record.error = error["code"]
                await context.abort(getattr(grpc.StatusCode, error["code"]), error.get("message", "scripted error"))
            out, finish = [], common_pb2.FINISH_REASON_UNSPECIFIED
            for tok in chunk:
                out.append(tok)
                if tok in stops and not script.get("ignore_stop"):
                    finish = common_pb2.FINISH_REASON_STOP
                    break
                if len(record.sent) + len(out) >= s.max_tokens > 0:
                    finish = common_pb2.FINISH_REASON_LENGTH
                    break
            last = finish != common_pb2.FINISH_REASON_UNSPECIFIED or (
                n == len(chunks) - 1 and not script.get("hang") and not error)
            if last and finish == common_pb2.FINISH_REASON_UNSPECIFIED:
                finish = FINISH[script.get("finish", "length")]
            await self._send(context, request, record, out, finish, first)
            first = False
            if last:
                return
            if script.get("delay_s"):
                await asyncio.sleep(script["delay_s"])
        if error:
            record.error = error["code"]
            await context.abort(getattr(grpc.StatusCode, error["code"]), error.get("message", "scripted error"))
        if script.get("hang"):
            await asyncio.Event().wait()  # until the caller cancels
        if not chunks:
            await self._send(context, request, record, [], FINISH[script.get("finish", "length")], first)

    async def _send(self, context, request, record: Record, ids: list[int], finish: int, first: bool) -> None:
        s = request.sampling
        resp = router_pb2.GenerateResponse(request_id=request.request_id, token_ids=ids, finish_reason=finish)
        if first:
            resp.prompt_tokens = len(request.prompt_token_ids)
            resp.route = "scripted"
        if s.logprobs:
            for tok in ids:
                lp = fake_logprob(tok, s.top_logprobs)
                resp.logprobs.append(lp)
                record.sent_logprobs.append(MessageToDict(lp, preserving_proto_field_name=True))
        record.sent.extend(ids)
        if finish != common_pb2.FINISH_REASON_UNSPECIFIED:
            record.finish = common_pb2.FinishReason.Name(finish)
        await context.write(resp)


def control_server(scripts: Scripts, port: int) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:
            pass

        def _reply(self, code: int, obj) -> None:
            data = json.dumps(obj).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:  # noqa: N802
            if self.path == "/requests":
                with scripts.lock:
                    self._reply(200, [asdict(r) for r in scripts.records])
            elif self.path == "/health":
                self._reply(200, {"status": "ok"})
            else:
                self._reply(404, {"error": self.path})

        def do_POST(self) -> None:  # noqa: N802
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
            with scripts.lock:
                if self.path == "/script":
                    scripts.queue.extend(body["scripts"])
                elif self.path == "/reset":
                    scripts.queue.clear()
                    scripts.records.clear()
                else:
                    return self._reply(404, {"error": self.path})
            self._reply(200, {"queued": len(scripts.queue)})

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


async def serve(grpc_port: int, http_port: int) -> None:
    scripts = Scripts()
    server = grpc.aio.server()
    router_pb2_grpc.add_RouterServicer_to_server(ScriptedRouter(scripts), server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    bound = server.add_insecure_port(f"127.0.0.1:{grpc_port}")
    await server.start()
    await health_servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    control = control_server(scripts, http_port)
    print(f"READY grpc={bound} http={control.server_address[1]}", flush=True)
    await server.wait_for_termination()


def main() -> int:
    p = argparse.ArgumentParser(description="scripted router test double")
    p.add_argument("--grpc-port", type=int, default=0)
    p.add_argument("--http-port", type=int, default=0)
    args = p.parse_args()
    asyncio.run(serve(args.grpc_port, args.http_port))
    return 0


if __name__ == "__main__":
    sys.exit(main())
