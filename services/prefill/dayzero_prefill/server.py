"""gRPC face of the prefill worker: the Prefill service (Worker.GetLoad and grpc.health.v1 come from
``dayzero.serving.worker_main``)."""

from __future__ import annotations

import asyncio
import logging

import grpc

from dayzero.rpc.v1 import prefill_pb2_grpc
from dayzero.serving.protocol import sampling_from_proto
from dayzero.transfer import IncompatiblePeer, TransferError

from .worker import Cancelled, Job, LeaseExpired, PrefillWorker, QueueFull

log = logging.getLogger(__name__)


class PrefillServicer(prefill_pb2_grpc.PrefillServicer):
    def __init__(self, worker: PrefillWorker):
        self.worker = worker

    async def _refuse(self, request, context, code: grpc.StatusCode, message: str) -> None:
        """Refuse a call before it reaches the engine thread (which writes nothing for it)."""
        if request.target.lease_id:
            await asyncio.to_thread(self.worker.stopped, request)  # may connect to the peer: off the loop
        await context.abort(code, message)

    async def Prefill(self, request, context):
        """Every call handed a lease ends with the KV landed or with a 'stopped' notice to the
        decode worker, sent once the call's writes are over (the engine thread sends it for the
        jobs it ran, this method for the ones it refused or took back from the queue)."""
        m = self.worker.metrics
        if not request.request_id or not request.prompt_token_ids:
            await self._refuse(request, context, grpc.StatusCode.INVALID_ARGUMENT,
                               "request_id and prompt_token_ids are required")
        if not request.target.lease_id or not request.receiver.transport:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "target allocation and receiver are required")
        try:
            params = sampling_from_proto(request.sampling)
        except ValueError as e:
            await self._refuse(request, context, grpc.StatusCode.INVALID_ARGUMENT, str(e))
        job = Job(request, params)
        try:
            self.worker.submit(job)
        except QueueFull as e:
            m.requests.labels("rejected").inc()
            await self._refuse(request, context, grpc.StatusCode.RESOURCE_EXHAUSTED, str(e))
        try:
            resp = await asyncio.wrap_future(job.result)
        except asyncio.CancelledError:
            job.cancelled.set()  # the caller went away: the engine thread stops between chunks
            if job.result.cancel():  # still queued: it will never run, nothing was written
                asyncio.get_running_loop().run_in_executor(None, self.worker.stopped, request)
            m.requests.labels("cancelled").inc()
            raise
        except Cancelled:
            m.requests.labels("cancelled").inc()
            await context.abort(grpc.StatusCode.CANCELLED, "prefill cancelled")
        except LeaseExpired as e:
            m.requests.labels("lease_expired").inc()
            await context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, str(e))
        except IncompatiblePeer as e:
            m.requests.labels("incompatible").inc()
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(e))
        except TransferError as e:
            m.requests.labels("transfer_failed").inc()
            code = grpc.StatusCode.FAILED_PRECONDITION if "--transport" in str(e) else grpc.StatusCode.UNAVAILABLE
            await context.abort(code, f"KV transfer failed: {e}")
        except ValueError as e:
            m.requests.labels("invalid").inc()
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        except Exception as e:  # noqa: BLE001 - never leave the caller hanging
            log.exception("prefill %s failed", request.request_id)
            m.requests.labels("error").inc()
            await context.abort(grpc.StatusCode.INTERNAL, f"prefill failed: {type(e).__name__}: {e}")
        m.requests.labels("ok").inc()
        return resp
