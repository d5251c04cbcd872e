"""Precedence: the effective `ToolPolicy` of one tool from a `PolicySet`'s layers
(docs/policies.md, "Precedence").

Contract, for EACH setting separately (a file only overrides the settings it writes):
1. the file naming the tool exactly;
2. the matching globs, most specific first (`PolicySet.globs` is sorted by `glob_specificity`);
3. for `side_effect` only, when `trust.annotations` is on: the upstream's tool annotations
   (`readOnlyHint: true` -> read_only, else `idempotentHint: true` -> idempotent, else
   state_changing, as the MCP spec's defaults say);
4. the defaults file;
5. the built-in defaults (the `ToolPolicy` dataclass defaults; side_effect: state_changing).
`attempt_timeout` that no layer sets is the effective deadline (an attempt is cut only by the
deadline unless a policy asks for a shorter timer); `min_attempt_time` that no layer sets is
derived: a quarter of the effective attempt_timeout.
Invariants broken by a combination of globs the loader could not foresee are clamped (and the
source says so) rather than raised: the request path never fails on policy.
Stdlib only, so `PolicySet.resolve` stays cheap to import; results are cached per set.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from fnmatch import fnmatchcase
from types import MappingProxyType
from typing import Any

from proxy.policy.compiled import AntiStorm, Backoff, Layer, PolicySet, SideEffect, ToolPolicy

log = logging.getLogger("proxy.policy")

# (ToolPolicy dotted attribute, key in the YAML file), in the order `explain` prints them.
SETTINGS: tuple[tuple[str, str], ...] = (
    ("side_effect", "side_effect"),
    ("retry_on", "retry_on"),
    ("attempts", "attempts"),
    ("deadline_s", "deadline"),
    ("attempt_timeout_s", "attempt_timeout"),
    ("min_attempt_s", "min_attempt_time"),
    ("idle_timeout_s", "idle_timeout"),
    ("backoff.initial_s", "backoff.initial"),
    ("backoff.max_s", "backoff.max"),
    ("backoff.multiplier", "backoff.multiplier"),
    ("backoff.jitter", "backoff.jitter"),
    ("backoff.reconnect_s", "backoff.reconnect"),
    ("retry_after_cap_s", "retry_after_cap"),
    ("rules", "rules"),
    ("trust_annotations", "trust.annotations"),
    ("trust_error_category", "trust.error_category"),
    ("unclassified", "unclassified"),
    ("idempotency_key", "idempotency_key"),
    ("ledger_window_s", "ledger_window"),
    ("jsonrpc_errors_as_results", "jsonrpc_errors_as_results"),
    ("alternatives", "report.alternatives"),
    ("status_check_tool", "report.status_check_tool"),
    ("anti_storm.retry_budget_ratio", "anti_storm.retry_budget_ratio"),
    ("anti_storm.retry_budget_min_per_s", "anti_storm.retry_budget_min_per_s"),
    ("anti_storm.breaker_failures", "anti_storm.breaker_failures"),
    ("anti_storm.breaker_cooldown_s", "anti_storm.breaker_cooldown"),
    ("required_scopes", "required_scopes"),
)
YAML_KEY: Mapping[str, str] = MappingProxyType(dict(SETTINGS))
GLOB_CHARS = "*?["
BUILT_IN = "built-in"
_CACHE_MAX = 4096


def _attr(obj: object, dotted: str) -> Any:
    for part in dotted.split("."):
        obj = getattr(obj, part)
    return obj


# What a tool gets that no file sets a value for: the shipped defaults.yaml's values (a test
# keeps the two equal; docs/policies.md says why these numbers). `ToolPolicy`'s own field defaults
# are only for policies built in code (the recovery core's tables).
_BUILTIN_POLICY = ToolPolicy(
    tool="",
    side_effect=SideEffect.STATE_CHANGING,
    deadline_s=58.0,
    attempt_timeout_s=58.0,  # follows the effective deadline unless a file sets it (below)
    min_attempt_s=58.0 / 4,
    idle_timeout_s=None,
    backoff=Backoff(reconnect_s=3.5),
)
BUILTIN_VALUES: Mapping[str, Any] = MappingProxyType({k: _attr(_BUILTIN_POLICY, k) for k, _ in SETTINGS})


def is_glob(name: str) -> bool:
    return any(c in name for c in GLOB_CHARS)


def glob_specificity(pattern: str) -> tuple[int, int, int, str]:
    """Sort key, most specific first: longest literal prefix, then fewest wildcards, then most
    literal characters, then the pattern itself (so the order never depends on file order)."""
    prefix = len(pattern)
    for i, char in enumerate(pattern):
        if char in GLOB_CHARS:
            prefix = i
            break
    wildcards = sum(pattern.count(c) for c in GLOB_CHARS)
    literal = len(pattern) - wildcards
    return (-prefix, wildcards, -literal, pattern)


def specific_layers(policy_set: PolicySet, tool: str) -> list[Layer]:
    """The exact file (if any), then every matching glob, most specific first."""
    layers = [policy_set.exact[tool]] if tool in policy_set.exact else []
    layers.extend(layer for pattern, layer in policy_set.globs if fnmatchcase(tool, pattern))
    return layers


def annotation_side_effect(annotations: Mapping[str, Any] | None) -> tuple[SideEffect, str]:
    hints = annotations or {}
    if hints.get("readOnlyHint") is True:
        return SideEffect.READ_ONLY, "annotations:readOnlyHint"
    if hints.get("idempotentHint") is True:
        return SideEffect.IDEMPOTENT, "annotations:idempotentHint"
    return SideEffect.STATE_CHANGING, "annotations:unannotated"


def effective_values(
    layers: list[Layer], defaults: Layer | None, annotations: Mapping[str, Any] | None
) -> tuple[dict[str, Any], dict[str, str], dict[str, Layer]]:
    """(values, sources, origin layer) of every setting, before invariants are enforced."""
    chain = [*layers, defaults] if defaults is not None else layers
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    origin: dict[str, Layer] = {}
    for key, yaml_key in SETTINGS:
        candidates = layers if key == "side_effect" else chain
        for layer in candidates:
            if key in layer.values:
                values[key], sources[key], origin[key] = layer.values[key], f"{layer.file}:{yaml_key}", layer
                break
    if "side_effect" not in values:
        if values.get("trust_annotations", BUILTIN_VALUES["trust_annotations"]):
            values["side_effect"], sources["side_effect"] = annotation_side_effect(annotations)
        elif defaults is not None and "side_effect" in defaults.values:
            values["side_effect"] = defaults.values["side_effect"]
            sources["side_effect"], origin["side_effect"] = f"{defaults.file}:side_effect", defaults
    for key, _ in SETTINGS:
        if key not in values:
            if key == "min_attempt_s" and "attempt_timeout_s" in values:
                values[key], sources[key] = values["attempt_timeout_s"] / 4, "derived:attempt_timeout/4"
            else:
                values[key], sources[key] = BUILTIN_VALUES[key], BUILT_IN
    if sources["attempt_timeout_s"] == BUILT_IN:
        # No file sets an attempt timeout: an attempt may use whatever the deadline leaves (a
        # silent tool is never cut while the deadline allows it to finish).
        values["attempt_timeout_s"], sources["attempt_timeout_s"] = values["deadline_s"], "derived:deadline"
        if sources["min_attempt_s"] in (BUILT_IN, "derived:attempt_timeout/4"):
            values["min_attempt_s"], sources["min_attempt_s"] = values["deadline_s"] / 4, "derived:attempt_timeout/4"
    return values, {key: sources[key] for key, _ in SETTINGS}, origin


# (key that must be <= other, the other key)
INVARIANTS: tuple[tuple[str, str], ...] = (
    ("attempt_timeout_s", "deadline_s"),
    ("min_attempt_s", "attempt_timeout_s"),
    ("backoff.initial_s", "backoff.max_s"),
)


def invariant_violations(values: Mapping[str, Any]) -> list[tuple[str, str]]:
    return [(small, big) for small, big in INVARIANTS if values[small] > values[big]]


def resolve_tool_policy(policy_set: PolicySet, tool: str, annotations: Mapping[str, Any] | None = None) -> ToolPolicy:
    """The effective policy of `tool`; cached, so calling it on every tool call is cheap."""
    hints = annotations or {}
    cache_key = (tool, hints.get("readOnlyHint") is True, hints.get("idempotentHint") is True)
    cached = policy_set._cache.get(cache_key)
    if cached is not None:
        return cached
    values, sources, _ = effective_values(specific_layers(policy_set, tool), policy_set.defaults, hints)
    for small, big in invariant_violations(values):
        log.warning(
            "policy %s for tool %r: %s (%s) exceeds %s (%s); clamped",
            policy_set.version,
            tool,
            YAML_KEY[small],
            sources[small],
            YAML_KEY[big],
            sources[big],
        )
        values[small] = values[big]
        sources[small] = f"{sources[small]} (clamped to {YAML_KEY[big]})"
    policy = build_policy(tool, values, sources)
    if len(policy_set._cache) >= _CACHE_MAX:
        policy_set._cache.clear()  # bounded: tool names come from callers too
    policy_set._cache[cache_key] = policy
    return policy


def build_policy(tool: str, values: Mapping[str, Any], sources: Mapping[str, str]) -> ToolPolicy:
    return ToolPolicy(
        tool=tool,
        side_effect=values["side_effect"],
        retry_on=values["retry_on"],
        attempts=values["attempts"],
        deadline_s=values["deadline_s"],
        attempt_timeout_s=values["attempt_timeout_s"],
        min_attempt_s=values["min_attempt_s"],
        idle_timeout_s=values["idle_timeout_s"],
        backoff=Backoff(
            initial_s=values["backoff.initial_s"],
            max_s=values["backoff.max_s"],
            multiplier=values["backoff.multiplier"],
            jitter=values["backoff.jitter"],
            reconnect_s=values["backoff.reconnect_s"],
        ),
        retry_after_cap_s=values["retry_after_cap_s"],
        rules=values["rules"],
        trust_annotations=values["trust_annotations"],
        trust_error_category=values["trust_error_category"],
        unclassified=values["unclassified"],
        idempotency_key=values["idempotency_key"],
        ledger_window_s=values["ledger_window_s"],
        jsonrpc_errors_as_results=values["jsonrpc_errors_as_results"],
        alternatives=values["alternatives"],
        status_check_tool=values["status_check_tool"],
        anti_storm=AntiStorm(
            retry_budget_ratio=values["anti_storm.retry_budget_ratio"],
            retry_budget_min_per_s=values["anti_storm.retry_budget_min_per_s"],
            breaker_failures=values["anti_storm.breaker_failures"],
            breaker_cooldown_s=values["anti_storm.breaker_cooldown_s"],
        ),
        required_scopes=values["required_scopes"],
        sources=MappingProxyType(dict(sources)),
    )


def resolve_defaults(policy_set: PolicySet) -> ToolPolicy:
    """What a tool that no file names, with no annotations, gets (for `/policies`)."""
    values, sources, _ = effective_values([], policy_set.defaults, None)
    return build_policy("*", values, sources)
