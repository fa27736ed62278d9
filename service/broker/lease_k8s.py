"""The broker's lease as a Kubernetes `coordination.k8s.io/v1` Lease (`ZFAB_BROKER_LEASE=k8s://NAMESPACE/NAME`).

Talks to the API server with the pod's service account (its token and CA under
/var/run/secrets/kubernetes.io/serviceaccount, the server at KUBERNETES_SERVICE_HOST/PORT) through
the standard library: one small JSON request a renewal, nothing a client library would add.

The rules are client-go's leader election:
- a write names the resourceVersion it read (optimistic concurrency): a 409 means someone else wrote
  first, so this broker lost that round and reads again;
- the epoch is the Lease's `leaseTransitions`, +1 on every change of holder (a new Lease starts at 1,
  so 0 still means "never held");
- another holder's lease is judged expired from when *this process* saw the record change, on its
  own monotonic clock, plus the record's `leaseDurationSeconds`: never from the other host's
  `renewTime`, whose clock may be off. A broker that just started waits one whole duration.
- the holder counts its own term from the moment it sent the write that renewed it, so it believes
  its lease ends before any standby can (`leaseDurationSeconds` is its duration rounded up).

When this broker becomes the holder it labels its own pod (POD_NAME, from the downward API)
`zfab.io/broker-role=active`, so a Service selecting that label sends NorFab peers, which know one
endpoint, to the active broker; it removes the label when it loses the lease or releases it.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from .lease import LeaseState, LeaseUnavailable

log = logging.getLogger(__name__)

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
ACTIVE_LABEL = "zfab.io/broker-role"  # on the holder's pod: "active"; absent on the others
ACTIVE = "active"
MAX_BODY = 1 << 20  # a Lease or Pod answer is a few KiB; anything past this is not read
ATTEMPTS = 2  # reads and writes a contention round tries before it says "not held"
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")  # DNS-1123 subdomain (namespaces are stricter)

JsonObj = dict[str, Any]


def parse_url(url: str) -> tuple[str, str]:
    """`k8s://NAMESPACE/NAME` as (namespace, name); ValueError saying what a good one looks like."""
    rest = url[len("k8s://") :] if url.lower().startswith("k8s://") else None
    parts = rest.strip("/").split("/") if rest is not None else []
    if len(parts) != 2 or not all(_NAME.match(p) for p in parts):
        raise ValueError(f"lease URL {url!r}: expected k8s://NAMESPACE/NAME (lower-case DNS names)")
    return parts[0], parts[1]


def micro_time(when: datetime) -> str:
    """A Kubernetes MicroTime (RFC 3339 with microseconds, UTC)."""
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class K8sLease:
    """A coordination.k8s.io/v1 Lease, held by one broker at a time. Not thread-safe: one thread (the
    broker's lease keeper) calls it."""

    def __init__(
        self,
        url: str,
        *,
        timeout: float,
        server: str | None = None,
        account: Path = SERVICE_ACCOUNT,
        environ: Mapping[str, str] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`server` (tests: a fake API server's http:// URL) defaults to the in-cluster one; the token and
        CA are read from `account` when there; POD_NAME and POD_NAMESPACE come from `environ`."""
        env = os.environ if environ is None else environ
        self.namespace, self.name = parse_url(url)
        self.timeout = timeout
        self.clock = clock
        self.server = (server or _in_cluster_server(env)).rstrip("/")
        self.token_path = account / "token"
        self.pod = env.get("POD_NAME") or None
        self.pod_namespace = env.get("POD_NAMESPACE") or _read(account / "namespace") or self.namespace
        handlers: list[urllib.request.BaseHandler] = [urllib.request.ProxyHandler({})]  # never via a proxy
        ca = account / "ca.crt"
        if self.server.startswith("https://"):
            context = ssl.create_default_context(cafile=str(ca) if ca.exists() else None)
            handlers.append(urllib.request.HTTPSHandler(context=context))
        self._opener = urllib.request.build_opener(*handlers)
        self.path = f"/apis/coordination.k8s.io/v1/namespaces/{self.namespace}/leases"
        self._record: JsonObj | None = None  # the Lease as last read or written
        self._observed_rv: str | None = None  # its resourceVersion when this process last saw it change...
        self._observed_at = 0.0  # ...and when (own monotonic clock)
        self._held = False
        self._term_from = 0.0  # when this broker sent the write that last renewed its term
        self._duration = 0.0
        self._labelled: bool | None = None  # our pod's label as last set (None: not known)
        self.label_errors = 0
        if self.pod is None:
            log.warning("broker lease %s: POD_NAME is not set; the active broker's pod will not be labelled", url)

    # ---- the Lease protocol -------------------------------------------------------------------

    def acquire_or_renew(self, holder: str, duration: float) -> LeaseState:
        """Renew the lease this broker holds, or take it when it is free or expired. Raises
        LeaseUnavailable when the API server cannot be reached or refuses the service account."""
        now = self.clock()
        record = self._record
        renewing = self._held and record is not None and self._holder(record) == holder
        if renewing and self._write(record, holder, duration, now):  # the usual renewal: one round trip
            return self._settle(holder)
        for _ in range(ATTEMPTS):
            record = self._get()
            self._observe(record, now)
            if record is not None and self._holder(record) not in ("", holder) and self._left(record, now) > 0:
                break  # another broker holds it and its term runs
            if self._write(record, holder, duration, now):
                return self._settle(holder)
        self._held = False
        return self._settle(holder)

    def release(self, holder: str) -> None:
        """Give the lease up on a clean stop, so a standby takes over at once (best effort)."""
        record = self._record
        if not self._held or record is None or self._holder(record) != holder:
            return
        spec = {**record.get("spec", {}), "holderIdentity": "", "leaseDurationSeconds": 1}
        spec["renewTime"] = micro_time(datetime.now(UTC))
        try:
            self._request("PUT", f"{self.path}/{self.name}", {**record, "spec": spec})
        except LeaseUnavailable as exc:
            log.warning(
                "broker lease: could not release %s/%s (%s); it expires on its own", self.namespace, self.name, exc
            )
        self._held = False
        self._label(False)

    def close(self) -> None:
        """The process ends: its pod no longer serves, whether it released the lease or was deposed."""
        if self._labelled is not False:
            self._label(False)
        self._opener.close()

    # ---- the record ---------------------------------------------------------------------------

    @staticmethod
    def _holder(record: JsonObj) -> str:
        return str(record.get("spec", {}).get("holderIdentity") or "")

    @staticmethod
    def _epoch(record: JsonObj | None) -> int:
        value = record.get("spec", {}).get("leaseTransitions") if record is not None else 0
        return value if isinstance(value, int) and value >= 0 else 0

    def _observe(self, record: JsonObj | None, now: float) -> None:
        """client-go's observedTime: the moment this process saw the record change."""
        rv = record.get("metadata", {}).get("resourceVersion") if record is not None else None
        if rv != self._observed_rv or record is None:
            self._observed_rv, self._observed_at = rv, now
        self._record = record

    def _left(self, record: JsonObj, now: float) -> float:
        """Seconds left of another holder's term, counted from when we saw its last renewal."""
        seconds = record.get("spec", {}).get("leaseDurationSeconds")
        seconds = seconds if isinstance(seconds, int) and seconds > 0 else 0
        return self._observed_at + seconds - now

    def _write(self, record: JsonObj | None, holder: str, duration: float, now: float) -> bool:
        """Create, renew or take the Lease; False when someone else wrote first (409)."""
        stamp = micro_time(datetime.now(UTC))
        spec: JsonObj = {"holderIdentity": holder, "leaseDurationSeconds": max(1, math.ceil(duration))}
        spec["renewTime"] = stamp
        if record is None:
            spec.update(acquireTime=stamp, leaseTransitions=1)
            body: JsonObj = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": self.name, "namespace": self.namespace},
                "spec": spec,
            }
            status, answer = self._request("POST", self.path, body)
        else:
            old = record.get("spec", {})
            mine = self._holder(record) == holder
            spec["acquireTime"] = old.get("acquireTime", stamp) if mine else stamp
            spec["leaseTransitions"] = self._epoch(record) + (0 if mine else 1)
            status, answer = self._request("PUT", f"{self.path}/{self.name}", {**record, "spec": {**old, **spec}})
        if status == 409 or answer is None:
            return False
        self._observe(answer, now)
        self._held, self._term_from, self._duration = True, now, duration
        return True

    def _settle(self, holder: str) -> LeaseState:
        """The state to report, with our pod's label brought in line with it."""
        now = self.clock()
        record = self._record
        if self._held:
            state = LeaseState(True, self._epoch(record), holder, self._term_from + self._duration - now)
        elif record is None:
            state = LeaseState(False, 0, "", 0.0)
        else:
            other = self._holder(record)
            state = LeaseState(False, self._epoch(record), other, self._left(record, now) if other else 0.0)
        if self._labelled is not state.held:
            self._label(state.held)
        return state

    def _get(self) -> JsonObj | None:
        status, answer = self._request("GET", f"{self.path}/{self.name}")
        return None if status == 404 else answer

    # ---- the pod's label ----------------------------------------------------------------------

    def _label(self, active: bool) -> None:
        """Label (or unlabel) our pod; a failure is logged and tried again at the next renewal."""
        if self.pod is None:
            return
        patch = {"metadata": {"labels": {ACTIVE_LABEL: ACTIVE if active else None}}}
        path = f"/api/v1/namespaces/{self.pod_namespace}/pods/{self.pod}"
        try:
            status, _ = self._request("PATCH", path, patch, content_type="application/merge-patch+json")
        except LeaseUnavailable as exc:
            status, why = 0, str(exc)
        else:
            why = f"the API server answered {status}"
        if status == 200:
            self._labelled = active
            return
        self._labelled = None
        self.label_errors += 1
        log.warning("broker lease: cannot %s pod %s (%s)", "label" if active else "unlabel", self.pod, why)

    # ---- HTTP ---------------------------------------------------------------------------------

    def _request(
        self, method: str, path: str, body: JsonObj | None = None, *, content_type: str = "application/json"
    ) -> tuple[int, JsonObj | None]:
        """(status, JSON answer) for 2xx, (404 or 409, None); anything else is LeaseUnavailable."""
        headers = {"Accept": "application/json"}
        token = _read(self.token_path)  # read each time: a projected token is rotated under us
        if token:
            headers["Authorization"] = f"Bearer {token}"
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = content_type
        req = urllib.request.Request(self.server + path, data=data, method=method, headers=headers)
        where = f"{method} {self.server}{path}"
        try:
            with self._opener.open(req, timeout=self.timeout) as resp:
                answer = json.loads(resp.read(MAX_BODY))
                return int(resp.status), answer if isinstance(answer, dict) else None
        except urllib.error.HTTPError as exc:
            with exc:
                if exc.code in (404, 409):
                    return exc.code, None
                detail = exc.read(400).decode(errors="replace")
            raise LeaseUnavailable(f"{where} answered {exc.code} {exc.reason}: {detail}") from None
        except (OSError, ValueError) as exc:  # URLError, timeouts, refused, a garbled answer
            raise LeaseUnavailable(f"{where}: {exc}") from None


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def _in_cluster_server(env: Mapping[str, str]) -> str:
    host, port = env.get("KUBERNETES_SERVICE_HOST"), env.get("KUBERNETES_SERVICE_PORT")
    if not host or not port:
        raise ValueError(
            "a k8s:// lease needs the Kubernetes API server: KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT "
            "are not set (is the broker running in a pod?)"
        )
    return f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"
