"""The planner loop around the pure logic: real HTTP scrapes of prometheus_client exporters on
loopback addresses, the kubernetes-client adapter against a loopback API server, the config
loader, /health and /metrics."""

from __future__ import annotations

import json
import threading
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from prometheus_client import CollectorRegistry, Gauge, Histogram, start_http_server

from dayzero_router.autoscale import (
    DECODE_KV_BLOCKS_TOTAL,
    DECODE_KV_BLOCKS_USED,
    DECODE_MAX_BATCH,
    DECODE_RUNNING_REQUESTS,
    PREFILL_COMPUTE_SECONDS,
    PREFILL_QUEUED_TOKENS,
    ROUTER_TTFT_SECONDS,
)
from dayzero_router.planner import ConfigError, PlannerConfig, PlannerLoop, main, serve_http
from dayzero_router.planner_kube import DELETION_COST_ANNOTATION, KubeClusterApi, PodRef
from dayzero.serving.launch import free_port

SEL = "app.kubernetes.io/instance=dz,app.kubernetes.io/component="


def config(port: int, **decode) -> dict:
    return {
        "intervalSeconds": 15,
        "targets": {c: {"deployment": f"dz-{c}", "selector": SEL + c, "metricsPort": port}
                    for c in ("router", "prefill", "decode")},
        "prefill": {"minReplicas": 1, "maxReplicas": 4, "targetTtftSeconds": 2.0},
        "decode": {"minReplicas": 1, "maxReplicas": 4, "scaleDownCooldownSeconds": 0,
                   "scaleDownStabilizationSeconds": 0, **decode},
    }


class InMemoryCluster:
    """Test double of the ClusterApi seam (the real adapter is tested against an API server below)."""

    def __init__(self, pods: dict[str, list[PodRef]], replicas: dict[str, int]):
        self.pods = pods
        self.replica_counts = replicas
        self.calls: list[tuple] = []

    def ready_pods(self, selector: str) -> list[PodRef]:
        return self.pods[selector.rsplit("=", 1)[1]]

    def replicas(self, deployment: str) -> int:
        return self.replica_counts[deployment]

    def scale(self, deployment: str, replicas: int) -> None:
        self.calls.append(("scale", deployment, replicas))
        self.replica_counts[deployment] = replicas

    def set_deletion_cost(self, pod: str, cost: int) -> None:
        self.calls.append(("cost", pod, cost))


@pytest.fixture
def exporters():
    """Five pods' /metrics on 127.0.0.2-6, one port: router, two prefill, two decode."""
    port = free_port()
    regs = {name: CollectorRegistry() for name in ("r0", "p0", "p1", "d0", "d1")}
    servers = []
    for i, (name, reg) in enumerate(regs.items()):
        try:
            servers.append(start_http_server(port, addr=f"127.0.0.{i + 2}", registry=reg))
        except OSError as e:
            pytest.skip(f"cannot bind loopback alias 127.0.0.{i + 2}: {e}")
    ips = {name: f"127.0.0.{i + 2}" for i, name in enumerate(regs)}
    yield port, regs, ips
    for server, _ in servers:
        server.shutdown()
        server.server_close()


def test_loop_scrapes_decides_and_patches(exporters):
    port, regs, ips = exporters
    ttft = Histogram(ROUTER_TTFT_SECONDS, "ttft", buckets=(0.5, 1, 2, 4, 8, 16), registry=regs["r0"])
    busy = {}
    for p in ("p0", "p1"):
        Gauge(PREFILL_QUEUED_TOKENS, "q", registry=regs[p]).set(500)
        busy[p] = Histogram(PREFILL_COMPUTE_SECONDS, "c", registry=regs[p])
    for d, running in (("d0", 5), ("d1", 0)):
        Gauge(DECODE_RUNNING_REQUESTS, "r", registry=regs[d]).set(running)
        Gauge(DECODE_KV_BLOCKS_USED, "u", registry=regs[d]).set(running * 3)
        Gauge(DECODE_KV_BLOCKS_TOTAL, "t", registry=regs[d]).set(1000)
        Gauge(DECODE_MAX_BATCH, "m", registry=regs[d]).set(64)
    pods = {"router": [PodRef("r0", ips["r0"])], "prefill": [PodRef(p, ips[p]) for p in ("p0", "p1")],
            "decode": [PodRef(d, ips[d]) for d in ("d0", "d1")]}
    cluster = InMemoryCluster(pods, {"dz-prefill": 2, "dz-decode": 2})
    loop = PlannerLoop(PlannerConfig.from_dict(config(port)), cluster)

    pre, dec = loop.tick(0.0)
    # Decode is nearly idle and its cooldown is zero: the emptiest pod is marked, then removed.
    assert (dec.current, dec.desired) == (2, 1)
    assert cluster.calls == [("cost", "d0", 5), ("cost", "d1", 0), ("scale", "dz-decode", 1)]
    assert not pre.changed
    cluster.calls.clear()

    for _ in range(40):
        ttft.observe(9.0)  # first tokens take 9 s against a 2 s target
    for p in busy.values():
        p.observe(15.0)
    pre, _ = loop.tick(15.0)
    assert pre.desired > 2 and pre.reason.startswith("ttft")
    assert ("scale", "dz-prefill", pre.desired) in cluster.calls
    assert cluster.replica_counts["dz-prefill"] == pre.desired <= 4


