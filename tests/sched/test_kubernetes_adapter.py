"""The Kubernetes adapter through the official ``kubernetes`` client, at the HTTP seam: a fake API server on
loopback (`tests.sched._fake_k8s`). No Kubernetes cluster runs here; what is checked is what the client sends
(cordon, taint, annotations, an event on the node) and how the adapter reads it back, plus the drain policy and
``return_node`` over it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.sched._fake_k8s import FakeApiServer, node, pod
from trainguard.health.base import CheckResult
from trainguard.health.drain import DrainPolicy, DrainSettings, Verdict, return_node
from trainguard.health.scheduler import SchedulerError

kubernetes = pytest.importorskip("kubernetes", reason="the kubernetes client is not installed (the dev extra has it)")

from trainguard.health.kubernetes import REASON_ANNOTATION, TAINT_KEY, KubernetesAdapter  # noqa: E402

JOB = "batch.kubernetes.io/job-name=train"


@pytest.fixture
def api() -> Iterator[FakeApiServer]:
    nodes = [node("gpu-1"), node("gpu-2", taints=[{"key": "nvidia.com/gpu", "value": "present",
                                                   "effect": "NoSchedule"}]),
             node("gpu-3"), node("gpu-4", unschedulable=True)]  # gpu-4: cordoned by an operator
    pods = [pod(f"train-{i}", f"gpu-{i + 1}", {"batch.kubernetes.io/job-name": "train"}) for i in range(3)]
    pods.append(pod("other", "gpu-4", {"app": "web"}))
    with FakeApiServer(nodes, pods) as server:
        yield server


def adapter(api: FakeApiServer) -> KubernetesAdapter:
    cfg = kubernetes.client.Configuration()
    cfg.host = api.url
    return KubernetesAdapter(kubernetes.client.ApiClient(cfg), namespace="train", job_selector=JOB,
                             timeout_seconds=5)


def test_drain_cordons_taints_annotates_and_records_an_event(api: FakeApiServer) -> None:
    a = adapter(api)
    a.drain("gpu-2", "trainguard: Xid 79 GPU 0000:18:00 (Faulty GPU), run r attempt 2")
    patch = next(r for r in api.requests if r["method"] == "PATCH")
    assert patch["path"] == "/api/v1/nodes/gpu-2"
    assert "merge-patch" in patch["content_type"]
    n = api.nodes["gpu-2"]
    assert n["spec"]["unschedulable"] is True
    assert {"key": TAINT_KEY, "value": "true", "effect": "NoSchedule"} in n["spec"]["taints"]
    assert {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"} in n["spec"]["taints"]  # kept
    assert n["metadata"]["annotations"][REASON_ANNOTATION].startswith("trainguard: Xid 79")
    [event] = api.events
    assert event["involvedObject"] == {"kind": "Node", "name": "gpu-2", "uid": "uid-gpu-2", "apiVersion": "v1"}
    assert event["reason"] == "TrainguardDrain" and event["type"] == "Warning"
    assert event["message"].startswith("trainguard: Xid 79") and event["source"] == {"component": "trainguard"}
    state = a.node("gpu-2")
    assert state.drained and state.by_trainguard and state.since is not None
    assert [s.node for s in a.drained()] == ["gpu-2", "gpu-4"]


def test_resume_removes_only_what_trainguard_added(api: FakeApiServer) -> None:
    a = adapter(api)
    a.drain("gpu-2", "trainguard: node lost, run r attempt 0")
    a.resume("gpu-2")
    n = api.nodes["gpu-2"]
    assert n["spec"]["unschedulable"] is False
    assert n["spec"]["taints"] == [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]
    assert REASON_ANNOTATION not in n["metadata"].get("annotations", {})
    assert [e["reason"] for e in api.events] == ["TrainguardDrain", "TrainguardReturn"]
    assert not a.node("gpu-2").drained


def test_job_nodes_cluster_nodes_and_unknown_nodes(api: FakeApiServer) -> None:
    a = adapter(api)
    assert a.job_nodes() == ["gpu-1", "gpu-2", "gpu-3"]
    pods_call = next(r for r in api.requests if r["path"].endswith("/pods"))
    assert pods_call["path"] == "/api/v1/namespaces/train/pods" and "labelSelector=" in pods_call["query"]
    assert a.cluster_nodes() == ["gpu-1", "gpu-2", "gpu-3", "gpu-4"]
    with pytest.raises(KeyError):
        a.node("gpu-9")
    operator = a.node("gpu-4")
    assert operator.drained and not operator.by_trainguard


def test_an_api_server_in_trouble_is_a_scheduler_error(api: FakeApiServer) -> None:
    api.fail_with = 500
    with pytest.raises(SchedulerError, match="500"):
        adapter(api).node("gpu-1")


def test_drain_policy_and_return_over_kubernetes(api: FakeApiServer, tmp_path: Path) -> None:
    a = adapter(api)
    clock = [1000.0]
    policy = DrainPolicy(DrainSettings(scheduler="kubernetes", max_share=0.34, max_cluster_share=1.0), a,
                         tmp_path / "run", "r", "gpu-1", clock=lambda: clock[0])
    first = policy.decide(Verdict("gpu-3", "lost", "node lost", 0))
    assert first.status == "drained" and first.scheduler == "kubernetes"
    second = policy.decide(Verdict("gpu-2", "health", "failed health check injected", 1))
    assert second.status == "refused" and "rate limit" in second.detail
    assert not api.nodes["gpu-2"]["spec"].get("unschedulable")
    # gpu-4 runs no pod of the job (the selector's pods are on gpu-1..3): never drained, not even looked up
    outside = policy.decide(Verdict("gpu-4", "lost", "node lost", 1))
    assert outside.status == "refused" and "not in the job's allocation (3 nodes)" in outside.detail
    assert not any(r["path"].endswith("/gpu-4") for r in api.requests)

    def good() -> list[CheckResult]:
        return [CheckResult("injected", "high", True)]

    assert return_node(a, "gpu-4", good, passes=1, sleep=lambda s: None).status == "refused"  # the operator's
    out = return_node(a, "gpu-3", good, passes=2, interval_seconds=0, sleep=lambda s: None)
    assert out.status == "returned" and not api.nodes["gpu-3"]["spec"]["unschedulable"]


def test_the_rbac_manifest_grants_exactly_what_the_adapter_uses(api: FakeApiServer, tmp_path: Path) -> None:
    import yaml

    manifest = Path(__file__).resolve().parents[2] / "examples" / "kubernetes" / "rbac" / "drain.yaml"
    docs = [d for d in yaml.safe_load_all(manifest.read_text()) if d]
    granted = {(res, verb) for d in docs if d["kind"] in ("ClusterRole", "Role") for rule in d["rules"]
               for res in rule["resources"] for verb in rule["verbs"]}
    bound = {d["roleRef"]["name"] for d in docs if d["kind"].endswith("Binding")}
    assert bound == {d["metadata"]["name"] for d in docs if d["kind"] in ("ClusterRole", "Role")}
    a = adapter(api)
    policy = DrainPolicy(DrainSettings(scheduler="kubernetes", max_share=1.0, max_cluster_share=0.9), a,
                         tmp_path / "run", "r", "gpu-1")  # a cluster limit: the cluster's nodes are listed
    policy.decide(Verdict("gpu-3", "lost", "node lost", 0))
    return_node(a, "gpu-3", lambda: [CheckResult("injected", "high", True)], passes=1)
    verbs = {("GET", True): "list", ("GET", False): "get", ("PATCH", False): "patch", ("POST", True): "create"}
    used = set()
    for r in api.requests:
        parts = r["path"].strip("/").split("/")
        resource = parts[-1] if parts[-1] in ("nodes", "pods", "events") else parts[-2]
        used.add((resource, verbs[(r["method"], parts[-1] == resource)]))
    assert used == granted, (used, granted)
