"""Stage planner: scrape the pods, decide per stage, patch the prefill and decode Deployments.

    python -m dayzero_router.planner --config planner.json --namespace NS [--http-port 9101]

The config is the JSON the Helm chart renders into the planner's ConfigMap (camelCase keys as in
values.yaml). The decisions come from `dayzero_router.autoscale` (pure); this module is the loop
around it: discovery and scraping, the Kubernetes patches, and /health and /metrics.
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import signal
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass, fields
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

from dayzero_router.autoscale import (
    DECODE_RUNNING_REQUESTS,
    DecodePolicy,
    Planner,
    PrefillPolicy,
    ScaleDecision,
)
from dayzero_router.autoscale_metrics import MetricsFormatError, PodMetrics, SampleBuilder, parse_metrics
from dayzero_router.planner_kube import ClusterApi, PodRef

log = logging.getLogger("dayzero.planner")


class ConfigError(ValueError):
    """A planner config that does not match what the planner understands."""


@dataclass(frozen=True)
class Target:
    """Pods of one role: the Deployment to scale (if any) and how to find and scrape them."""

    deployment: str
    selector: str
    metrics_port: int


@dataclass(frozen=True)
class PlannerConfig:
    interval_seconds: float
    router: Target
    prefill: Target
    decode: Target
    prefill_policy: PrefillPolicy
    decode_policy: DecodePolicy

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "PlannerConfig":
        _only(d, {"intervalSeconds", "targets", "prefill", "decode"}, "")
        targets = d.get("targets") or {}
        _only(targets, {"router", "prefill", "decode"}, "targets.")
        interval = float(d.get("intervalSeconds", 15))
        if interval <= 0:
            raise ConfigError(f"intervalSeconds must be > 0, got {interval}")
        try:
            cfg = cls(
                interval_seconds=interval,
                router=_build(Target, targets.get("router"), "targets.router"),
                prefill=_build(Target, targets.get("prefill"), "targets.prefill"),
                decode=_build(Target, targets.get("decode"), "targets.decode"),
                prefill_policy=_build(PrefillPolicy, d.get("prefill", {}), "prefill"),
                decode_policy=_build(DecodePolicy, d.get("decode", {}), "decode"),
            )
            cfg.prefill_policy.validate()
            cfg.decode_policy.validate()
        except ValueError as e:
            raise ConfigError(str(e)) from e
        return cfg


def _snake(key: str) -> str:
    return re.sub(r"([A-Z])", r"_\1", key).lower()


def _only(d: Any, allowed: set[str], where: str) -> None:
    if not isinstance(d, dict):
        raise ConfigError(f"{where or 'config'} must be an object")
    unknown = sorted(set(d) - allowed)
    if unknown:
        raise ConfigError(f"unknown planner config key(s): {', '.join(where + k for k in unknown)}")


def _build(kind: type, d: Any, where: str) -> Any:
    if d is None:
        raise ConfigError(f"{where} is missing")
    if not isinstance(d, dict):
        raise ConfigError(f"{where} must be an object")
    names = {f.name for f in fields(kind)}
    _only(d, {k for k in d if _snake(k) in names}, where + ".")
    try:
        return kind(**{_snake(k): v for k, v in d.items()})
    except TypeError as e:
        raise ConfigError(f"{where}: {e}") from e


def fetch_text(url: str, timeout: float = 3.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as resp:  # noqa: S310 (pod IPs, http)
        return resp.read().decode("utf-8")


class PlannerLoop:
    """One tick: discover ready pods, scrape /metrics, decide, set deletion costs, patch replicas.

    `api` is the cluster (KubeClusterApi in production); `fetch` returns a URL's body.
    """

    def __init__(self, cfg: PlannerConfig, api: ClusterApi, fetch: Callable[[str], str] = fetch_text,
                 dry_run: bool = False) -> None:
        self.cfg = cfg
        self.api = api
        self.fetch = fetch
        self.dry_run = dry_run
        self.planner = Planner(cfg.prefill_policy, cfg.decode_policy)
        self.samples = SampleBuilder(cfg.prefill_policy.ttft_quantile, cfg.decode_policy.itl_quantile)
        self.registry = CollectorRegistry()
        self.m_current = Gauge("dayzero_planner_current_replicas", "spec.replicas seen", ["stage"], registry=self.registry)
        self.m_desired = Gauge("dayzero_planner_desired_replicas", "replicas decided", ["stage"], registry=self.registry)
        self.m_scrape_errors = Counter("dayzero_planner_scrape_errors", "failed scrapes", ["role"], registry=self.registry)
        self.m_last_tick = Gauge("dayzero_planner_last_tick_timestamp_seconds", "wall time of the last tick", registry=self.registry)
        self.last_tick_monotonic: float | None = None

    def scrape(self, role: str, target: Target) -> tuple[list[PodRef], list[PodMetrics]]:
        pods = self.api.ready_pods(target.selector)
        out = []
        for pod in pods:
            host = f"[{pod.ip}]" if ":" in pod.ip else pod.ip
            try:
                out.append(parse_metrics(pod.name, self.fetch(f"http://{host}:{target.metrics_port}/metrics")))
            except (OSError, MetricsFormatError) as e:
                self.m_scrape_errors.labels(role).inc()
                log.warning("scrape of %s pod %s failed: %s", role, pod.name, e)
        return pods, out

    def tick(self, now: float) -> tuple[ScaleDecision, ScaleDecision]:
        cfg = self.cfg
        _, router = self.scrape("router", cfg.router)
        _, prefill = self.scrape("prefill", cfg.prefill)
        _, decode = self.scrape("decode", cfg.decode)
        sample = self.samples.build(now, self.api.replicas(cfg.prefill.deployment),
                                    self.api.replicas(cfg.decode.deployment), router, prefill, decode)
        pre, dec = self.planner.step(sample)
        if dec.desired < dec.current and not self.dry_run:
            # The ReplicaSet removes the pods with the lowest cost first: the emptiest ones.
            for pm in decode:
                self.api.set_deletion_cost(pm.pod, int(pm.gauges.get(DECODE_RUNNING_REQUESTS, 0)))
        for d, target in ((pre, cfg.prefill), (dec, cfg.decode)):
            self.m_current.labels(d.stage).set(d.current)
            self.m_desired.labels(d.stage).set(d.desired)
            if d.changed:
                log.info("%s: %d -> %d (%s)%s", d.stage, d.current, d.desired, d.reason,
                         " [dry run]" if self.dry_run else "")
                if not self.dry_run:
                    self.api.scale(target.deployment, d.desired)
        self.m_last_tick.set(time.time())
        self.last_tick_monotonic = time.monotonic()
        return pre, dec

    def healthy(self) -> bool:
        """False when the loop has not ticked for three intervals (stuck or failing)."""
        if self.last_tick_monotonic is None:
            return True
        return time.monotonic() - self.last_tick_monotonic < 3 * self.cfg.interval_seconds + 30

    def run(self, stop: threading.Event) -> None:
        """Main loop: tick every interval until `stop` is set; a failing tick is logged and retried."""
        while not stop.is_set():
            started = time.monotonic()
            try:
                self.tick(started)
            except Exception:  # noqa: BLE001 (API server hiccups must not kill the planner)
                log.exception("planner tick failed")
            stop.wait(max(0.0, self.cfg.interval_seconds - (time.monotonic() - started)))


def serve_http(loop: PlannerLoop, port: int, host: str = "0.0.0.0") -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            if self.path == "/health":
                ok = loop.healthy()
                body, code, ctype = (b"ok\n" if ok else b"stale\n"), (200 if ok else 503), "text/plain"
            elif self.path == "/metrics":
                body, code, ctype = generate_latest(loop.registry), 200, "text/plain; version=0.0.4"
            else:
                body, code, ctype = b"not found\n", 404, "text/plain"
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer((host, port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True, name="planner-http").start()
    return server


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m dayzero_router.planner", description=__doc__.split("\n")[0])
    ap.add_argument("--config", required=True, help="planner JSON (rendered by the Helm chart)")
    ap.add_argument("--namespace", required=True)
    ap.add_argument("--http-port", type=int, default=9101)
    ap.add_argument("--dry-run", action="store_true", help="decide and log, patch nothing")
    ap.add_argument("--once", action="store_true", help="one tick, print the decisions, exit")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        with open(args.config, encoding="utf-8") as f:
            cfg = PlannerConfig.from_dict(json.load(f))
    except (OSError, json.JSONDecodeError, ConfigError) as e:
        print(f"planner: bad config {args.config}: {e}", file=sys.stderr)
        return 2
    from dayzero_router.planner_kube import KubeClusterApi

    loop = PlannerLoop(cfg, KubeClusterApi.from_environment(args.namespace), dry_run=args.dry_run)
    if args.once:
        for d in loop.tick(time.monotonic()):
            print(f"{d.stage}: {d.current} -> {d.desired} ({d.reason})")
        return 0
    server = serve_http(loop, args.http_port)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        loop.run(stop)
    except KeyboardInterrupt:
        pass
    finally:
        server.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
