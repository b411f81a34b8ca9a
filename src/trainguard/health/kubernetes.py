"""The Kubernetes scheduler adapter: cordon + taint + event, through the official ``kubernetes`` client.

Draining a node here means: ``spec.unschedulable: true`` (what ``kubectl cordon`` does), a ``NoSchedule`` taint
``trainguard.io/unhealthy`` (so schedulers and operators that ignore cordons still see it), the reason and time
in annotations (``trainguard.io/drain-reason``, ``trainguard.io/drained-at``), and a ``Warning`` event on the node
(``kubectl describe node`` shows it). Pods already running there are not evicted: the job's own pod ends when
trainguard excludes the node, and other workloads are left to their owners. Returning a node removes exactly
what trainguard added; a node cordoned without trainguard's annotation is never touched.

The client (``pip install 'trainguard[kubernetes]'``) is imported only when the adapter is made. It is tested
against a fake API server on loopback speaking the few endpoints used (tests/sched/test_kubernetes_adapter.py):
no Kubernetes cluster runs in CI. Permissions it needs: docs/operations.md (RBAC).
"""

from __future__ import annotations

import datetime as dt
import os
from pathlib import Path
from typing import Any

from trainguard.errors import UsageError
from trainguard.health.sched_base import NodeState, SchedulerError

TAINT_KEY = "trainguard.io/unhealthy"
REASON_ANNOTATION = "trainguard.io/drain-reason"
TIME_ANNOTATION = "trainguard.io/drained-at"
EVENT_NAMESPACE = "default"
"""Node events live in ``default`` (where ``kubectl describe node`` looks for them)."""
_SA_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
REQUEST_TIMEOUT_SECONDS = 15.0


def _client() -> Any:
    try:
        import kubernetes
    except ImportError:
        raise UsageError("the Kubernetes adapter needs the kubernetes client: pip install 'trainguard[kubernetes]'"
                         ) from None
    return kubernetes


