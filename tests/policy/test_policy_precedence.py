"""Precedence per setting: exact file > most specific glob > annotations (side_effect) > defaults > built-in."""

from __future__ import annotations

import pytest

from proxy.policy.compiled import Category, IdempotencyKey, PolicySet, SideEffect, glob_specificity

FOLDER = {
    "defaults.yaml": """
        attempts: 4
        deadline: 20s
        side_effect: idempotent
        backoff: {initial: 100ms, max: 1s}
        report: {alternatives: [from_defaults]}
    """,
    "billing.yaml": """
        tools: ['billing_*']
        attempts: 2
        backoff: {max: 3s}
        unclassified: business
    """,
    "billing-refund.yaml": """
        tools: ['billing_refund*']
        attempts: 5
        ledger_window: 5m
    """,
    "exact.yaml": """
        tools: [billing_refund_v2]
        attempts: 1
        side_effect: state_changing
    """,
}

# (tool, annotations, dotted attribute, value, source)
TABLE = [
    ("billing_refund_v2", None, "attempts", 1, "exact.yaml:attempts"),
    ("billing_refund_v1", None, "attempts", 5, "billing-refund.yaml:attempts"),
    ("billing_invoice", None, "attempts", 2, "billing.yaml:attempts"),
    ("other", None, "attempts", 4, "defaults.yaml:attempts"),
    # a setting the exact file does not write falls through to the globs, then defaults
    ("billing_refund_v2", None, "ledger_window_s", 300.0, "billing-refund.yaml:ledger_window"),
    ("billing_refund_v2", None, "unclassified", Category.BUSINESS, "billing.yaml:unclassified"),
    ("billing_refund_v2", None, "deadline_s", 20.0, "defaults.yaml:deadline"),
    ("billing_refund_v2", None, "retry_after_cap_s", 30.0, "built-in"),
    # nested keys merge per key
    ("billing_invoice", None, "backoff.max_s", 3.0, "billing.yaml:backoff.max"),
    ("billing_invoice", None, "backoff.initial_s", 0.1, "defaults.yaml:backoff.initial"),
    ("billing_invoice", None, "backoff.multiplier", 2.0, "built-in"),
    ("other", None, "alternatives", ("from_defaults",), "defaults.yaml:report.alternatives"),
    # side_effect: files naming the tool beat annotations; annotations beat the defaults file
    ("billing_refund_v2", {"readOnlyHint": True}, "side_effect", SideEffect.STATE_CHANGING, "exact.yaml:side_effect"),
    ("other", {"readOnlyHint": True}, "side_effect", SideEffect.READ_ONLY, "annotations:readOnlyHint"),
    ("other", {"idempotentHint": True}, "side_effect", SideEffect.IDEMPOTENT, "annotations:idempotentHint"),
    (
        "other",
        {"readOnlyHint": False, "idempotentHint": False},
        "side_effect",
        SideEffect.STATE_CHANGING,
        "annotations:unannotated",
    ),
    ("other", None, "side_effect", SideEffect.STATE_CHANGING, "annotations:unannotated"),
    ("other", {"readOnlyHint": "yes"}, "side_effect", SideEffect.STATE_CHANGING, "annotations:unannotated"),
]


def _attr(obj: object, dotted: str) -> object:
    for part in dotted.split("."):
        obj = getattr(obj, part)
    return obj


@pytest.mark.parametrize(("tool", "annotations", "attr", "value", "source"), TABLE)
def test_precedence(policies, tool, annotations, attr, value, source) -> None:
    policy = policies(FOLDER).resolve(tool, annotations)
    assert _attr(policy, attr) == value
    found = policy.sources[attr]
    assert found == source or found.endswith(f"/policies/{source}")


def test_untrusted_annotations_fall_back_to_defaults_file(policies) -> None:
    folder = {**FOLDER, "defaults.yaml": "side_effect: idempotent\ntrust: {annotations: false}\n"}
    policy = policies(folder).resolve("other", {"readOnlyHint": True})
    assert policy.side_effect is SideEffect.IDEMPOTENT
    assert policy.sources["side_effect"].endswith("defaults.yaml:side_effect")


def test_untrusted_annotations_per_tool_and_no_defaults_means_state_changing(policies) -> None:
    folder = {"t.yaml": "tools: [t]\ntrust: {annotations: false}\n"}
    policy = policies(folder).resolve("t", {"readOnlyHint": True})
    assert (policy.side_effect, policy.sources["side_effect"]) == (SideEffect.STATE_CHANGING, "built-in")


def test_builtin_defaults_without_any_file() -> None:
    policy = PolicySet(version="built-in").resolve("anything", {"readOnlyHint": True})
    assert policy.side_effect is SideEffect.READ_ONLY
    assert (policy.attempts, policy.deadline_s, policy.attempt_timeout_s, policy.min_attempt_s) == (
        3,
        58.0,
        58.0,
        14.5,
    )
    assert policy.idle_timeout_s is None
    assert policy.backoff.reconnect_s == 3.5
    assert policy.sources["attempts"] == "built-in"
    assert policy.sources["attempt_timeout_s"] == "derived:deadline"
    assert policy.sources["min_attempt_s"] == "derived:attempt_timeout/4"


