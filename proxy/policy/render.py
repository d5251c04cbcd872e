"""Showing a `ToolPolicy` to people and to JSON: `explain`, `/policies`, and logs.

Contract: pure functions of a `ToolPolicy`; keys are the YAML keys a person edits (so the output
reads like a policy file), durations print as `250ms` / `10s` / `2m` for people and as float
seconds (`<key>_s`) in JSON.
"""

from __future__ import annotations

from typing import Any

from proxy.policy.compiled import SETTINGS, YAML_KEY, Rule, ToolPolicy

_DURATIONS = frozenset(
    {
        "deadline_s",
        "attempt_timeout_s",
        "min_attempt_s",
        "idle_timeout_s",
        "backoff.initial_s",
        "backoff.max_s",
        "backoff.reconnect_s",
        "retry_after_cap_s",
        "ledger_window_s",
        "anti_storm.breaker_cooldown_s",
    }
)


def format_duration(seconds: float) -> str:
    if seconds and seconds < 1:
        return f"{seconds * 1000:g}ms"
    if seconds >= 60 and seconds % 60 == 0:
        return f"{seconds / 60:g}m"
    return f"{seconds:g}s"


def _value(policy: ToolPolicy, key: str) -> Any:
    obj: Any = policy
    for part in key.split("."):
        obj = getattr(obj, part)
    return obj


def rule_dict(rule: Rule) -> dict[str, Any]:
    out: dict[str, Any] = {"name": rule.name, "category": rule.category.value}
    if rule.text is not None:
        out["text"] = rule.text.pattern
    if rule.path is not None:
        out["path"] = ".".join(rule.path)
    if rule.equals is not None:
        out["equals"] = list(rule.equals)
    if rule.jsonrpc_codes:
        out["jsonrpc_codes"] = sorted(rule.jsonrpc_codes)
    if rule.http_statuses:
        out["http_statuses"] = sorted(rule.http_statuses)
    if rule.retryable is not None:
        out["retryable"] = rule.retryable
    return out


def json_value(value: Any) -> Any:
    """A setting's value as plain JSON types."""
    if isinstance(value, frozenset):
        return sorted(str(v) for v in value)
    if isinstance(value, tuple):
        return [rule_dict(v) if isinstance(v, Rule) else json_value(v) for v in value]
    if hasattr(value, "location") and hasattr(value, "name"):  # IdempotencyKey
        return {"location": value.location, "name": value.name}
    if isinstance(value, str):
        return str(value)  # StrEnum -> its value
    return value


def policy_as_dict(policy: ToolPolicy) -> dict[str, Any]:
    """`{"tool": ..., "settings": {yaml_key(_s): value}, "sources": {yaml_key: source}}`."""
    settings: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for key, yaml_key in SETTINGS:
        out_key = f"{yaml_key}_s" if key in _DURATIONS else yaml_key
        settings[out_key] = json_value(_value(policy, key))
        sources[yaml_key] = policy.sources.get(key, "built-in")
    return {"tool": policy.tool, "settings": settings, "sources": sources}


def text_value(key: str, value: Any) -> str:
    if value is None:
        return "-"
    if key in _DURATIONS:
        return format_duration(value)
    if key == "rules":
        return ", ".join(rule.name for rule in value) or "(none)"
    if isinstance(value, frozenset | tuple):
        return "[" + ", ".join(sorted(str(v) for v in value)) + "]"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:g}"
    if hasattr(value, "location") and hasattr(value, "name"):
        return f"{value.location}:{value.name}"
    return str(value)


def policy_rows(policy: ToolPolicy) -> list[tuple[str, str, str]]:
    """(yaml key, value as text, source) for every setting, in `SETTINGS` order."""
    return [
        (YAML_KEY[key], text_value(key, _value(policy, key)), policy.sources.get(key, "built-in"))
        for key, _ in SETTINGS
    ]


def format_table(rows: list[tuple[str, str, str]], header: tuple[str, str, str]) -> str:
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(2)]
    return "\n".join(f"{a.ljust(widths[0])}  {b.ljust(widths[1])}  {c}".rstrip() for a, b, c in [header, *rows])
