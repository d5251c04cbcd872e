"""`policies suggest`: the advice from what a proxy observed (proxy/policy/suggest.py) and the edits
that carry it out (proxy/policy/patch.py), checked by loading the edited folder with the real
loader and classifying the observed failures with the real classifier. Applying the diff with
`patch` and `git apply`: tests/policy/test_policy_suggest_patch.py (those start processes)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from proxy.errors import Dispatch, FailureKind
from proxy.policy import cli
from proxy.policy.compile import load_policy_dir
from proxy.policy.patch import plan, unified_diff
from proxy.policy.render import policy_as_dict
from proxy.policy.suggest import advise, guess_category, ladder_ceil, rule_regex
from proxy.recovery.classify import classify
from proxy.recovery.outcome import EvidenceSource, RpcError, ToolError, TransportError
from tests.policy.suggest_cases import HTTP, QUOTA, RPC, observation, write_folder


def _applied(folder: Path, tmp_path: Path) -> Path:
    """A copy of `folder` with the planned texts written: what applying the patch gives."""
    policy_set = load_policy_dir(folder)
    planned = plan(folder, policy_set, advise(policy_set, observation()))
    assert not planned.notes, planned.notes
    copy = tmp_path / "applied"
    copy.mkdir()
    for source in folder.iterdir():
        (copy / source.name).write_text(source.read_text())
    for name, (_, text) in planned.files.items():
        (copy / name).write_text(text)
    return copy


def _tool(advice: Any, name: str) -> Any:
    (tool,) = [t for t in advice.tools if t.tool == name]
    return tool


def test_a_timer_that_would_have_cut_successful_attempts_is_raised_above_the_slowest(tmp_path: Path) -> None:
    folder = write_folder(tmp_path / "policies")
    advice = advise(load_policy_dir(folder), observation())
    slow = _tool(advice, "slow")
    timers = {t.setting: t for t in slow.timers}
    assert set(timers) == {"attempt_timeout", "deadline"}
    assert timers["attempt_timeout"].current_s == 1.0
    assert (
        timers["attempt_timeout"].suggested_s >= slow.slowest_ms / 1000
        and timers["attempt_timeout"].suggested_s > slow.p99_ms / 1000
    )
    assert timers["deadline"].suggested_s >= timers["attempt_timeout"].suggested_s, "attempt_timeout <= deadline"
    assert "would have cut" in timers["attempt_timeout"].why
    applied = load_policy_dir(_applied(folder, tmp_path)).resolve("slow")
    assert applied.attempt_timeout_s == timers["attempt_timeout"].suggested_s
    assert applied.deadline_s == timers["deadline"].suggested_s


def test_a_tail_far_from_its_timer_gets_no_timer_advice(tmp_path: Path) -> None:
    folder = write_folder(tmp_path / "policies")
    advice = advise(load_policy_dir(folder), observation())
    assert _tool(advice, "flaky").timers == [], "50 ms under the 58 s deadline"


def test_where_no_file_sets_attempt_timeout_the_deadline_is_the_timer_to_raise(tmp_path: Path) -> None:
    folder = write_folder(tmp_path / "policies")
    (folder / "slow.yaml").write_text("tools: [slow]\ndeadline: 1200ms\n")
    (timer,) = _tool(advise(load_policy_dir(folder), observation()), "slow").timers
    assert (timer.setting, timer.current_s) == ("deadline", 1.2)
    assert timer.suggested_s == ladder_ceil(
        max(1.5 * _tool(advise(load_policy_dir(folder), observation()), "slow").p99_ms / 1000, 1.48)
    )


def test_each_suggested_rule_classifies_its_observed_text_in_the_patched_folder(tmp_path: Path) -> None:
    folder = write_folder(tmp_path / "policies")
    advice = advise(load_policy_dir(folder), observation())
    (quota,) = _tool(advice, "flaky").rules
    assert quota.count == 3 and quota.sample == QUOTA
    assert {r.sample for r in _tool(advice, "billing_refund").rules} == {RPC, HTTP}
    patched = load_policy_dir(_applied(folder, tmp_path))
    # The observed texts came redacted; the upstream's own had the argument in them.
    failures: list[tuple[str, Any, str]] = [
        (
            "flaky",
            ToolError(
                {
                    "isError": True,
                    "content": [{"type": "text", "text": QUOTA.replace("1234", "77").replace("[argument]", "order-9")}],
                }
            ),
            quota.name,
        ),
        (
            "billing_refund",
            RpcError({"code": -31999, "message": "backend said no"}),
            _tool(advice, "billing_refund").rules[0].name,
        ),
        (
            "billing_refund",
            TransportError(
                FailureKind.HTTP_STATUS,
                Dispatch.UNKNOWN,
                "upstream answered HTTP 418 I'm a teapot",
                http_status=418,
            ),
            _tool(advice, "billing_refund").rules[1].name,
        ),
    ]
    for tool, outcome, rule in failures:
        classified = classify(outcome, patched.resolve(tool))
        assert classified.evidence.source is EvidenceSource.RULE and classified.evidence.rule == rule, (
            tool,
            classified,
        )
        assert not classified.defaulted
    # before the patch, the same failures were unclassified
    original = load_policy_dir(folder)
    assert all(classify(outcome, original.resolve(tool)).defaulted for tool, outcome, _ in failures)


def test_a_text_the_folder_classifies_since_it_was_seen_gets_no_rule_again(tmp_path: Path) -> None:
    """The proxy keeps what it saw since it started: once the drafted rules are applied (and the
    folder reloaded), the same observation must not draft them again (it proposed `...-2`, then
    `...-3`, of rules the folder had)."""
    folder = write_folder(tmp_path / "policies")
    first = advise(load_policy_dir(folder), observation())
    assert _tool(first, "flaky").rules and len(_tool(first, "billing_refund").rules) == 2
    again = advise(load_policy_dir(_applied(folder, tmp_path)), observation())
    assert [(t.tool, t.rules) for t in again.tools if t.rules] == []


def test_rules_added_where_a_glob_gave_them_keep_the_inherited_ones(tmp_path: Path) -> None:
    folder = write_folder(tmp_path / "policies")
    patched = load_policy_dir(_applied(folder, tmp_path)).resolve("billing_refund")
    names = [rule.name for rule in patched.rules]
    assert names[0] == "card-declined", "the glob's rule, copied first: a file's list replaces the one below it"
    assert len(names) == 3
    declined = classify(ToolError({"isError": True, "content": [{"type": "text", "text": "card declined"}]}), patched)
    assert declined.evidence.rule == "card-declined"


def test_a_tool_no_file_names_gets_a_file_of_its_own_that_changes_nothing_else(tmp_path: Path) -> None:
    folder = write_folder(tmp_path / "policies")
    advice = advise(load_policy_dir(folder), observation())
    assert advice.unnamed == ["newtool"]
    assert "other" not in [t.tool for t in advice.tools], "not a tool: the label of unlisted ones"
    applied = _applied(folder, tmp_path)
    assert "tools: [newtool]" in (applied / "newtool.yaml").read_text()
    before = policy_as_dict(load_policy_dir(folder).resolve("newtool", {"readOnlyHint": True}))
    after = policy_as_dict(load_policy_dir(applied).resolve("newtool", {"readOnlyHint": True}))
    before.pop("sources"), after.pop("sources")
    assert before == after, "the annotations still decide its side effect; every value as before"


def test_rules_that_never_matched_are_listed_with_the_called_tools_they_cover(tmp_path: Path) -> None:
    folder = write_folder(tmp_path / "policies")
    never = {
        (Path(n.file).name, n.rule): n.called_tools
        for n in advise(load_policy_dir(folder), observation()).never_matched
    }
    assert never == {("flaky.yaml", "never"): ["flaky"], ("billing.yaml", "card-declined"): ["billing_refund"]}


def test_a_file_whose_rules_are_a_flow_list_is_left_with_a_note(tmp_path: Path) -> None:
    folder = write_folder(tmp_path / "policies")
    (folder / "flaky.yaml").write_text(
        "tools: [flaky]\nrules: [{name: lock, category: transient, text: 'lock wait'}]\n"
    )
    policy_set = load_policy_dir(folder)
    planned = plan(folder, policy_set, advise(policy_set, observation()))
    assert "flaky.yaml" not in planned.files
    assert any(note.startswith("flaky.yaml: its rules are a flow list") for note in planned.notes)


def test_the_diff_names_files_relative_to_the_folder(tmp_path: Path) -> None:
    folder = write_folder(tmp_path / "policies")
    policy_set = load_policy_dir(folder)
    diff = unified_diff(plan(folder, policy_set, advise(policy_set, observation())))
    assert "diff --git a/slow.yaml b/slow.yaml\n--- a/slow.yaml\n+++ b/slow.yaml\n" in diff
    assert "diff --git a/newtool.yaml b/newtool.yaml\nnew file mode 100644\n--- /dev/null\n+++ b/newtool.yaml\n" in diff
    assert str(tmp_path) not in diff


@pytest.mark.parametrize(
    ("text", "category"),
    [
        ("Service temporarily unavailable", "transient"),
        ("access denied for user", "permission"),
        ("field x is required", "validation"),
        ("the cat sat", "business"),
    ],
)
def test_the_category_of_a_suggested_rule_is_guessed_from_its_words(text: str, category: str) -> None:
    assert guess_category(text)[0].value == category


@pytest.mark.parametrize(
    "text",
    ["order 17 failed: [redacted] (code=9)", "a.b*c?(d)[e]{f}|g^h$ 12", "x" * 500, "oops…"],
)
def test_a_suggested_regex_is_accepted_by_re2_and_matches_its_text(text: str) -> None:
    from proxy.policy.regex import compile_rule_text

    regex = rule_regex(text)
    assert regex is not None
    assert compile_rule_text(regex).search(text.replace("[redacted]", "tok-123").rstrip("…")) is not None


def test_suggest_from_a_saved_status_prints_the_findings_and_the_patch_as_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = write_folder(tmp_path / "policies")
    saved = tmp_path / "status.json"
    saved.write_text(json.dumps({"poll_ms": 2000, "observed": observation()}))
    assert cli.suggest(str(folder), from_file=str(saved), as_json=True) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["unnamed"] == ["newtool"] and out["files"] == [
        "billing_refund.yaml",
        "flaky.yaml",
        "newtool.yaml",
        "slow.yaml",
    ]
    assert out["patch"].startswith("diff --git a/billing_refund.yaml")
    assert cli.suggest(str(folder), from_file=str(saved)) == 0
    captured = capsys.readouterr()
    assert captured.out == out["patch"], "the same patch, alone on stdout"
    assert "flaky: 3 unclassified error(s) seen" in captured.err


def test_suggest_says_in_one_line_why_it_has_no_snapshot(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = write_folder(tmp_path / "policies")
    saved = tmp_path / "status.json"
    saved.write_text(json.dumps({"poll_ms": 2000}))
    assert cli.suggest(str(folder), from_file=str(saved)) == 2
    assert "has no 'observed' part" in capsys.readouterr().err
    assert cli.suggest(str(folder), from_file=str(tmp_path / "missing.json")) == 2


def test_suggest_reads_the_admin_port_with_the_token_and_says_when_it_lacks_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A real HTTP exchange on loopback, served in this process (a thread): the bearer token of
    --admin-token-file goes with the request, and a 401 without it is one line naming the flag."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    body = json.dumps({"observed": observation()}).encode()
    seen: list[str | None] = []

    class Admin(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append(self.headers.get("authorization"))
            ok = self.path == "/status.json" and self.headers.get("authorization") == "Bearer tok-123"
            self.send_response(200 if ok else 401)
            self.send_header("content-type", "application/json")
            self.end_headers()
            self.wfile.write(body if ok else b"{}")

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Admin)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        folder = write_folder(tmp_path / "policies")
        token = tmp_path / "admin-token"
        token.write_text("tok-123\n")
        admin = f"127.0.0.1:{server.server_address[1]}"
        assert cli.suggest(str(folder), admin=admin) == 2
        assert "HTTP 401 (give --admin-token-file)" in capsys.readouterr().err
        assert cli.suggest(str(folder), admin=admin, admin_token_file=str(token), as_json=True) == 0
        assert json.loads(capsys.readouterr().out)["unnamed"] == ["newtool"]
        assert seen == [None, "Bearer tok-123"]
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
