"""The deploy files agree with the proxy's shutdown (docs/reliability.md): the image stops it with
SIGTERM, and Kubernetes and compose wait longer than its grace period plus what follows it
(ending the rest: 5 s and 1 s for its cancellations, the HTTP server: 5 s, every stdio child at
once: 3 s) before they kill it; the upstream container of the Kubernetes pod stays up through
the grace period."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from proxy.settings import Settings

REPO = Path(__file__).resolve().parent.parent
AFTER_GRACE_S = 14


def test_the_bound_covers_stopping_the_stdio_children() -> None:
    from proxy.upstream.stdio import STOP_BOUND_S

    assert 5 + 1 + 5 + STOP_BOUND_S <= AFTER_GRACE_S


def grace_s() -> float:
    return Settings().shutdown_grace_s


def test_the_default_grace_period_is_20_s() -> None:
    assert grace_s() == 20.0


def test_the_image_stops_with_sigterm_and_names_the_grace_period() -> None:
    dockerfile = (REPO / "Dockerfile").read_text()
    assert re.search(r"^STOPSIGNAL SIGTERM$", dockerfile, re.M)
    assert f"MCP_RECOVERY_SHUTDOWN_GRACE_S={grace_s():g}" in dockerfile


def test_kubernetes_waits_for_the_grace_period_and_keeps_the_upstream_up() -> None:
    docs = list(yaml.safe_load_all((REPO / "deploy/kubernetes/deployment.yaml").read_text()))
    pod = next(d for d in docs if d and d.get("kind") == "Deployment")["spec"]["template"]["spec"]
    containers = {c["name"]: c for c in pod["containers"]}
    env = {e["name"]: e.get("value") for e in containers["mcp-recovery-proxy"]["env"]}
    grace = float(env["MCP_RECOVERY_SHUTDOWN_GRACE_S"])
    assert pod["terminationGracePeriodSeconds"] >= grace + AFTER_GRACE_S
    sleep = containers["mcp-server"]["lifecycle"]["preStop"]["exec"]["command"][-1]
    assert float(re.search(r"sleep\(([\d.]+)\)", sleep).group(1)) > grace  # type: ignore[union-attr]


def test_compose_waits_for_the_grace_period() -> None:
    proxy = yaml.safe_load((REPO / "docker-compose.yml").read_text())["services"]["proxy"]
    grace = float(proxy["environment"]["MCP_RECOVERY_SHUTDOWN_GRACE_S"])
    assert float(proxy["stop_grace_period"].removesuffix("s")) >= grace + AFTER_GRACE_S
