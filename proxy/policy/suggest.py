"""What to change in a policy folder, from what a running proxy observed (`observed` of its
`/status.json`, proxy/telemetry/observed.py): the analysis behind `policies suggest` and the
status page's advice.

Contract:
- `advise(policy_set, observed)` is a pure function of a loaded `PolicySet` and an `observed`
  snapshot (JSON as `/status.json` carries it, also from a saved file: every value is checked,
  nothing in it is trusted to be well-formed). It returns an `Advice`:
  - per tool the proxy saw (not "other", the label of calls to tools the upstream did not list),
    its successful attempts' p50/p99/slowest against the timer that would cut an attempt under
    this set: `attempt_timeout`, or `deadline` where no file sets `attempt_timeout` (it is then
    the deadline). Where the slowest success is above that timer (the timer would have cut it) or
    the p99 is within `NEAR` of it, a new value: the next step of `LADDER` at or above the larger
    of `HEADROOM` * p99 and the slowest success; the deadline is raised with the attempt
    timeout where that passes it (`attempt_timeout` ≤ `deadline`);
  - per unclassified error text (most frequent first) a rule that classifies it, in the syntax of
    a policy file: a `text` regex (RE2, checked to match the observed text) built from the text
    with digits as `\\d+`, whitespace as `\\s+` and redacted parts as `.*`, cut to about
    `REGEX_SOURCE_CHARS` characters of the text; `jsonrpc_codes` or `http_statuses` where the
    error was a JSON-RPC error or an HTTP status (rules for those must name them); a category
    guessed from the text's words (`guess_category`: which word, or that none hinted, is said);
  - whether a policy file names the tool (exactly or by a glob);
  - every rule of the set that matched no observed attempt, with the called tools it covers.
- The advice never depends on the proxy's live policy set: it is about the folder given.
- `advice_dict(advice)` is the JSON form (`policies suggest --json`, the status page).
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from proxy.errors import Dispatch, FailureKind
from proxy.policy.compiled import GLOB_CHARS, Category, Layer, PolicySet, ToolPolicy, specific_layers
from proxy.policy.regex import compile_rule_text
from proxy.policy.render import format_duration
from proxy.recovery.classify import classify
from proxy.recovery.outcome import RpcError, ToolError, TransportError

NEAR = 0.8  # a p99 at 80% of the timer: the slow tail is about to be cut
HEADROOM = 1.5
REGEX_SOURCE_CHARS = 80
MAX_TOOLS = 500  # tools read from a snapshot (the proxy keeps fewer)
MAX_TEXTS = 20  # texts read per tool
OTHER = "other"
# Timer values a person would write, in seconds; past the last, whole minutes.
LADDER: tuple[float, ...] = (
    0.1, 0.2, 0.25, 0.3, 0.4, 0.5, 0.6, 0.75, 0.8, 1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 10, 12, 15,
    20, 25, 30, 40, 45, 50, 58, 60, 90, 120, 180, 240, 300, 600, 900, 1200, 1800, 3600,
)  # fmt: skip
CLIENT_TIMEOUT_S = 60.0  # the MCP SDK clients' default request timeout

# (category, words): the first word found in the lower-cased text decides (docs/policies.md).
CATEGORY_WORDS: tuple[tuple[Category, tuple[str, ...]], ...] = (
    (
        Category.TRANSIENT,
        (
            "try again", "temporar", "unavailable", "timed out", "timeout", "busy", "overload",
            "rate limit", "too many requests", "throttl", "deadlock", "lock wait", "retry",
            "connection reset", "later",
        ),
    ),
    (Category.PERMISSION, ("permission", "forbidden", "not allowed", "unauthori", "denied", "access")),
    (
        Category.VALIDATION,
        ("invalid", "required", "missing", "must be", "malformed", "expected", "unknown", "not found"),
    ),
)  # fmt: skip

_PLACEHOLDER = r"\[redacted\]|\[argument\]|\[withheld[^\]]*\]"
_TOKENS = re.compile(rf"({_PLACEHOLDER}|\d+|\s+)")
_RE2_SPECIAL = frozenset("\\.^$|?*+()[]{}-/#&~")
_RPC_PREFIX = re.compile(r"^JSON-RPC error (-?\d+): ?")
_HTTP_PREFIX = re.compile(r"^http_status \(HTTP (\d{3})\): ?")
_SDK_PREFIX = re.compile(r"^Error executing tool [^:]{0,200}: ")  # what the MCP SDKs put before a tool's words
SLUG_WORDS = 5


@dataclass
class TimerAdvice:
    setting: str  # attempt_timeout | deadline
    current_s: float
    source: str  # where the current value comes from (a file:key, derived:..., built-in)
    suggested_s: float
    why: str


@dataclass
class RuleAdvice:
    name: str
    category: str
    text: str | None  # the rule's regex
    jsonrpc_codes: list[int]
    http_statuses: list[int]
    count: int
    sample: str  # the observed text (redacted, bounded)
    guessed: str  # why this category


@dataclass
class ToolAdvice:
    tool: str
    named: bool
    files: list[str]
    successes: int
    p50_ms: float | None
    p99_ms: float | None
    slowest_ms: float | None
    timeouts: int
    unclassified: int
    texts_dropped: int
    timers: list[TimerAdvice] = field(default_factory=list)
    rules: list[RuleAdvice] = field(default_factory=list)
    note: str | None = None


@dataclass
class NeverMatched:
    file: str
    rule: str
    called_tools: list[str]  # observed tools this rule applies to


@dataclass
class Advice:
    version: str
    tools: list[ToolAdvice]
    unnamed: list[str]
    never_matched: list[NeverMatched]
    dropped_tools: int = 0


def ladder_ceil(seconds: float) -> float:
    """The first `LADDER` value at or above `seconds` (whole minutes past it)."""
    for step in LADDER:
        if step >= seconds - 1e-9:
            return float(step)
    return float(math.ceil(seconds / 60.0) * 60)


def _int(value: Any, default: int = 0) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else default


def _ms(value: Any) -> float | None:
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) and value >= 0:
        return float(value)
    return None


def guess_category(text: str) -> tuple[Category, str]:
    """A category for an unclassified text, and why: from its words, else `business` (what an
    unclassified failure is labelled by default: never retried)."""
    lowered = text.lower()
    for category, words in CATEGORY_WORDS:
        for word in words:
            if word in lowered:
                return category, f"category guessed from the word {word!r}; review it"
    return Category.BUSINESS, "category business: no word hints at another (business is never retried); review it"


def _escape(literal: str) -> str:
    return "".join("\\" + c if c in _RE2_SPECIAL else c for c in literal)


def text_regex(text: str) -> str | None:
    """An RE2 regex that matches `text` and texts that differ from it in digits, whitespace or the
    parts redaction replaced; None when the text has nothing literal to match."""
    if text.endswith("…"):
        text = text[:-1]  # cut by `bounded`: the rest is unknown
    parts: list[str] = []
    literal = 0
    used = 0
    wild = False
    for token in _TOKENS.split(text):
        if not token:
            continue
        if used >= REGEX_SOURCE_CHARS:
            break
        used += len(token)
        if re.fullmatch(_PLACEHOLDER, token):
            if parts and parts[-1] != ".*":
                parts.append(".*")
                wild = True
        elif token.isspace():
            if parts and parts[-1] not in (r"\s+", ".*"):
                parts.append(r"\s+")
        elif token.isdigit():
            if parts and parts[-1] == r"\d+":
                continue
            parts.append(r"\d+")
        else:
            parts.append(_escape(token))
            literal += len(token)
    while parts and parts[-1] in (".*", r"\s+"):
        parts.pop()
    if literal < 3:
        return None
    return ("(?s)" if wild else "") + "".join(parts)


def _checked(regex: str | None, text: str) -> str | None:
    """`regex` when RE2 takes it and it matches `text`; else the longest literal run of `text`."""
    if regex is not None:
        try:
            if compile_rule_text(regex).search(text) is not None:
                return regex
        except ValueError:
            pass
    runs = [t for t in _TOKENS.split(text.rstrip("…")) if t and not _TOKENS.fullmatch(t)]
    best = max(runs, key=len, default="")
    return _escape(best[:REGEX_SOURCE_CHARS]) if len(best) >= 3 else None


@functools.lru_cache(maxsize=4096)  # the status page asks again every poll: same texts, same answer
def rule_regex(text: str) -> str | None:
    """The `text` regex of a rule that classifies `text` (see `text_regex`), checked with RE2."""
    return _checked(text_regex(text), text)


def _slug(text: str) -> str:
    """A rule name's words: the text's first few, without the SDKs' `Error executing tool X:`."""
    text = _SDK_PREFIX.sub("", re.sub(_PLACEHOLDER, " ", text))
    words = re.findall(r"[a-z]+", text.lower())[:SLUG_WORDS]
    return "-".join(words)[:40].strip("-") or "error"


