"""The HTTP side of every gRPC service: ``/health`` (alive), ``/ready`` (serving), ``/metrics``."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST


class HealthServer:
    """Serves the three endpoints (plus ``extra`` JSON ones) on a daemon thread; ``ready()`` returns (ok, reason)."""

    def __init__(self, host: str, port: int, registry: CollectorRegistry, ready: Callable[[], tuple[bool, str]],
                 service: str, extra: dict[str, Callable[[], object]] | None = None):
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, fmt, *args):  # quiet: probes hit these every few seconds
                pass

            def _send(self, code: int, body: bytes, ctype: str = "application/json") -> None:
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):  # noqa: N802 - http.server naming
                path = self.path.split("?", 1)[0]
                if path == "/health":
                    self._send(200, json.dumps({"status": "ok", "service": outer.service}).encode())
                elif path == "/ready":
                    ok, reason = outer.ready()
                    body = {"status": "ready" if ok else "not ready", "service": outer.service, "reason": reason}
                    self._send(200 if ok else 503, json.dumps(body).encode())
                elif path == "/metrics":
                    self._send(200, generate_latest(outer.registry), CONTENT_TYPE_LATEST)
                elif path in outer.extra:
                    self._send(200, json.dumps(outer.extra[path]()).encode())
                else:
                    self._send(404, json.dumps({"error": f"no route {path}"}).encode())

        self.service = service
        self.extra = extra or {}
        self.registry = registry
        self.ready = ready
        self.httpd = ThreadingHTTPServer((host, port), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self._thread = threading.Thread(target=self.httpd.serve_forever, name=f"{service}-http", daemon=True)

    def start(self) -> "HealthServer":
        self._thread.start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