def test_scrape_failures_are_counted_not_fatal():
    cfg = PlannerConfig.from_dict(config(free_port()))
    pods = {"router": [PodRef("r0", "127.0.0.1")], "prefill": [], "decode": []}
    cluster = InMemoryCluster(pods, {"dz-prefill": 3, "dz-decode": 2})
    loop = PlannerLoop(cfg, cluster)
    pre, dec = loop.tick(0.0)  # nothing listens on the port: no data, hold
    assert (pre.desired, dec.desired) == (3, 2) and not cluster.calls
    assert loop.registry.get_sample_value("dayzero_planner_scrape_errors_total", {"role": "router"}) == 1


def test_http_health_and_metrics():
    cfg = PlannerConfig.from_dict(config(free_port()))
    loop = PlannerLoop(cfg, InMemoryCluster({"router": [], "prefill": [], "decode": []},
                                            {"dz-prefill": 1, "dz-decode": 1}))
    loop.tick(0.0)
    port = free_port()
    server = serve_http(loop, port, host="127.0.0.1")
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
            assert r.status == 200
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            body = r.read().decode()
        assert 'dayzero_planner_desired_replicas{stage="decode"} 1.0' in body
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("mutate, message", [
    (lambda c: c["prefill"].update(targetTtft=1), "prefill.targetTtft"),
    (lambda c: c.update(extra=1), "extra"),
    (lambda c: c["targets"].pop("decode"), "targets.decode is missing"),
    (lambda c: c["decode"].update(minReplicas=9), "min_replicas <= max_replicas"),
    (lambda c: c.update(intervalSeconds=0), "intervalSeconds"),
])
def test_config_errors_name_the_key(mutate, message):
    cfg = config(9100)
    mutate(cfg)
    with pytest.raises(ConfigError, match=message):
        PlannerConfig.from_dict(cfg)


def test_main_rejects_a_bad_config_file(tmp_path, capsys):
    bad = tmp_path / "planner.json"
    cfg = config(9100)
    cfg["prefill"]["nope"] = 1
    bad.write_text(json.dumps(cfg))
    assert main(["--config", str(bad), "--namespace", "ns"]) == 2
    assert "nope" in capsys.readouterr().err


class FakeApiServer(BaseHTTPRequestHandler):
    """Loopback stand-in for the Kubernetes API server: answers the adapter's four calls."""

    requests: list = []

    def _reply(self, obj: dict) -> None:
        body = json.dumps(obj).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):  # noqa: N802
        self.requests.append(("GET", self.path, None, None))
        if self.path.startswith("/api/v1/namespaces/ns/pods"):
            def pod(name, phase, ready, ip):
                return {"metadata": {"name": name}, "status": {
                    "phase": phase, "podIP": ip, "conditions": [{"type": "Ready", "status": ready}]}}
            self._reply({"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": [
                pod("b", "Running", "True", "10.0.0.2"), pod("a", "Running", "True", "10.0.0.1"),
                pod("c", "Running", "False", "10.0.0.3"), pod("d", "Pending", "False", None)]})
        else:
            self._reply({"kind": "Scale", "apiVersion": "autoscaling/v1",
                         "metadata": {"name": "x"}, "spec": {"replicas": 3}, "status": {"replicas": 3}})

    def do_PATCH(self):  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.requests.append(("PATCH", self.path, self.headers["Content-Type"], body))
        self._reply({"kind": "Scale", "apiVersion": "autoscaling/v1", "metadata": {"name": "x"},
                     "spec": {"replicas": 3}} if "scale" in self.path else {"metadata": {"name": "x"}})

    def log_message(self, *args):
        pass


def test_kubernetes_adapter_speaks_the_api():
    kubernetes = pytest.importorskip("kubernetes")
    FakeApiServer.requests = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeApiServer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        conf = kubernetes.client.Configuration(host=f"http://127.0.0.1:{server.server_address[1]}")
        api = KubeClusterApi("ns", kubernetes.client.ApiClient(conf))
        assert api.ready_pods(SEL + "decode") == [PodRef("a", "10.0.0.1"), PodRef("b", "10.0.0.2")]
        assert api.replicas("dz-decode") == 3
        api.scale("dz-decode", 5)
        api.set_deletion_cost("a", 7)
        with pytest.raises(ValueError):
            api.scale("dz-decode", -1)
    finally:
        server.shutdown()
        server.server_close()
    reqs = FakeApiServer.requests
    assert "labelSelector=" in reqs[0][1] and "component%3Ddecode" in reqs[0][1]
    assert reqs[1][:2] == ("GET", "/apis/apps/v1/namespaces/ns/deployments/dz-decode/scale")
    method, path, ctype, body = reqs[2]
    assert (method, path, body) == ("PATCH", "/apis/apps/v1/namespaces/ns/deployments/dz-decode/scale",
                                    {"spec": {"replicas": 5}})
    assert "merge-patch" in ctype  # a plain object body, not a JSON Patch list
    method, path, ctype, body = reqs[3]
    assert path == "/api/v1/namespaces/ns/pods/a"
    assert body == {"metadata": {"annotations": {DELETION_COST_ANNOTATION: "7"}}}
    assert len(reqs) == 4
