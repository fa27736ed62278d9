"""A small in-process Kubernetes API server for the lease tests: Leases (GET, POST, PUT with
resourceVersion conflicts) and Pods (merge PATCH of labels), on 127.0.0.1, plain HTTP.

It keeps what it was sent, so a test reads the Lease and the pods' labels as a cluster would show
them; `before_write` lets a test slip another writer in between a contender's read and its write
(the 409 race); `fail_with` makes every request answer that status (an API server in trouble).
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

LEASE = re.compile(r"^/apis/coordination\.k8s\.io/v1/namespaces/([^/]+)/leases(?:/([^/]+))?$")
POD = re.compile(r"^/api/v1/namespaces/([^/]+)/pods/([^/]+)$")


class FakeApiServer:
    def __init__(self, pods: tuple[str, ...] = ()) -> None:
        self.lock = threading.Lock()
        self.leases: dict[tuple[str, str], dict[str, Any]] = {}
        self.pods: dict[tuple[str, str], dict[str, str]] = {("zfab", p): {} for p in pods}
        self.version = 100
        self.requests: list[tuple[str, str, str]] = []  # (method, path, Authorization)
        self.before_write: Callable[[], None] | None = None
        self.fail_with: int | None = None
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                server.handle(self, "GET")

            def do_POST(self) -> None:
                server.handle(self, "POST")

            def do_PUT(self) -> None:
                server.handle(self, "PUT")

            def do_PATCH(self) -> None:
                server.handle(self, "PATCH")

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.02,), daemon=True)

    def __enter__(self) -> FakeApiServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        if self.thread.is_alive():
            self.httpd.shutdown()
            self.thread.join(timeout=5)
        self.httpd.server_close()

    def lease(self, name: str = "zfab-broker", namespace: str = "zfab") -> dict[str, Any]:
        with self.lock:
            return json.loads(json.dumps(self.leases[(namespace, name)]))

    def labels(self, pod: str) -> dict[str, str]:
        with self.lock:
            return dict(self.pods[("zfab", pod)])

    # ---- the API --------------------------------------------------------------------------------

    def handle(self, h: BaseHTTPRequestHandler, method: str) -> None:
        length = int(h.headers.get("Content-Length") or 0)
        body = json.loads(h.rfile.read(length)) if length else None
        self.requests.append((method, h.path, h.headers.get("Authorization") or ""))
        if self.fail_with is not None:
            return self.answer(h, self.fail_with, {"kind": "Status", "message": "injected"})
        if method in ("POST", "PUT") and self.before_write is not None:
            hook, self.before_write = self.before_write, None
            hook()
        with self.lock:
            if (m := LEASE.match(h.path)) is not None:
                code, answer = self.lease_call(method, m.group(1), m.group(2), body)
            elif (m := POD.match(h.path)) is not None and method == "PATCH":
                code, answer = self.patch_pod(m.group(1), m.group(2), body, h.headers.get("Content-Type") or "")
            else:
                code, answer = 404, {"kind": "Status", "reason": "NotFound"}
        self.answer(h, code, answer)

    def answer(self, h: BaseHTTPRequestHandler, code: int, answer: Any) -> None:
        data = json.dumps(answer).encode()
        h.send_response(code)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        h.wfile.write(data)

    def lease_call(self, method: str, ns: str, name: str | None, body: Any) -> tuple[int, Any]:
        if method == "POST":
            key = (ns, body["metadata"]["name"])
            if key in self.leases:
                return 409, {"kind": "Status", "reason": "AlreadyExists"}
            return 201, self.store(key, body)
        key = (ns, name or "")
        current = self.leases.get(key)
        if current is None:
            return 404, {"kind": "Status", "reason": "NotFound"}
        if method == "GET":
            return 200, current
        if method == "PUT":
            if body["metadata"].get("resourceVersion") != current["metadata"]["resourceVersion"]:
                return 409, {"kind": "Status", "reason": "Conflict"}
            return 200, self.store(key, body)
        return 405, {"kind": "Status"}

    def store(self, key: tuple[str, str], body: dict[str, Any]) -> dict[str, Any]:
        self.version += 1
        record = json.loads(json.dumps(body))
        record["metadata"]["resourceVersion"] = str(self.version)
        self.leases[key] = record
        return record

    def write_lease(self, spec: dict[str, Any], name: str = "zfab-broker") -> None:
        """Another writer (a contender this test does not drive) sets the Lease."""
        with self.lock:
            current = self.leases.get(("zfab", name))
            meta = current["metadata"] if current else {"name": name, "namespace": "zfab"}
            lease = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": meta, "spec": spec}
            self.store(("zfab", name), lease)

    def patch_pod(self, ns: str, name: str, body: Any, content_type: str) -> tuple[int, Any]:
        if content_type != "application/merge-patch+json":
            return 415, {"kind": "Status"}
        labels = self.pods.get((ns, name))
        if labels is None:
            return 404, {"kind": "Status", "reason": "NotFound"}
        for k, v in body["metadata"]["labels"].items():
            if v is None:
                labels.pop(k, None)
            else:
                labels[k] = v
        return 200, {"metadata": {"name": name, "labels": labels}}
