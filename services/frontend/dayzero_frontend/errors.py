"""OpenAI-style API errors and the gRPC status -> HTTP status mapping."""

from __future__ import annotations

import grpc
from fastapi.responses import JSONResponse

from dayzero_frontend.openai_protocol import ErrorBody, ErrorResponse

_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
          503: "service_unavailable", 504: "timeout"}

# Router status codes (proto/dayzero/rpc/v1/router.proto) -> HTTP status.
GRPC_TO_HTTP = {
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.OUT_OF_RANGE: 400,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 503,
    grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.DEADLINE_EXCEEDED: 504,
    grpc.StatusCode.CANCELLED: 503,
}


class APIError(Exception):
    """An error the client sees as ``{"error": {...}}`` with an HTTP status."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 type_: str | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.type = type_ or _TYPES.get(status, "invalid_request_error" if status < 500 else "server_error")

    def body(self) -> ErrorResponse:
        return ErrorResponse(error=ErrorBody(message=self.message, type=self.type, param=self.param, code=self.code))

    def response(self) -> JSONResponse:
        headers = {"WWW-Authenticate": "Bearer"} if self.status == 401 else None
        return JSONResponse(self.body().model_dump(), status_code=self.status, headers=headers)


def bad_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, param=param, code=code)


def from_grpc(code: grpc.StatusCode, details: str | None) -> APIError:
    """The router's failure as the client should see it."""
    status = GRPC_TO_HTTP.get(code, 502)  # anything else: the router failed, not the frontend
    name = code.name.lower() if code is not None else "unknown"
    return APIError(status, f"router: {details or name}", code=name,
                    type_="upstream_error" if status == 502 else None)
