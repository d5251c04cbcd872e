"""The compose file and the monitoring stack of its `observability` profile, checked without pulling
an image (no registry is reachable here; `deploy/smoke.sh` runs what is built from our Dockerfile).

- `docker-compose config` (Debian's docker-compose 1.29) validates the file for every profile and
  with the host-network override; the profile adds exactly its four services.
- Prometheus: `promtool check config` on the profile's config with the rules beside it, as the
  compose mounts them (promtool also checks the rule file it loads).
- The OpenTelemetry collector: structurally (its own `validate` command is a binary from GitHub
  releases, which this machine cannot download, and no Debian or PyPI package carries it): every
  pipeline component is defined, only core-distribution components are used (the compose runs the
  core image), the receivers listen on the OTLP ports, the exporter reaches the `jaeger` service.
- Grafana: structurally: the data source URL names the `prometheus` service and its port, the
  dashboard provider's path is where the compose mounts the dashboards, and the dashboard picks
  that data source type.
- Every file the compose mounts exists in the repository.

A missing docker-compose or promtool skips its test, unless MCP_COMPOSE_REQUIRED=1 /
MCP_PROMETHEUS_REQUIRED=1 (CI), where that is an error.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
COMPOSE = REPO / "docker-compose.yml"
HOST_NETWORK = REPO / "deploy" / "compose.host-network.yml"
OBSERVABILITY = {"prometheus", "grafana", "otel-collector", "jaeger"}
BASE = {"pod", "upstream", "proxy"}
# What otel/opentelemetry-collector (the core distribution) is built with.
CORE_COMPONENTS = {
    "receivers": {"otlp", "nop"},
    "processors": {"batch", "memory_limiter"},
    "exporters": {"otlp", "otlphttp", "debug", "logging", "nop"},
    "extensions": {"zpages", "memory_ballast"},
}


def _required(tool: str, variable: str) -> str:
    found = shutil.which(tool)
    if found is None:
        if os.environ.get(variable, "") not in ("", "0", "false", "no"):
            pytest.fail(f"{variable} is set but {tool} is not installed")
        pytest.skip(f"{tool} is not installed")
    return found


def _compose_config(*args: str) -> dict[str, Any]:
    tool = _required("docker-compose", "MCP_COMPOSE_REQUIRED")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("COMPOSE_", "MCP_RECOVERY_"))}
    done = subprocess.run(
        [tool, "--project-directory", str(REPO), *args, "config"],
        capture_output=True,
        timeout=60,
        check=False,
        cwd=REPO,
        env=env,
    )
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    return yaml.safe_load(done.stdout)


def _file() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE.read_text())


@pytest.mark.parametrize(
    ("args", "services"),
    [
        (("-f", str(COMPOSE)), BASE),
        (("-f", str(COMPOSE), "--profile", "observability"), BASE | OBSERVABILITY),
        (("-f", str(COMPOSE), "-f", str(HOST_NETWORK)), {"upstream", "proxy"}),
        (("-f", str(COMPOSE), "-f", str(HOST_NETWORK), "--profile", "bridge-network-only"), BASE),
    ],
    ids=["default", "observability", "host-network", "host-network+pod"],
)
def test_docker_compose_config_validates_every_profile(args: tuple[str, ...], services: set[str]) -> None:
    config = _compose_config(*args)
    # docker-compose 1.29's `config` prints every service; `up` starts those without a profile
    # and those of an active one.
    active = {args[i + 1] for i, a in enumerate(args) if a == "--profile"}
    started = {
        name for name, svc in config["services"].items() if not svc.get("profiles") or active & set(svc["profiles"])
    }
    assert started == services


def _compose_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("COMPOSE_", "MCP_RECOVERY_"))}
    env.update(extra)
    return env


def _proxy_endpoint(*args: str, **extra: str) -> str | None:
    tool = _required("docker-compose", "MCP_COMPOSE_REQUIRED")
    done = subprocess.run(
        [tool, *args, "config"], capture_output=True, timeout=60, check=False, cwd=REPO, env=_compose_env(**extra)
    )
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    return yaml.safe_load(done.stdout)["services"]["proxy"]["environment"].get("OTEL_EXPORTER_OTLP_ENDPOINT")


def test_the_observability_profile_receives_the_proxys_spans_without_a_variable() -> None:
    endpoint = urlsplit(_proxy_endpoint("-f", str(COMPOSE), "--profile", "observability") or "")
    collector = yaml.safe_load((REPO / "deploy" / "observability" / "otel-collector.yml").read_text())
    http = collector["receivers"]["otlp"]["protocols"]["http"]["endpoint"]
    assert endpoint.scheme == "http"
    assert endpoint.hostname == "otel-collector" and str(endpoint.port) == http.rpartition(":")[2]
    assert "otel-collector" in _file()["services"], "the endpoint names the profile's collector service"


def test_the_otlp_variable_still_moves_or_turns_off_the_export() -> None:
    compose = ("-f", str(COMPOSE))
    assert _proxy_endpoint(*compose, MCP_RECOVERY_OTLP_ENDPOINT="http://tempo:4318") == "http://tempo:4318"
    assert _proxy_endpoint(*compose, MCP_RECOVERY_OTLP_ENDPOINT="") in ("", None), "set but empty: no spans"
    # On the host network no collector runs and `otel-collector` resolves nowhere: off by default.
    assert _proxy_endpoint(*compose, "-f", str(HOST_NETWORK)) in ("", None)


def test_every_mounted_file_exists() -> None:
    for name, service in _file()["services"].items():
        for volume in service.get("volumes", []):
            source = volume.split(":", 1)[0]
            if source.startswith("./"):
                assert (REPO / source).exists(), f"{name} mounts {source}, which is not in the repository"


def test_promtool_accepts_the_profiles_prometheus_config_and_rules(tmp_path: Path) -> None:
    promtool = _required("promtool", "MCP_PROMETHEUS_REQUIRED")
    prometheus = _file()["services"]["prometheus"]
    # lay the files out as the compose mounts them
    for volume in prometheus["volumes"]:
        source, target = volume.split(":")[:2]
        if source.startswith("./"):
            (tmp_path / Path(target).name).write_bytes((REPO / source).read_bytes())
    config = tmp_path / "prometheus.yml"
    done = subprocess.run([promtool, "check", "config", str(config)], capture_output=True, timeout=60, check=False)
    out = done.stdout.decode() + done.stderr.decode()
    assert done.returncode == 0, out
    assert "rules.yml" in out and "SUCCESS" in out, "the rule file was loaded and checked"
    scrape = yaml.safe_load(config.read_text())["scrape_configs"][0]
    (target,) = scrape["static_configs"][0]["targets"]
    host, _, port = target.partition(":")
    proxy_env = _file()["services"]["proxy"]["environment"]
    assert host == "pod" and port == proxy_env["MCP_RECOVERY_ADMIN"].rpartition(":")[2]
    assert f"{host}:*" in json.loads(proxy_env["MCP_RECOVERY_ALLOWED_HOSTS"]), "the admin Host check lets it in"


def test_the_collector_config_uses_defined_core_components_and_reaches_jaeger() -> None:
    config = yaml.safe_load((REPO / "deploy" / "observability" / "otel-collector.yml").read_text())
    for kind, allowed in CORE_COMPONENTS.items():
        for name in config.get(kind) or {}:
            assert name.split("/")[0] in allowed, f"{kind} {name} is not in the core collector"
    service = config["service"]
    for name in service.get("extensions", []):
        assert name in config["extensions"]
    (pipeline,) = service["pipelines"].items()
    assert pipeline[0] == "traces"
    for kind in ("receivers", "processors", "exporters"):
        for name in pipeline[1][kind]:
            assert name in config[kind], f"pipeline uses undefined {kind[:-1]} {name}"
    assert pipeline[1]["processors"][0] == "memory_limiter", "first, as the collector recommends"
    protocols = config["receivers"]["otlp"]["protocols"]
    assert protocols["grpc"]["endpoint"].endswith(":4317") and protocols["http"]["endpoint"].endswith(":4318")
    (exporter,) = (config["exporters"][name] for name in pipeline[1]["exporters"])
    host, _, port = exporter["endpoint"].partition(":")
    jaeger = _file()["services"]["jaeger"]
    assert host == "jaeger" and port == "4317" and jaeger["environment"]["COLLECTOR_OTLP_ENABLED"] == "true"


def test_grafana_provisioning_points_at_the_compose_prometheus_and_dashboards() -> None:
    services = _file()["services"]
    grafana = services["grafana"]
    mounts = dict(tuple(v.split(":")[:2]) for v in grafana["volumes"] if v.startswith("./"))
    datasources = yaml.safe_load((REPO / mounts_source(mounts, "datasources")).read_text())
    (source,) = datasources["datasources"]
    url = urlsplit(source["url"])
    assert source["type"] == "prometheus" and url.hostname == "prometheus"
    assert any(port.endswith(f":{url.port}") for port in services["prometheus"]["ports"])
    providers = yaml.safe_load((REPO / mounts_source(mounts, "provisioning/dashboards")).read_text())
    (provider,) = providers["providers"]
    assert provider["options"]["path"] == mounts["./deploy/grafana/dashboards"]
    dashboard = json.loads((REPO / "deploy" / "grafana" / "dashboards" / "mcp-recovery-proxy.json").read_text())
    (variable,) = [v for v in dashboard["templating"]["list"] if v["name"] == "datasource"]
    assert variable["type"] == "datasource" and variable["query"] == "prometheus"
    home = grafana["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert home == provider["options"]["path"] + "/mcp-recovery-proxy.json"


def mounts_source(mounts: dict[str, str], fragment: str) -> str:
    (source,) = [s for s in mounts if fragment in s and s.endswith(".yml")]
    return source.removeprefix("./")
