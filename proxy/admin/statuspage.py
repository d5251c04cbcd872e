"""The status page of the admin port: what the proxy is doing now, without a monitoring stack.

Contract:
- `status_document(service, policies, observer)` is the JSON of `/status.json`: the recent and
  the problem calls and per-tool series from the `StatusObserver` (proxy/telemetry/status.py),
  circuits and retry-budget use per tool (the engine's `AntiStorm.snapshot`; open circuits first,
  at most `CIRCUITS_LIMIT` tools), live ledger entries
  with the seconds until they expire, the policy version and last reload error, the upstream's
  health, eras and restarts, and the tools the upstream listed (the names `explain` accepts).
  Built on the event loop from reads only: nothing here changes the engine's state.
- `observed` (when the admin port runs the `ObservedTools` observer): its snapshot as
  `policies suggest` reads it (proxy/telemetry/observed.py), and under `observed.advice` the
  advice against the active policy set (proxy/policy/suggest.py): per tool the timer to raise, the
  rules that would classify its unclassified texts, whether a file names it; the rules that never
  matched.
- `explain_document(service, tool)` is `policies explain` for one tool the upstream listed (its
  annotations as listed), or None for any other name: the page cannot be made to resolve names
  nobody listed.
- `page(nonce)` is the HTML (proxy/admin/static/status.html): no build step, no external asset (inline
  CSS, one inline script allowed by a per-response CSP nonce, inline SVG sparklines). The script polls `/status.json`
  every `POLL_MS` and renders every value with `textContent`/`createElement`, never as HTML, so
  an upstream's error text or tool name cannot inject markup. Strings are bounded here and the
  admin app passes every answer through the secret registry; reports are the callers' own
  redacted reports (no argument values, no credentials).
"""

from __future__ import annotations

from collections.abc import Callable
from importlib import resources
from typing import Any

from proxy.core.engine import Engine
from proxy.core.service import Service
from proxy.jsonrpc import bounded
from proxy.policy.compiled import specific_layers
from proxy.policy.render import policy_as_dict, policy_rows
from proxy.policy.suggest import advice_dict, advise
from proxy.telemetry.observed import ObservedTools
from proxy.telemetry.status import LABEL_LIMIT, StatusObserver

POLL_MS = 2000
LEDGER_LIMIT = 100
CIRCUITS_LIMIT = 200
TOOL_NAMES_LIMIT = 500


def status_document(
    service: Service,
    policies: Callable[[], dict[str, Any]] | None,
    observer: StatusObserver | None,
    observed: ObservedTools | None = None,
) -> dict[str, Any]:
    doc: dict[str, Any] = {"poll_ms": POLL_MS}
    doc.update(observer.snapshot() if observer is not None else {"recent": [], "problems": [], "tools": []})
    engine = service.tool_calls if isinstance(service.tool_calls, Engine) else None
    circuits: list[dict[str, Any]] = []
    ledger: list[dict[str, Any]] = []
    if engine is not None:
        now = engine.clock()
        policy_set = engine.policies()
        listed = service.catalog.tools
        rows = engine.antistorm.snapshot(now)
        # Open circuits first, then the busiest; bounded, since each row resolves a policy.
        rows.sort(key=lambda r: (r["circuit"] != "open", -float(r["window_calls"])))  # type: ignore[arg-type]
        for row in rows[:CIRCUITS_LIMIT]:
            tool = row["tool"]
            assert isinstance(tool, str)
            tool_def = listed.get(tool)
            anti = policy_set.resolve(tool, tool_def.get("annotations") if tool_def else None).anti_storm
            ratio, floor = anti.retry_budget_ratio, anti.retry_budget_min_per_s
            allowed = None
            if ratio is not None or floor is not None:
                allowed = (ratio or 0.0) * float(row["window_calls"]) + (floor or 0.0) * float(row["window_s"])  # type: ignore[arg-type]
            circuits.append({**row, "tool": bounded(tool, LABEL_LIMIT), "budget_allowed": allowed})
        entries = getattr(engine.ledger, "entries", None)
        if entries is not None:
            for entry in entries(now, limit=LEDGER_LIMIT):
                ledger.append(
                    {
                        "operation": entry.op[:16],
                        "budget_id": entry.budget_id,
                        "reason": entry.reason.value,
                        "expires_in_s": round(entry.retry_after_s(now), 1),
                        "approved": entry.approved,
                        "summary": dict(entry.summary),
                    }
                )
    doc["circuits"] = circuits
    # re-sends answered by an earlier execution, and undelivered answers held for them
    doc["resends"] = engine.resends.status() if engine is not None and engine.resends is not None else None
    doc["ledger"] = ledger
    snapshot = policies() if policies is not None else {}
    doc["policy"] = {
        "version": snapshot.get("version"),
        "last_error": snapshot.get("last_error"),
        "problems": snapshot.get("problems", [])[:20],
        "last_reload_at": snapshot.get("last_reload_at"),
        "reloads": snapshot.get("reloads"),
    }
    caps = service.capabilities
    health = service.health
    doc["upstream"] = {
        "description": service.upstream.description,
        "up": health.up,
        "why": bounded(health.why, 300) if health.why else None,
        "restarts": health.restarts,
        "eras": {"legacy": bool(caps and caps.legacy), "modern": bool(caps and caps.modern)},
        "sessions": len(service.sessions),
    }
    names = list(service.catalog.tools)
    doc["listed_tools"] = [bounded(n, LABEL_LIMIT) for n in names[:TOOL_NAMES_LIMIT]]
    doc["listed_total"] = len(names)
    if observed is not None:
        seen = observed.snapshot()
        if engine is not None:
            seen["advice"] = advice_dict(advise(engine.policies(), seen))
        doc["observed"] = seen
    return doc


def explain_document(service: Service, tool: str) -> dict[str, Any] | None:
    tool_def = service.catalog.tools.get(tool)
    if tool_def is None or not isinstance(service.tool_calls, Engine):
        return None
    policy_set = service.tool_calls.policies()
    annotations = tool_def.get("annotations")
    annotations = annotations if isinstance(annotations, dict) else None
    policy = policy_set.resolve(tool, annotations)
    files = [layer.file for layer in specific_layers(policy_set, tool)]
    if policy_set.defaults is not None:
        files.append(policy_set.defaults.file)
    return {
        "tool": tool,
        "version": policy_set.version,
        "files_applied": files,
        "annotations": annotations,
        "rows": [{"setting": k, "value": v, "from": f} for k, v, f in policy_rows(policy)],
        "policy": policy_as_dict(policy),
    }


_PAGE = resources.files("proxy.admin").joinpath("static/status.html").read_text(encoding="utf-8")


def page(nonce: str) -> str:
    return _PAGE.replace("{{NONCE}}", nonce).replace("{{POLL_MS}}", str(POLL_MS))