def _rule_for(entry: Mapping[str, Any], taken: set[str]) -> RuleAdvice | None:
    sample = entry.get("text")
    if not isinstance(sample, str) or not sample:
        return None
    outcome = entry.get("outcome")
    code = entry.get("code")
    body = sample
    codes: list[int] = []
    statuses: list[int] = []
    if outcome == "jsonrpc_error":
        match = _RPC_PREFIX.match(sample)
        body = sample[match.end() :] if match else sample
        number = int(match.group(1)) if match else code
        if isinstance(number, int) and not isinstance(number, bool):
            codes = [number]
    elif outcome == "transport_error":
        match = _HTTP_PREFIX.match(sample)
        if match is None:
            return None  # only an HTTP status can be unclassified among transport failures
        body = sample[match.end() :]
        statuses = [int(match.group(1))]
    regex = rule_regex(body) if body else None
    if regex is None and not codes and not statuses:
        return None
    category, why = guess_category(body)
    base = f"observed-{_slug(body)}"
    name, n = base, 2
    while name in taken:
        name, n = f"{base}-{n}", n + 1
    taken.add(name)
    return RuleAdvice(name, category.value, regex, codes, statuses, _int(entry.get("count"), 1), sample, why)


def _classified_now(rule: RuleAdvice, outcome: Any, policy: ToolPolicy) -> bool:
    """Whether the policy in force now classifies the failure `rule` was drafted for: the text was
    unclassified when the proxy saw it, and a rule applied since (this very draft, say) may cover
    it. The failure is rebuilt from what was observed and classified as the proxy would."""
    body = rule.sample
    failure: Any
    if rule.jsonrpc_codes:
        failure = RpcError({"code": rule.jsonrpc_codes[0], "message": _RPC_PREFIX.sub("", body, count=1)})
    elif rule.http_statuses:
        detail = _HTTP_PREFIX.sub("", body, count=1)
        failure = TransportError(FailureKind.HTTP_STATUS, Dispatch.UNKNOWN, detail, http_status=rule.http_statuses[0])
    elif outcome == "tool_error" or outcome is None:
        failure = ToolError({"isError": True, "content": [{"type": "text", "text": body}]})
    else:
        return False
    return not classify(failure, policy).defaulted


