"""The on-disk policy file: strict pydantic models of one YAML file (docs/policies.md).

Contract:
- Unknown keys are errors (`extra="forbid"`), so a typo never silently falls back to a default.
- Every validator raises a `ValueError` whose text says what is wrong *and* how to fix it; the
  loader (`proxy.policy.compile`) prefixes it with the file, line and key.
- A field left out of the file is "not set" (`model_fields_set`), which is different from a value:
  precedence works per setting, so only the settings a file writes override anything.
- Durations are strings `250ms`, `10s`, `2m`, `1h` (also combined, `1m30s`) or plain numbers of
  seconds; they become float seconds.
- Invariants between settings (attempt_timeout <= deadline, min_attempt_time <= attempt_timeout,
  backoff initial <= max) are checked by the loader on each tool's *effective* values, because
  they may come from different files.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, StrictBool, StrictInt, field_validator

from proxy.policy.compiled import Category, SideEffect
from proxy.policy.regex import compile_rule_text

MAX_ATTEMPTS = 10
# Blocks whose keys merge one by one across files (docs/policies.md): a file sets some of them.
MERGED_BLOCKS = frozenset({"backoff", "trust", "report", "anti_storm"})
# The keys whose empty value (`idle_timeout: null`) switches off what a less specific file set;
# any other key left empty, at any depth, is a problem (`tools` has problems of its own).
NULL_MEANS_OFF = frozenset({"idle_timeout", "idempotency_key"})
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h)")
_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
DURATION_HINT = "write it like 250ms, 10s, 2m or 1m30s (a plain number means seconds)"


# How much of a value or key from the file a problem line repeats: a problem is one line, and a
# file can hold keys and values of any size (or aliases that expand into more).
SHOWN_CHARS = 80


def shown(value: object) -> str:
    """`repr(value)`, bounded to SHOWN_CHARS."""
    text = repr(value)
    return text if len(text) <= SHOWN_CHARS else text[: SHOWN_CHARS - 1] + "…"


def parse_duration_s(value: object) -> float:
    """`250ms` -> 0.25, `2m` -> 120.0, `1m30s` -> 90.0, `3` -> 3.0. Raises ValueError with a fix."""
    if isinstance(value, bool) or value is None:
        raise ValueError(f"{shown(value)} is not a duration; {DURATION_HINT}")
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str):
        text = value.strip().replace(" ", "")
        try:
            seconds = float(text)
        except ValueError:
            parts = _DURATION_PART.findall(text)
            if not text or "".join(n + u for n, u in parts) != text:
                raise ValueError(f"{shown(value)} is not a duration; {DURATION_HINT}") from None
            seconds = sum(float(n) * _UNIT_S[u] for n, u in parts)
    else:
        raise ValueError(f"{shown(value)} is not a duration; {DURATION_HINT}")
    if seconds != seconds or seconds < 0 or seconds == float("inf"):
        raise ValueError(f"{shown(value)} must be zero or more; {DURATION_HINT}")
    return seconds


def _positive_duration_s(value: object) -> float:
    seconds = parse_duration_s(value)
    if seconds <= 0:
        raise ValueError(f"{shown(value)} must be longer than zero; {DURATION_HINT}")
    return seconds


Duration = Annotated[float, BeforeValidator(parse_duration_s)]
PositiveDuration = Annotated[float, BeforeValidator(_positive_duration_s)]


def _number(value: object) -> object:
    """A YAML number, as written: not `true` (pydantic's lax float reads it as 1.0), not a quoted
    string, not .nan or .inf (no limit compares with them)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"expected a number, got {shown(value)}")
    if value != value or value in (float("inf"), float("-inf")):
        raise ValueError(f"{shown(value)} is not a usable number; write a finite number like 0.2 or 10")
    return value


Number = Annotated[float, BeforeValidator(_number)]


def _nonempty_name(value: str) -> str:
    if not value.strip() or value != value.strip():
        raise ValueError(f"{shown(value)} is not a usable name; write the name without surrounding spaces")
    return value


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class BackoffModel(_Strict):
    """`backoff:` - exponential, capped, with full jitter unless `jitter: none`."""

    initial: Duration = 0.2
    max: PositiveDuration = 2.0
    multiplier: Number = 2.0
    jitter: Literal["full", "none"] = "full"
    reconnect: PositiveDuration = 1.5

    @field_validator("multiplier", mode="before")
    @classmethod
    def _multiplier(cls, value: object) -> object:
        if not isinstance(value, bool) and isinstance(value, int | float) and value == value and value < 1:
            raise ValueError(f"{shown(value)} must be a number of at least 1 (2 doubles the wait each retry)")
        return value