class KubernetesAdapter:
    """Drain (cordon + taint + event), resume and list Kubernetes nodes.

    ``api_client`` is a ``kubernetes.client.ApiClient`` (None: the client's default configuration);
    ``namespace`` and ``job_selector`` (a label selector such as ``batch.kubernetes.io/job-name=train``) find the
    job's pods for `job_nodes`.
    """

    name = "kubernetes"

    def __init__(self, api_client: Any = None, *, namespace: str = "default", job_selector: str = "",
                 timeout_seconds: float = REQUEST_TIMEOUT_SECONDS) -> None:
        k8s = _client()
        self._k8s = k8s
        self.core = k8s.client.CoreV1Api(api_client)
        self.namespace = namespace
        self.job_selector = job_selector
        self.timeout_seconds = timeout_seconds

    @classmethod
    def from_environment(cls, environ: dict[str, str] | None = None) -> KubernetesAdapter:
        """Inside a pod: the service account (in-cluster config); elsewhere ``~/.kube/config``. The job's pods are
        ``TRAINGUARD_K8S_JOB_SELECTOR`` (or ``batch.kubernetes.io/job-name=$JOB_NAME``) in ``POD_NAMESPACE``."""
        env = os.environ if environ is None else environ
        k8s = _client()
        try:
            if env.get("KUBERNETES_SERVICE_HOST"):
                k8s.config.load_incluster_config()
            else:
                k8s.config.load_kube_config()
        except Exception as exc:
            raise UsageError(f"no Kubernetes API configuration: {exc}") from None
        namespace = env.get("POD_NAMESPACE") or env.get("TRAINGUARD_K8S_NAMESPACE") or ""
        if not namespace and _SA_NAMESPACE.exists():
            namespace = _SA_NAMESPACE.read_text().strip()
        selector = env.get("TRAINGUARD_K8S_JOB_SELECTOR", "")
        if not selector and env.get("JOB_NAME"):
            selector = f"batch.kubernetes.io/job-name={env['JOB_NAME']}"
        return cls(namespace=namespace or "default", job_selector=selector)

    def _call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        api_exception = self._k8s.client.exceptions.ApiException
        try:
            return fn(*args, _request_timeout=self.timeout_seconds, **kwargs)
        except api_exception as exc:
            if exc.status == 404:
                raise KeyError(f"not found: {exc.reason}") from None
            raise SchedulerError(f"Kubernetes API: {exc.status} {exc.reason}") from None
        except (OSError, ValueError) as exc:  # connection refused, TLS, timeouts (urllib3's are OSErrors)
            raise SchedulerError(f"Kubernetes API unreachable: {exc}") from None
        except Exception as exc:
            if exc.__class__.__module__.startswith("urllib3"):
                raise SchedulerError(f"Kubernetes API unreachable: {exc}") from None
            raise

    # --- reading --------------------------------------------------------------------------------------

    @staticmethod
    def _state(node: Any) -> NodeState:
        meta, spec, status = node.metadata, node.spec, node.status
        annotations = dict(getattr(meta, "annotations", None) or {})
        cordoned = bool(getattr(spec, "unschedulable", False))
        ready = "unknown"
        for c in (getattr(status, "conditions", None) or []) if status is not None else []:
            if c.type == "Ready":
                ready = "ready" if c.status == "True" else "notready"
        ours = annotations.get(REASON_ANNOTATION, "")
        since = None
        if annotations.get(TIME_ANNOTATION):
            try:
                since = dt.datetime.fromisoformat(annotations[TIME_ANNOTATION].replace("Z", "+00:00")).timestamp()
            except ValueError:
                since = None
        return NodeState(node=meta.name, state=("cordoned," if cordoned else "") + ready, drained=cordoned,
                         reason=ours if cordoned else "", since=since if cordoned else None,
                         by="trainguard" if cordoned and ours else "")

    def node(self, node: str) -> NodeState:
        return self._state(self._call(self.core.read_node, node))

    def drained(self) -> list[NodeState]:
        nodes = self._call(self.core.list_node).items or []
        return [s for s in map(self._state, nodes) if s.drained]

    def job_nodes(self) -> list[str]:
        if not self.job_selector:
            return []
        pods = self._call(self.core.list_namespaced_pod, self.namespace, label_selector=self.job_selector).items
        return sorted({p.spec.node_name for p in pods or [] if p.spec is not None and p.spec.node_name})

    def cluster_nodes(self) -> list[str]:
        return [n.metadata.name for n in self._call(self.core.list_node).items or []]

    # --- changes --------------------------------------------------------------------------------------

    @staticmethod
    def _other_taints(node: Any) -> list[dict[str, Any]]:
        out = []
        for t in getattr(node.spec, "taints", None) or []:
            if t.key != TAINT_KEY:
                taint = {"key": t.key, "effect": t.effect}
                if t.value is not None:
                    taint["value"] = t.value
                out.append(taint)
        return out

    def _event(self, node: Any, reason: str, message: str) -> None:
        c = self._k8s.client
        now = dt.datetime.now(dt.UTC)
        event = c.CoreV1Event(
            metadata=c.V1ObjectMeta(generate_name="trainguard-", namespace=EVENT_NAMESPACE),
            involved_object=c.V1ObjectReference(kind="Node", name=node.metadata.name, uid=node.metadata.uid,
                                                api_version="v1"),
            reason=reason, message=message, type="Warning" if reason == "TrainguardDrain" else "Normal",
            source=c.V1EventSource(component="trainguard"), first_timestamp=now, last_timestamp=now, count=1)
        self._call(self.core.create_namespaced_event, EVENT_NAMESPACE, event)

    def drain(self, node: str, reason: str) -> None:
        current = self._call(self.core.read_node, node)
        now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        taints = [*self._other_taints(current), {"key": TAINT_KEY, "value": "true", "effect": "NoSchedule"}]
        body = {"metadata": {"annotations": {REASON_ANNOTATION: reason, TIME_ANNOTATION: now}},
                "spec": {"unschedulable": True, "taints": taints}}
        self._call(self.core.patch_node, node, body)
        self._event(current, "TrainguardDrain", reason)

    def resume(self, node: str) -> None:
        current = self._call(self.core.read_node, node)
        taints = self._other_taints(current)
        body = {"metadata": {"annotations": {REASON_ANNOTATION: None, TIME_ANNOTATION: None}},
                "spec": {"unschedulable": False, "taints": taints or None}}
        self._call(self.core.patch_node, node, body)
        self._event(current, "TrainguardReturn", "trainguard: returned to service after passing health checks")