def test_without_an_attempt_timeout_an_attempt_may_use_the_whole_deadline_whatever_sets_it(policies) -> None:
    """No timer of the proxy cuts an attempt the deadline still allows, unless a policy asks for one:
    a deadline set anywhere (longer or shorter than the built-in one) carries the attempt timeout."""
    ps = policies({"defaults.yaml": "deadline: 10s\n", "a.yaml": "tools: [a]\nattempt_timeout: 4s\n"})
    other = ps.resolve("other")
    assert (other.deadline_s, other.attempt_timeout_s, other.min_attempt_s) == (10.0, 10.0, 2.5)
    assert other.sources["attempt_timeout_s"] == "derived:deadline"
    assert (ps.resolve("a").attempt_timeout_s, ps.resolve("a").min_attempt_s) == (4.0, 1.0)
    long = policies({"report.yaml": "tools: [report]\ndeadline: 5m\n"}).resolve("report")
    assert (long.deadline_s, long.attempt_timeout_s, long.idle_timeout_s) == (300.0, 300.0, None)


def test_min_attempt_time_follows_attempt_timeout_unless_set(policies) -> None:
    ps = policies({"a.yaml": "tools: [a]\nattempt_timeout: 8s\n", "b.yaml": "tools: [b]\nmin_attempt_time: 300ms\n"})
    assert ps.resolve("a").min_attempt_s == 2.0
    assert ps.resolve("b").min_attempt_s == 0.3


@pytest.mark.parametrize(
    ("patterns", "order"),
    [
        (["*", "billing_*", "billing_refund_*"], ["billing_refund_*", "billing_*", "*"]),
        (["a*b*", "a*b"], ["a*b", "a*b*"]),  # same prefix: fewer wildcards first
        (["*_refund", "b*"], ["b*", "*_refund"]),  # longer literal prefix beats a longer pattern
        (["b?x", "b*x"], ["b*x", "b?x"]),  # equal by rule: pattern text decides, never file order
    ],
)
def test_glob_specificity(patterns: list[str], order: list[str]) -> None:
    assert sorted(patterns, key=glob_specificity) == order


def test_most_specific_glob_wins_regardless_of_file_names(policies) -> None:
    ps = policies(
        {"a.yaml": "tools: ['billing_refund_*']\nattempts: 5\n", "z.yaml": "tools: ['billing_*']\nattempts: 2\n"}
    )
    assert ps.resolve("billing_refund_x").attempts == 5
    assert [pattern for pattern, _ in ps.globs] == ["billing_refund_*", "billing_*"]


def test_globs_are_case_sensitive_and_whole_name(policies) -> None:
    ps = policies({"g.yaml": "tools: ['get_*']\nattempts: 1\n"})
    assert ps.resolve("get_user").attempts == 1
    assert ps.resolve("GET_user").attempts == 3
    assert ps.resolve("x_get_user").attempts == 3


def test_compiled_values(policies) -> None:
    policy = policies(
        {
            "t.yaml": """
                tools: [t]
                retry_on: []
                idle_timeout: 1500ms
                idempotency_key: {location: meta, name: idem}
                report: {status_check_tool: t_status, alternatives: [x, y]}
                anti_storm: {retry_budget_ratio: 0.2, breaker_failures: 5, breaker_cooldown: 30s}
                rules:
                  - {name: nf, category: validation, path: error.code, equals: [NOT_FOUND, 404]}
                  - {name: busy, category: transient, text: '(?i)busy', jsonrpc_codes: [-32001], retryable: false}
                  - {name: one, category: business, path: a.b, equals: x}
            """
        }
    ).resolve("t")
    assert policy.retry_on == frozenset()
    assert policy.idle_timeout_s == 1.5
    assert policy.idempotency_key == IdempotencyKey(location="meta", name="idem")
    assert (policy.status_check_tool, policy.alternatives) == ("t_status", ("x", "y"))
    assert (policy.anti_storm.retry_budget_ratio, policy.anti_storm.breaker_cooldown_s) == (0.2, 30.0)
    nf, busy, one = policy.rules
    assert (nf.path, nf.equals, nf.category) == (("error", "code"), ("NOT_FOUND", 404), Category.VALIDATION)
    assert busy.text is not None and busy.text.search("Server BUSY") and busy.jsonrpc_codes == {-32001}
    assert busy.retryable is False and nf.retryable is None
    assert one.equals == ("x",)


def test_explicit_null_switches_an_optional_setting_off(policies) -> None:
    ps = policies({"defaults.yaml": "idle_timeout: 2s\n", "t.yaml": "tools: [t]\nidle_timeout: null\n"})
    assert ps.resolve("other").idle_timeout_s == 2.0
    assert ps.resolve("t").idle_timeout_s is None


def test_resolution_is_cached_per_tool_and_hints(policies) -> None:
    ps = policies({"t.yaml": "tools: [t]\n"})
    assert ps.resolve("t", {"readOnlyHint": True}) is ps.resolve("t", {"readOnlyHint": True, "title": "x"})
    assert ps.resolve("t") is not ps.resolve("t", {"readOnlyHint": True})


def test_unforeseen_glob_combination_is_clamped_not_raised(policies) -> None:
    ps = policies({"a.yaml": "tools: ['x_*']\nattempt_timeout: 8s\n", "b.yaml": "tools: ['x_y*']\ndeadline: 5s\n"})
    policy = ps.resolve("x_yz")
    assert (policy.attempt_timeout_s, policy.deadline_s) == (5.0, 5.0)
    assert policy.sources["attempt_timeout_s"].endswith("a.yaml:attempt_timeout (clamped to deadline)")
