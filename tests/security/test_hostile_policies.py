"""Policies cannot hurt the proxy (freeze the event loop or exhaust memory): rule regexes run in
linear time (RE2), YAML anchors and aliases are refused before they expand, and a reload that fails
for any reason is recorded and keeps the last good set."""

from __future__ import annotations

import asyncio
import logging
import resource
import subprocess
from pathlib import Path

import pytest

from proxy.errors import PolicyError
from proxy.policy.compile import load_policy_dir
from proxy.policy.store import PolicyStore
from proxy.recovery.classify import classify
from proxy.recovery.outcome import outcome_from_response
from tests.fixtures.helpers import PYTHON, REPO_ROOT

pytestmark = pytest.mark.slow

DEFAULTS = "attempts: 3\n"
CATASTROPHIC = "tools: [echo]\nrules:\n  - name: stall\n    category: transient\n    text: '(a+)+b'\n"
# The 500-byte "billion laughs": nine levels of nine aliases, 9^9 leaves once expanded.
BOMB = "tools: [bomb]\na: &a [x,x,x,x,x,x,x,x,x]\n" + "".join(
    f"{c}: &{c} [*{p},*{p},*{p},*{p},*{p},*{p},*{p},*{p},*{p}]\n" for p, c in zip("abcdefgh", "bcdefghi", strict=True)
)
SMALL_BOMB = "tools: [bomb]\na: &a [x, x, x]\nb: [*a, *a, *a]\n"


def folder(tmp_path: Path, **files: str) -> Path:
    path = tmp_path / "policies"
    path.mkdir(exist_ok=True)
    (path / "defaults.yaml").write_text(DEFAULTS)
    for name, text in files.items():
        (path / f"{name}.yaml").write_text(text)
    return path


@pytest.mark.timeout(60)  # Python's backtracking `re` takes 2**64 steps here: the old code never returns
def test_a_catastrophic_rule_regex_is_matched_in_linear_time(tmp_path: Path) -> None:
    policy = load_policy_dir(folder(tmp_path, echo=CATASTROPHIC)).resolve("echo")
    echoed = "a" * 64  # an upstream error that repeats the caller's input
    response = {"jsonrpc": "2.0", "id": 1, "result": {"isError": True, "content": [{"type": "text", "text": echoed}]}}
    verdict = classify(outcome_from_response(response), policy)
    assert verdict.evidence.rule is None  # it did not match, and it returned
    # The same rule does match where it should: the engine is RE2, not a rule switched off.
    response["result"]["content"][0]["text"] = "aaab"
    assert classify(outcome_from_response(response), policy).evidence.rule == "stall"


def test_a_rule_regex_re2_cannot_run_is_a_policy_error_with_its_line(tmp_path: Path) -> None:
    text = "tools: [x]\nrules:\n  - name: r\n    category: transient\n    text: '(?<!un)lock'\n"
    with pytest.raises(PolicyError) as caught:
        load_policy_dir(folder(tmp_path, x=text))
    (problem,) = caught.value.problems
    assert problem.startswith("x.yaml:5: rules[0].text:") or ":5: rules[0].text:" in problem, problem
    assert "RE2" in problem and "lookaround" in problem


def test_yaml_aliases_are_refused_where_they_appear(tmp_path: Path) -> None:
    with pytest.raises(PolicyError) as caught:
        load_policy_dir(folder(tmp_path, bomb=SMALL_BOMB))
    (problem,) = caught.value.problems
    assert ":2:" in problem and "anchor or alias" in problem, problem


def _limit_memory() -> None:
    # The old code took this file to 2+ GB: bound the child so a regression fails instead of
    # taking the machine's memory from every other test.
    resource.setrlimit(resource.RLIMIT_AS, (1536 * 1024 * 1024, 1536 * 1024 * 1024))


def test_policies_check_refuses_a_billion_laughs_bomb_promptly(tmp_path: Path) -> None:
    assert len(BOMB) < 600
    path = folder(tmp_path, bomb=BOMB)
    done = subprocess.run(
        [PYTHON, "-m", "proxy", "policies", "check", str(path)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=_limit_memory,
        check=False,
    )
    assert done.returncode == 1, done.stderr[-2000:]
    told = done.stdout + done.stderr
    assert "bomb.yaml:2" in told and "anchor or alias" in told, told[-2000:]
    assert "MemoryError" not in told and "Traceback" not in told


@pytest.mark.anyio
async def test_a_reload_that_raises_anything_is_recorded_and_keeps_the_last_good_set(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = folder(tmp_path, echo="tools: [echo]\n")
    seen: list[tuple[str, str | None]] = []
    store = PolicyStore(path, on_reload=lambda result, _version, error: seen.append((result, error)))
    good = store.current.version
    # A real failure outside the validator: a file nested deeper than the YAML composer recurses.
    (path / "deep.yaml").write_text("tools: [deep]\nx: " + "[" * 20000 + "]" * 20000 + "\n")
    with caplog.at_level(logging.ERROR, logger="proxy.policy"):
        assert await store.reload("watch") == "error"
    assert store.current.version == good and store.reloads_error == 1
    assert store.last_error and "deep.yaml" in store.last_error
    assert seen == [("error", store.last_error)]
    assert store.snapshot()["last_error"] == store.last_error
    assert any("deep.yaml" in r.getMessage() for r in caplog.records)


@pytest.mark.anyio
async def test_a_loader_crash_such_as_memory_error_is_recorded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    store = PolicyStore(folder(tmp_path, echo="tools: [echo]\n"))
    good = store.current.version

    def exhausted() -> None:
        # Mocked: a real MemoryError cannot be provoked safely in a shared test run.
        raise MemoryError("cannot allocate")

    monkeypatch.setattr(store, "_load", exhausted)
    with caplog.at_level(logging.ERROR, logger="proxy.policy"):
        assert await asyncio.wait_for(store.reload("sighup"), 30) == "error"
    assert store.current.version == good and store.reloads_error == 1
    assert store.last_error is not None and "MemoryError" in store.last_error
    assert any("MemoryError" in r.getMessage() for r in caplog.records)
