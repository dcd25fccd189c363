"""The planner's view of the cluster: a small protocol and its `kubernetes`-client adapter.

The adapter is thin on purpose: list ready pods by label selector, read and patch a Deployment's
scale subresource, annotate pods with a deletion cost. The RBAC Role in the Helm chart grants
exactly these verbs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

# Lower cost = removed first when a ReplicaSet scales down (Kubernetes >= 1.22).
DELETION_COST_ANNOTATION = "controller.kubernetes.io/pod-deletion-cost"


@dataclass(frozen=True)
class PodRef:
    name: str
    ip: str


class ClusterApi(Protocol):
    """What the planner needs from Kubernetes."""

    def ready_pods(self, selector: str) -> list[PodRef]:
        """Running pods matching the label selector whose Ready condition is True."""

    def replicas(self, deployment: str) -> int:
        """spec.replicas of the Deployment."""

    def scale(self, deployment: str, replicas: int) -> None:
        """Set spec.replicas of the Deployment."""

    def set_deletion_cost(self, pod: str, cost: int) -> None:
        """Annotate the pod with its deletion cost."""


class KubeClusterApi:
    """`ClusterApi` over the official kubernetes Python client, in one namespace."""

    def __init__(self, namespace: str, api_client=None) -> None:
        from kubernetes import client  # the k8s extra; imported here so the router needs none

        self.namespace = namespace
        self._core = client.CoreV1Api(api_client)
        self._apps = client.AppsV1Api(api_client)

    @classmethod
    def from_environment(cls, namespace: str) -> "KubeClusterApi":
        """In a pod: the ServiceAccount's token; elsewhere: the kubeconfig."""
        from kubernetes import config

        try:
            config.load_incluster_config()
        except config.ConfigException:
            config.load_kube_config()
        return cls(namespace)

    def ready_pods(self, selector: str) -> list[PodRef]:
        pods = self._core.list_namespaced_pod(self.namespace, label_selector=selector)
        out = []
        for pod in pods.items:
            status = pod.status
            if status is None or status.phase != "Running" or not status.pod_ip:
                continue
            if pod.metadata.deletion_timestamp is not None:
                continue
            ready = any(c.type == "Ready" and c.status == "True" for c in (status.conditions or []))
            if ready:
                out.append(PodRef(pod.metadata.name, status.pod_ip))
        return sorted(out, key=lambda p: p.name)

    def replicas(self, deployment: str) -> int:
        scale = self._apps.read_namespaced_deployment_scale(deployment, self.namespace)
        return int(scale.spec.replicas or 0)

    def scale(self, deployment: str, replicas: int) -> None:
        if replicas < 0:
            raise ValueError(f"replicas must be >= 0, got {replicas}")
        self._apps.patch_namespaced_deployment_scale(
            deployment, self.namespace, {"spec": {"replicas": int(replicas)}})

    def set_deletion_cost(self, pod: str, cost: int) -> None:
        body = {"metadata": {"annotations": {DELETION_COST_ANNOTATION: str(int(cost))}}}
        self._core.patch_namespaced_pod(pod, self.namespace, body)