def _timers(tool: str, policy_set: PolicySet, seen: Mapping[str, Any]) -> list[TimerAdvice]:
    policy = policy_set.resolve(tool)
    p99_ms, slowest_ms = _ms(seen.get("p99_ms")), _ms(seen.get("slowest_ms"))
    if not _int(seen.get("successes")) or p99_ms is None or slowest_ms is None:
        return []
    p99_s, slowest_s = p99_ms / 1000.0, slowest_ms / 1000.0
    derived = policy.sources.get("attempt_timeout_s") == "derived:deadline"
    timer, timer_s = ("deadline", policy.deadline_s) if derived else ("attempt_timeout", policy.attempt_timeout_s)
    if slowest_s <= timer_s and p99_s < NEAR * timer_s:
        return []
    value = ladder_ceil(max(HEADROOM * p99_s, slowest_s))
    if value <= timer_s:
        return []
    seen_text = f"p99 {format_duration(round(p99_s, 3))}, slowest {format_duration(round(slowest_s, 3))}"
    cut = "would have cut" if slowest_s > timer_s else f"is within {round((1 - NEAR) * 100)}% of"
    why = f"{seen_text} of {_int(seen.get('successes'))} successful attempt(s): {timer} {cut} them"
    key = "deadline_s" if derived else "attempt_timeout_s"
    out = [TimerAdvice(timer, timer_s, policy.sources.get(key, ""), value, why)]
    if not derived and value > policy.deadline_s:
        out.append(
            TimerAdvice(
                "deadline",
                policy.deadline_s,
                policy.sources.get("deadline_s", ""),
                value,
                f"attempt_timeout {format_duration(value)} may not exceed the deadline",
            )
        )
    if value > CLIENT_TIMEOUT_S - 2:
        out[-1].why += f"; above {CLIENT_TIMEOUT_S:g}s, a client's own default timeout, raise the client's too"
    return out


