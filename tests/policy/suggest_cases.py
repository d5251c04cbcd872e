"""A policy folder and what a proxy observed in front of it, shared by the `policies suggest` tests:
the observation is built by the proxy's own observer from the events a running proxy emits."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from proxy.telemetry.events import AttemptFinished, CallReported, CallSucceeded
from proxy.telemetry.observed import ObservedTools
from tests.fixtures.helpers import REPO_ROOT

FOLDER = {
    "slow.yaml": "tools: [slow]\nside_effect: read_only\nattempt_timeout: 1s\ndeadline: 2s\n",
    "flaky.yaml": (
        "# flaky: lookups that hit a lock now and then\n"
        "tools: [flaky]\n"
        "rules:\n"
        "  - name: lock\n"
        "    category: transient\n"
        "    text: 'lock wait'\n"
        "  - name: never\n"
        "    category: validation\n"
        "    text: 'no such thing'\n"
        "attempts: 2\n"
    ),
    "billing.yaml": "tools: ['billing_*']\nrules:\n- name: card-declined\n  category: business\n  text: declined\n",
}
QUOTA = "Quota exceeded for account 1234 on [argument]"
RPC = "JSON-RPC error -31999: backend said no"
HTTP = "http_status (HTTP 418): upstream answered HTTP 418 I'm a teapot"


def write_folder(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "defaults.yaml").write_text((REPO_ROOT / "policies" / "defaults.yaml").read_text())
    for name, text in FOLDER.items():
        (folder / name).write_text(text)
    return folder


def unclassified(
    observed: ObservedTools, tool: str, detail: str, outcome: str = "tool_error", code: Any = None
) -> None:
    observed.on_event(AttemptFinished("c", tool, 1, 0.01, outcome, "unclassified", "yes", "default"))
    report = {
        "classification": {"source": "default", "code": code, "rule": None, "defaulted": True},
        "attemptedSteps": [{"outcome": outcome, "detail": detail}],
    }
    observed.on_event(CallReported("c", tool, report))


def observation() -> dict[str, Any]:
    observed = ObservedTools()
    for i in range(50):
        observed.on_event(CallSucceeded("", "slow", 0.5 + i * 0.02, 0.6))  # slowest 1.48 s, past its 1 s timer
    for _ in range(20):
        observed.on_event(CallSucceeded("", "flaky", 0.05, 0.05))
    observed.on_event(AttemptFinished("c", "flaky", 1, 0.1, "tool_error", "transient", "yes", "rule", "lock"))
    for _ in range(3):
        unclassified(observed, "flaky", QUOTA)
    unclassified(observed, "billing_refund", RPC, "jsonrpc_error", -31999)
    unclassified(observed, "billing_refund", HTTP, "transport_error", 418)
    observed.on_event(CallSucceeded("", "newtool", 0.01, 0.01))
    observed.on_event(CallSucceeded("", "other", 0.01, 0.01))  # calls of tools the upstream did not list
    return observed.snapshot()
