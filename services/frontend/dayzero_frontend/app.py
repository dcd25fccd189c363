"""The frontend's HTTP application: OpenAI-compatible routes, probes and metrics."""

from __future__ import annotations

import hmac
import json
import logging
from contextlib import asynccontextmanager
from typing import Awaitable, Callable

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import Request

from dayzero_frontend.chat import chat_completions
from dayzero_frontend.completions import completions
from dayzero_frontend.errors import APIError, bad_request
from dayzero_frontend.openai_protocol import ChatCompletionRequest, CompletionRequest, ModelCard, ModelList
from dayzero_frontend.state import FrontendState

log = logging.getLogger("dayzero.frontend")


def describe_validation_error(err: ValidationError) -> tuple[str, str | None]:
    """A short message naming the offending fields (``messages[0].role: Field required``)."""
    parts, first_loc = [], None
    for e in err.errors()[:3]:
        loc = ""
        for item in e["loc"]:
            loc += f"[{item}]" if isinstance(item, int) else (f".{item}" if loc else str(item))
        first_loc = first_loc or loc or None
        parts.append(f"{loc}: {e['msg']}" if loc else e["msg"])
    return "Invalid request: " + "; ".join(parts), first_loc


async def parse_body(request: Request, model: type[BaseModel]) -> BaseModel:
    raw = await request.body()
    try:
        obj = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise bad_request(f"Invalid JSON body: {e}", code="invalid_json") from e
    if not isinstance(obj, dict):
        raise bad_request("The request body must be a JSON object", code="invalid_json")
    try:
        return model.model_validate(obj)
    except ValidationError as e:
        message, loc = describe_validation_error(e)
        raise bad_request(message, param=loc) from e


def create_app(state: FrontendState) -> FastAPI:
    @asynccontextmanager
    async def lifespan(_app: FastAPI):
        await state.router.start()
        try:
            yield
        finally:
            await state.router.close()

    app = FastAPI(title="dayzero frontend", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.frontend = state
    metrics = state.metrics

    def authorize(request: Request) -> None:
        if not state.api_key:
            return
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), state.api_key.encode()):
            raise APIError(401, "Invalid or missing API key: send `Authorization: Bearer <key>`.",
                           code="invalid_api_key")

    async def serve(endpoint: str, request: Request, handler: Callable[[], Awaitable[Response]]) -> Response:
        metrics.inflight.inc()
        try:
            authorize(request)
            response = await handler()
        except APIError as e:
            response = e.response()
        except Exception:  # noqa: BLE001 - a frontend bug: still an OpenAI error body
            log.exception("unhandled error on %s", endpoint)
            response = APIError(500, "internal error in the frontend").response()
        finally:
            metrics.inflight.dec()
        metrics.requests.labels(endpoint=endpoint, status=str(response.status_code)).inc()
        return response

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return APIError(exc.status_code, str(exc.detail)).response()

    @app.exception_handler(RequestValidationError)
    async def validation_error(_request: Request, exc: RequestValidationError) -> JSONResponse:
        return bad_request(f"Invalid request: {exc.errors()[:3]}").response()

    @app.get("/health")
    async def health() -> dict:
        return {"status": "ok"}

    @app.get("/ready")
    async def ready() -> JSONResponse:
        ok, detail = await state.router.ready()
        return JSONResponse({"ready": ok, "detail": detail}, status_code=200 if ok else 503)

    @app.get("/metrics")
    async def prometheus() -> Response:
        return Response(metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.get("/v1/models")
    async def models(request: Request) -> Response:
        async def handler() -> Response:
            card = ModelCard(id=state.limits.model_name, max_model_len=state.limits.max_model_len)
            return JSONResponse(ModelList(data=[card]).model_dump())

        return await serve("models", request, handler)

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        async def handler() -> Response:
            req = await parse_body(request, ChatCompletionRequest)
            return await chat_completions(state, request, req)

        return await serve("chat", request, handler)

    @app.post("/v1/completions")
    async def text(request: Request) -> Response:
        async def handler() -> Response:
            req = await parse_body(request, CompletionRequest)
            return await completions(state, request, req)

        return await serve("completions", request, handler)

    return app