def _layers(policy_set: PolicySet) -> list[Layer]:
    seen: dict[str, Layer] = {}
    for layer in [*policy_set.exact.values(), *(layer for _, layer in policy_set.globs)]:
        seen.setdefault(layer.file, layer)
    if policy_set.defaults is not None:
        seen.setdefault(policy_set.defaults.file, policy_set.defaults)
    return list(seen.values())


def advise(policy_set: PolicySet, observed: Mapping[str, Any]) -> Advice:
    raw_tools = observed.get("tools")
    entries = [t for t in raw_tools if isinstance(t, dict)][:MAX_TOOLS] if isinstance(raw_tools, list) else []
    tools: list[ToolAdvice] = []
    matched: dict[str, set[str]] = {}  # "<file>:rules" -> rule names seen matching through it
    called: dict[str, list[str]] = {}  # "<file>:rules" -> observed tools whose rules come from it
    for seen in entries:
        tool = seen.get("tool")
        if not isinstance(tool, str) or not tool or tool == OTHER:
            continue
        layers = specific_layers(policy_set, tool)
        policy = policy_set.resolve(tool)
        rules_from = policy.sources.get("rules", "")
        called.setdefault(rules_from, []).append(tool)
        names = seen.get("rules_matched")
        if isinstance(names, dict):
            matched.setdefault(rules_from, set()).update(n for n in names if isinstance(n, str))
        advice = ToolAdvice(
            tool=tool,
            named=bool(layers),
            files=[layer.file for layer in layers],
            successes=_int(seen.get("successes")),
            p50_ms=_ms(seen.get("p50_ms")),
            p99_ms=_ms(seen.get("p99_ms")),
            slowest_ms=_ms(seen.get("slowest_ms")),
            timeouts=_int(seen.get("timeouts")),
            unclassified=_int(seen.get("unclassified")),
            texts_dropped=_int(seen.get("texts_dropped")),
        )
        if any(c in tool for c in GLOB_CHARS):
            advice.note = "its name has * ? or [, which a policy file reads as a glob: no file can name it exactly"
        advice.timers = _timers(tool, policy_set, seen)
        taken = {rule.name for rule in policy.rules}
        texts = seen.get("texts")
        if isinstance(texts, list):
            ordered = sorted((t for t in texts if isinstance(t, dict)), key=lambda t: -_int(t.get("count")))
            for entry in ordered[:MAX_TEXTS]:
                rule = _rule_for(entry, taken)
                if rule is not None and not _classified_now(rule, entry.get("outcome"), policy):
                    advice.rules.append(rule)
        tools.append(advice)
    never: list[NeverMatched] = []
    for layer in _layers(policy_set):
        rules = layer.values.get("rules") or ()
        key = f"{layer.file}:rules"
        for rule in rules:
            if rule.name not in matched.get(key, set()):
                never.append(NeverMatched(layer.file, rule.name, sorted(called.get(key, []))[:20]))
    return Advice(
        version=policy_set.version,
        tools=tools,
        unnamed=[t.tool for t in tools if not t.named and t.note is None],
        never_matched=never,
        dropped_tools=_int(observed.get("dropped_tools")),
    )


def advice_dict(advice: Advice) -> dict[str, Any]:
    return asdict(advice)
