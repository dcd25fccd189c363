"""Chart values: overrides reach the manifests, bad values fail with a message naming the key."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

helm = pytest.importorskip("helm_python")

CHART = Path(__file__).resolve().parents[2] / "deploy" / "helm" / "dayzero"


def render(values: dict, release: str = "dz") -> list[dict]:
    with helm.Chart.load(CHART) as chart:
        out = chart.render(values=values, name=release, namespace="serving")
    return [d for path, text in sorted(out.items()) if not path.endswith(".txt")
            for d in yaml.safe_load_all(text) if d]


def container(docs: list[dict], component: str) -> dict:
    (w,) = [d for d in docs if d["kind"] in ("Deployment", "StatefulSet")
            and d["metadata"]["labels"].get("app.kubernetes.io/component") == component]
    return w["spec"]["template"]["spec"]["containers"][0]


def pod_spec(docs: list[dict], component: str) -> dict:
    (w,) = [d for d in docs if d["kind"] == "Deployment"
            and d["metadata"]["labels"].get("app.kubernetes.io/component") == component]
    return w["spec"]["template"]["spec"]


def env_pairs(c: dict) -> list[tuple[str, str | None]]:
    return [(e["name"], e.get("value")) for e in c["env"]]


@pytest.mark.parametrize("values, message", [
    ({"workers": {"device": "gpu"}}, "/workers/device"),
    ({"workers": {"transport": "tcp"}}, "/workers/transport"),
    ({"decode": {"tp": 0}}, "/decode/tp"),
    ({"model": {"volume": {"type": "s3"}}}, "/model/volume/type"),
    ({"decode": {"tp": 4, "ep": 3}}, "the smaller must divide the larger"),
    ({"redis": {"enabled": False}}, "redis.externalUrl is required"),
    ({"redis": {"enabled": False, "externalUrl": "http://x:6379"}}, "/redis/externalUrl"),
    ({"model": {"volume": {"type": "demo"}}}, "set workers.device cpu"),
    ({"autoscaling": {"enabled": True, "decode": {"minReplicas": 5, "maxReplicas": 2}}},
     "minReplicas <= maxReplicas"),
])
def test_bad_values_fail_with_the_key(values, message):
    with pytest.raises(helm.HelmError) as err:
        render(values)
    assert message in str(err.value)


def test_multicast_switches_cannot_be_turned_on():
    docs = render({"workers": {"extraEnv": [{"name": "NCCL_NVLS_ENABLE", "value": "1"},
                                            {"name": "MY_FLAG", "value": "x"}]},
                   "decode": {"extraEnv": [{"name": "NVSHMEM_DISABLE_NVLS", "value": "0"}]}})
    for comp in ("prefill", "decode"):
        pairs = env_pairs(container(docs, comp))
        names = [n for n, _ in pairs]
        assert len(names) == len(set(names)), f"{comp}: duplicate env {names}"
        env = dict(pairs)
        assert env["NCCL_NVLS_ENABLE"] == "0" and env["NVSHMEM_DISABLE_NVLS"] == "1"
        assert env["MY_FLAG"] == "x"


def test_external_redis_replaces_the_bundled_one():
    url = "redis://redis.shared.svc:6379/3"
    docs = render({"redis": {"enabled": False, "externalUrl": url}})
    assert not [d for d in docs if d["kind"] == "StatefulSet"]
    for comp in ("router", "prefill", "decode"):
        args = container(docs, comp)["args"]
        assert args[args.index("--redis-url") + 1] == url


def test_model_volume_choices():
    pvc = pod_spec(render({"model": {"volume": {"type": "pvc", "claimName": "weights"}}}), "decode")
    (model,) = [v for v in pvc["volumes"] if v["name"] == "model"]
    assert model["persistentVolumeClaim"] == {"claimName": "weights", "readOnly": True}
    host = pod_spec(render({"model": {"path": "m", "volume": {"type": "hostPath", "hostPath": "/data/llm"}}}), "prefill")
    (model,) = [v for v in host["volumes"] if v["name"] == "model"]
    assert model["hostPath"]["path"] == "/data/llm"
    c = host["containers"][0]
    assert c["args"][c["args"].index("--model") + 1] == "/models/m"


def test_cpu_demo_writes_the_same_tiny_model_in_every_worker():
    docs = render(yaml.safe_load((CHART / "examples" / "cpu-demo.yaml").read_text()))
    seen = []
    for comp in ("prefill", "decode"):
        spec = pod_spec(docs, comp)
        (init,) = spec["initContainers"]
        cmd = init["command"] + init["args"]
        assert cmd[:2] == ["dayzero", "make-checkpoint"]
        out_dir = cmd[-1]
        args = spec["containers"][0]["args"]
        assert args[args.index("--model") + 1] == out_dir
        assert args[args.index("--device") + 1] == "cpu"
        (model,) = [v for v in spec["volumes"] if v["name"] == "model"]
        assert model == {"name": "model", "emptyDir": {}}
        assert "tolerations" not in spec  # no GPU toleration on CPU pods
        seen.append(cmd)
    assert seen[0] == seen[1]  # same preset and seed: prefill and decode hold identical weights


def test_api_key_goes_through_a_secret():
    docs = render({"frontend": {"apiKey": "sk-test"}})
    (secret,) = [d for d in docs if d["kind"] == "Secret"]
    env = {e["name"]: e for e in container(docs, "frontend")["env"]}
    ref = env["DAYZERO_API_KEY"]["valueFrom"]["secretKeyRef"]
    assert ref["name"] == secret["metadata"]["name"] and secret["stringData"][ref["key"]] == "sk-test"
    docs = render({"frontend": {"apiKeySecret": "mine"}})
    assert not [d for d in docs if d["kind"] == "Secret"]
    env = {e["name"]: e for e in container(docs, "frontend")["env"]}
    assert env["DAYZERO_API_KEY"]["valueFrom"]["secretKeyRef"]["name"] == "mine"


def test_rdma_adds_device_and_ipc_lock():
    docs = render({"workers": {"rdma": {"enabled": True, "resource": "rdma/ib", "count": 2}}})
    for comp in ("prefill", "decode"):
        c = container(docs, comp)
        assert c["resources"]["limits"]["rdma/ib"] == 2
        assert "IPC_LOCK" in c["securityContext"]["capabilities"]["add"]


def test_image_registry_and_tag():
    docs = render({"image": {"registry": "registry.example/team/", "tag": "v9"}})
    assert container(docs, "router")["image"] == "registry.example/team/dayzero/router:v9"
    docs = render({})
    with helm.Chart.load(CHART) as chart:
        app_version = chart.metadata["appVersion"]
    assert container(docs, "decode")["image"] == f"dayzero/decode:{app_version}"


def test_long_release_names_stay_valid_dns_labels():
    docs = render({}, release="a-very-long-release-name-for-a-serving-stack-x")
    for d in docs:
        assert len(d["metadata"]["name"]) <= 63, d["metadata"]["name"]


def test_prefill_follows_decode_block_size_and_context():
    docs = render({"decode": {"blockSize": 64}, "model": {"maxModelLen": 32768}})
    for comp in ("prefill", "decode"):
        args = container(docs, comp)["args"]
        assert args[args.index("--block-size") + 1] == "64"
        assert args[args.index("--max-model-len") + 1] == "32768"
    args = container(docs, "frontend")["args"]
    assert args[args.index("--max-model-len") + 1] == "32768"


def test_helm_test_hook_targets_the_frontend_service():
    docs = render({"frontend": {"service": {"port": 80}}, "model": {"name": "m-x"}})
    (pod,) = [d for d in docs if d["kind"] == "Pod"]
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    (svc,) = [d for d in docs if d["kind"] == "Service" and d["metadata"]["name"].endswith("-frontend")]
    script = pod["spec"]["containers"][0]["args"][0]
    assert f'"http://{svc["metadata"]["name"]}:{svc["spec"]["ports"][0]["port"]}"' in script
    assert '"m-x" in models' in script
    compile(script, "helm-test", "exec")  # the check itself is valid Python
