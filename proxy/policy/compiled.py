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
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
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

    `resolve` is implemented in `proxy.policy.resolve` (kept apart so this module stays a plain
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
        from proxy.policy.resolve import resolve_tool_policy

        return resolve_tool_policy(self, tool, annotations)