class RuleModel(_Strict):
    """One entry of `rules:`; every matcher it sets must match."""

    name: str
    category: Category
    text: str | None = None
    path: str | None = None
    equals: Any = None
    jsonrpc_codes: list[StrictInt] = []
    http_statuses: list[StrictInt] = []
    retryable: StrictBool | None = None

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        return _nonempty_name(value)

    @field_validator("text")
    @classmethod
    def _regex(cls, value: str | None) -> str | None:
        if value is not None:
            compile_rule_text(value)  # RE2 (proxy/policy/regex.py): its ValueError names the fix
        return value

    @field_validator("path")
    @classmethod
    def _path(cls, value: str | None) -> str | None:
        if value is not None and (not value or any(not part for part in value.split("."))):
            raise ValueError(
                f"{shown(value)} is not a dotted path; write keys of structuredContent joined by dots, like error.code"
            )
        return value

    @field_validator("http_statuses")
    @classmethod
    def _statuses(cls, value: list[int]) -> list[int]:
        for status in value:
            if not 100 <= status <= 599:
                raise ValueError(f"{status} is not an HTTP status; use numbers from 100 to 599")
        return value

    def check(self) -> list[tuple[str, str]]:
        """Problems across fields, as (key, message); the loader adds file and line."""
        problems: list[tuple[str, str]] = []
        if not (self.text or self.path or self.jsonrpc_codes or self.http_statuses):
            problems.append(
                (
                    "name",
                    f"rule {self.name!r} matches nothing; set at least one of text, path, "
                    "jsonrpc_codes or http_statuses",
                )
            )
        if "equals" in self.model_fields_set and self.path is None:
            problems.append(("equals", "equals needs a path; add path: <dotted key> to say what to compare"))
        if self.retryable and self.category is not Category.TRANSIENT:
            problems.append(
                (
                    "retryable",
                    f"only transient failures can be retried, but this rule says "
                    f"{self.category.value}; remove retryable or set category: transient",
                )
            )
        return problems


class TrustModel(_Strict):
    """`trust:` - whether to believe the upstream's tool annotations and errorCategory."""

    annotations: StrictBool = True
    error_category: StrictBool = True


class IdempotencyKeyModel(_Strict):
    """`idempotency_key:` - where the proxy puts the per-call key it generates."""

    location: Literal["argument", "meta"]
    name: str

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        return _nonempty_name(value)


class ReportModel(_Strict):
    """`report:` - hints added to an unresolved result."""

    alternatives: list[str] = []
    status_check_tool: str | None = None


class AntiStormModel(_Strict):
    """`anti_storm:` - the retry budget and the circuit breaker (proxy.recovery.antistorm)."""

    retry_budget_ratio: Number | None = None
    retry_budget_min_per_s: Number | None = None
    breaker_failures: StrictInt | None = None
    breaker_cooldown: PositiveDuration | None = None

    @field_validator("retry_budget_ratio")
    @classmethod
    def _ratio(cls, value: float | None) -> float | None:
        if value is not None and not 0 <= value <= 1:
            raise ValueError(f"{value} must be between 0 and 1 (0.2 allows retries of 20% of calls)")
        return value

    @field_validator("retry_budget_min_per_s")
    @classmethod
    def _min_per_s(cls, value: float | None) -> float | None:
        if value is not None and value < 0:
            raise ValueError(f"{value} must be zero or more retries per second")
        return value

    @field_validator("breaker_failures")
    @classmethod
    def _failures(cls, value: int | None) -> int | None:
        if value is not None and value < 1:
            raise ValueError(f"{value} must be at least 1 consecutive failure")
        return value


class PolicyFile(_Strict):
    """One YAML file. `tools` is required except in the defaults file, where it is not allowed."""

    tools: list[str] | None = None
    side_effect: SideEffect | None = None
    retry_on: list[str] | None = None
    attempts: StrictInt | None = None
    deadline: PositiveDuration | None = None
    attempt_timeout: PositiveDuration | None = None
    min_attempt_time: Duration | None = None
    idle_timeout: PositiveDuration | None = None
    backoff: BackoffModel | None = None
    retry_after_cap: Duration | None = None
    rules: list[RuleModel] | None = None
    trust: TrustModel | None = None
    unclassified: Category | None = None
    idempotency_key: IdempotencyKeyModel | None = None
    ledger_window: Duration | None = None
    jsonrpc_errors_as_results: StrictBool | None = None
    report: ReportModel | None = None
    anti_storm: AntiStormModel | None = None
    required_scopes: list[str] | None = None

    @field_validator("required_scopes")
    @classmethod
    def _scopes(cls, value: list[str] | None) -> list[str] | None:
        for scope in value or ():
            # RFC 6749 §3.3: scope-token = 1*( %x21 / %x23-5B / %x5D-7E ), so it fits a challenge
            if not scope or len(scope) > 128 or any(not ("!" <= c <= "~") or c in '"\\' for c in scope):
                raise ValueError(
                    f"{shown(scope)} is not an OAuth scope (1-128 visible ASCII characters, no quote or backslash)"
                )
        return value

    @field_validator("tools")
    @classmethod
    def _tools(cls, value: list[str] | None) -> list[str] | None:
        if value is not None:
            if not value:
                raise ValueError("the list is empty; name at least one tool, like tools: [refund]")
            for name in value:
                _nonempty_name(name)
        return value

    @field_validator("retry_on")
    @classmethod
    def _retry_on(cls, value: list[str] | None) -> list[str] | None:
        for item in value or ():
            if item != Category.TRANSIENT.value:
                raise ValueError(
                    f"{item!r} cannot be retried: only transient may be listed (validation needs "
                    "changed input, permission needs access, business needs an explanation); "
                    "write retry_on: [transient], or [] to retry nothing"
                )
        return value

    @field_validator("attempts")
    @classmethod
    def _attempts(cls, value: int | None) -> int | None:
        if value is not None and value < 1:
            raise ValueError(f"{value} is too few: attempts counts every call, the first included; use 1 for no retry")
        if value is not None and value > MAX_ATTEMPTS:
            raise ValueError(
                f"{value} is more than the cap of {MAX_ATTEMPTS} total attempts; more retries make an "
                f"outage worse. Use at most {MAX_ATTEMPTS}, or a longer deadline and backoff"
            )
        return value
