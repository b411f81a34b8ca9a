"""A fake Kubernetes API server on loopback: the endpoints the Kubernetes adapter uses, nothing more.

``GET/PATCH /api/v1/nodes/{name}``, ``GET /api/v1/nodes``, ``GET /api/v1/namespaces/{ns}/pods?labelSelector=``
(equality selectors), ``POST /api/v1/namespaces/{ns}/events``. PATCH applies a strategic-merge patch the way the
API server does for these fields: objects merge, lists (``taints``) are replaced, ``null`` deletes. Every request
is recorded (method, path, content type, body) so tests can check what the official client sent.
"""

from __future__ import annotations

import copy
import json
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


def node(name: str, *, ready: bool = True, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "uid": f"uid-{name}", "labels": {"kubernetes.io/hostname": name}},
            "spec": dict(spec),
            "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}


def pod(name: str, node_name: str, labels: dict[str, str]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "train", "labels": labels},
            "spec": {"nodeName": node_name, "containers": [{"name": "agent", "image": "trainguard"}]}}


def merge(target: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        elif isinstance(value, dict) and isinstance(target.get(key), dict):
            merge(target[key], value)
        else:
            target[key] = copy.deepcopy(value)
    return target


class FakeApiServer:
    def __init__(self, nodes: list[dict[str, Any]], pods: list[dict[str, Any]] | None = None) -> None:
        self.nodes = {n["metadata"]["name"]: n for n in nodes}
        self.pods = pods or []
        self.events: list[dict[str, Any]] = []
        self.requests: list[dict[str, Any]] = []
        self.fail_with: int | None = None
        """Answer every request with this HTTP status (an API server in trouble)."""
        self.lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _send(self, code: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _handle(self, method: str) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                url = urllib.parse.urlsplit(self.path)
                body = json.loads(raw) if raw else None
                with server.lock:
                    server.requests.append({"method": method, "path": url.path, "query": url.query,
                                            "content_type": self.headers.get("Content-Type", ""), "body": body})
                    if server.fail_with is not None:
                        return self._send(server.fail_with, _status(server.fail_with, "injected failure"))
                    code, out = server.route(method, url.path, urllib.parse.parse_qs(url.query), body)
                self._send(code, out)

            def do_GET(self) -> None:
                self._handle("GET")

            def do_PATCH(self) -> None:
                self._handle("PATCH")

            def do_POST(self) -> None:
                self._handle("POST")

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def route(self, method: str, path: str, query: dict[str, list[str]],
              body: Any) -> tuple[int, dict[str, Any]]:
        parts = [p for p in path.split("/") if p]
        if parts[:2] != ["api", "v1"]:
            return 404, _status(404, f"no route {path}")
        rest = parts[2:]
        if rest == ["nodes"] and method == "GET":
            return 200, {"apiVersion": "v1", "kind": "NodeList", "metadata": {},
                         "items": list(self.nodes.values())}
        if len(rest) == 2 and rest[0] == "nodes":
            found = self.nodes.get(rest[1])
            if found is None:
                return 404, _status(404, f'nodes "{rest[1]}" not found')
            if method == "PATCH":
                merge(found, body)
            return 200, found
        if len(rest) == 3 and rest[0] == "namespaces" and rest[2] == "pods" and method == "GET":
            selector = dict(kv.split("=", 1) for kv in (query.get("labelSelector", [""])[0].split(",")) if "=" in kv)
            items = [p for p in self.pods if p["metadata"]["namespace"] == rest[1]
                     and all(p["metadata"]["labels"].get(k) == v for k, v in selector.items())]
            return 200, {"apiVersion": "v1", "kind": "PodList", "metadata": {}, "items": items}
        if len(rest) == 3 and rest[0] == "namespaces" and rest[2] == "events" and method == "POST":
            event = copy.deepcopy(body)
            event["metadata"]["name"] = f"{event['metadata'].get('generateName', 'e')}{len(self.events)}"
            self.events.append(event)
            return 201, event
        return 404, _status(404, f"no route {method} {path}")

    def __enter__(self) -> FakeApiServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def _status(code: int, message: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Status", "status": "Failure", "message": message, "code": code,
            "reason": "NotFound" if code == 404 else "InternalError"}
