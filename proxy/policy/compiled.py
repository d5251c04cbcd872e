"""The compiled, frozen recovery policy: what the engine reads as a snapshot at the start of a call.

Contract:
- Every value here is immutable and already validated; nothing in the request path re-checks it.
- `PolicySet.resolve(tool, annotations)` returns the effective `ToolPolicy` of one tool, applying the
  precedence of docs/policies.md ("Precedence") per setting: exact file > most specific glob >
  upstream annotations for the side-effect class > defaults file > built-in defaults.
- Each `ToolPolicy` carries `sources`: for every setting (keyed by its dotted attribute name, e.g.
  `attempts`, `backoff.max_s`), where its value came from: `<file>:<yaml key>`,
  `annotations:readOnlyHint`, `derived:...`, or `built-in`. `policies explain` prints them.
- Durations are float seconds (`_s` suffix).

Precedence (`resolve_tool_policy`), for EACH setting separately (a file only overrides the
settings it writes):
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
from dataclasses import dataclass, field
from enum import StrEnum
from fnmatch import fnmatchcase
from types import MappingProxyType
from typing import Any, Literal, Protocol


class Category(StrEnum):
    """The four error categories of docs/recovery.md, "Classification"."""

    TRANSIENT = "transient"
    VALIDATION = "validation"
    BUSINESS = "business"
    PERMISSION = "permission"


class SideEffect(StrEnum):
    """What repeating a tool could do: the side-effect class of docs/recovery.md, "Decision"."""

    READ_ONLY = "read_only"
    IDEMPOTENT = "idempotent"
    STATE_CHANGING = "state_changing"


@dataclass(frozen=True, slots=True)
class Backoff:
    """Exponential backoff with (by default) full jitter and a cap."""

    initial_s: float = 0.2
    max_s: float = 2.0
    multiplier: float = 2.0
    jitter: Literal["full", "none"] = "full"
    # The first wait after the upstream could not be reached at all (connection refused or reset,
    # a process that is not running or died in flight): multiplied each retry like `initial_s`,
    # capped by the policy's retry_after_cap, with equal jitter (between half and all of it), so
    # that the retries reach across a restart instead of spending every attempt within it.
    reconnect_s: float = 1.5


class TextPattern(Protocol):
    """A compiled rule regex: what `classify` uses of it (kept here so `recovery/` needs no RE2 import)."""

    pattern: str

    def search(self, text: str) -> object | None: ...


@dataclass(frozen=True, slots=True)
class Rule:
    """One classification rule of a tool's policy. A rule matches when every matcher it sets matches.

    - `text`: regex searched in the concatenated text content of an `isError` result.
    - `path` / `equals`: a dotted path into `structuredContent` (e.g. `error.code`); with `equals`
      the value must be one of them, without it the path must merely exist.
    - `jsonrpc_codes`: JSON-RPC error codes from the upstream.
    - `http_statuses`: HTTP statuses of an HTTP upstream.
    """

    name: str
    category: Category
    text: TextPattern | None = None  # RE2 (proxy/policy/regex.py): linear time, no backtracking
    path: tuple[str, ...] | None = None
    equals: tuple[Any, ...] | None = None
    jsonrpc_codes: frozenset[int] = frozenset()
    http_statuses: frozenset[int] = frozenset()
    retryable: bool | None = None  # None: follow the category; False: never retry what this rule matches


@dataclass(frozen=True, slots=True)
class IdempotencyKey:
    """Where the proxy places the per-call idempotency key it generates (identical on every attempt)."""

    location: Literal["argument", "meta"]
    name: str


@dataclass(frozen=True, slots=True)
class AntiStorm:
    """The anti-storm limits (enforced by `proxy.recovery.antistorm`). Built-in: Linkerd's retry
    budget (retries may add 20% to the calls of a 10 s window, and 10 per second always), and no
    circuit breaker unless `breaker_failures` is set."""

    retry_budget_ratio: float | None = 0.2
    retry_budget_min_per_s: float | None = 10.0
    breaker_failures: int | None = None
    breaker_cooldown_s: float | None = 30.0


@dataclass(frozen=True, slots=True)
class ToolPolicy:
    """The effective recovery policy of one tool."""

    tool: str
    side_effect: SideEffect
    retry_on: frozenset[Category] = frozenset({Category.TRANSIENT})
    attempts: int = 3  # total attempts, the first included
    deadline_s: float = 10.0
    attempt_timeout_s: float = 4.0
    min_attempt_s: float = 1.0  # minimum useful attempt time; default attempt_timeout_s / 4
    idle_timeout_s: float | None = None  # progress may extend an idle timer, never the hard cap
    backoff: Backoff = field(default_factory=Backoff)
    retry_after_cap_s: float = 30.0
    rules: tuple[Rule, ...] = ()
    trust_annotations: bool = True
    trust_error_category: bool = True
    unclassified: Category = Category.BUSINESS  # a label only: never retried (docs/recovery.md)
    idempotency_key: IdempotencyKey | None = None
    ledger_window_s: float = 60.0
    jsonrpc_errors_as_results: bool = True
    alternatives: tuple[str, ...] = ()
    status_check_tool: str | None = None
    anti_storm: AntiStorm = field(default_factory=AntiStorm)
    # OAuth scopes a caller's principal must hold to call the tool (jwt, tokens: else HTTP 403
    # insufficient_scope); empty: none. Not checked where the proxy knows no scopes (passthrough).
    required_scopes: frozenset[str] = frozenset()
    sources: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    # Derived: nothing in the policy acts before or during a first attempt (no idempotency key or
    # circuit breaker; an idle timer is the relay's), so the engine may make that attempt on its
    # direct path.
    direct: bool = field(init=False, repr=False, compare=False)
    # Derived: a first attempt's hard timeout, min(attempt timeout, deadline), and the bound of
    # handing its request over (a cold start may take the whole deadline), for a call starting now.
    first_timeout_s: float = field(init=False, repr=False, compare=False)
    first_send_s: float = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        direct = self.idempotency_key is None and self.anti_storm.breaker_failures is None
        object.__setattr__(self, "direct", direct)
        first = max(0.0, min(self.attempt_timeout_s, self.deadline_s))
        object.__setattr__(self, "first_timeout_s", first)
        object.__setattr__(self, "first_send_s", max(self.deadline_s, first))


@dataclass(frozen=True, slots=True)
class Layer:
    """The settings one policy file sets, as they apply to the tools it names.

    `values` holds only the settings the file actually sets, keyed by the dotted `ToolPolicy`
    attribute (`attempts`, `deadline_s`, `backoff.max_s`, `trust_annotations`, ...), already
    compiled to their `ToolPolicy` types. `lines` maps the same keys to the line in `file`.
    """

    file: str
    values: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    lines: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))


@dataclass(frozen=True, slots=True)
class PolicySet:
    """A complete, validated set of policies, versioned by a hash of the files' contents.

    `resolve` is implemented in `proxy.policy.compiled` (kept apart so this module stays a plain
    value definition that `recovery/` may import without pulling in YAML or pydantic). Results are
    cached per (tool, annotation hints): the set is immutable, so a cached answer never goes stale.
    `PolicySet(version="built-in")` with no layers resolves every tool to the built-in defaults.
    """

    version: str
    exact: Mapping[str, Layer] = field(default_factory=lambda: MappingProxyType({}))
    globs: tuple[tuple[str, Layer], ...] = ()  # (pattern, layer), most specific first
    defaults: Layer | None = None  # the defaults file, if the folder has one
    files: tuple[str, ...] = ()
    _cache: dict[tuple[str, bool, bool], ToolPolicy] = field(default_factory=dict, compare=False, repr=False)

    def resolve(self, tool: str, annotations: Mapping[str, Any] | None = None) -> ToolPolicy:
        return resolve_tool_policy(self, tool, annotations)


# -- precedence: resolving one tool's policy ------------------------------------------------------

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
