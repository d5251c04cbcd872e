"""Arbitrary policy files through the loader and `policies check`: always a clear answer.

Properties, over generated YAML documents (policy-shaped mappings with values of every type,
arbitrary YAML values, YAML syntax fragments such as anchors, aliases, tags and merge keys, raw
text and raw bytes):

- `compile_files` returns a `PolicySet` or raises `PolicyError` whose problems are printable lines
  naming the file; no other exception escapes.
- `mcp-recovery-proxy policies check DIR` (the command's `main`, in-process) exits 0 with one OK
  line or 1 with every problem and a FAILED line; nothing on stderr looks like a traceback.
- A policy the loader accepts still resolves for any tool name (valid input still answered).
"""

from __future__ import annotations

import contextlib
import io
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.cli import main as cli_main
from proxy.errors import PolicyError
from proxy.policy.compile import compile_files

_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
    st.sampled_from(["1s", "250ms", "0s", "-1s", "1h", "1e9s", "10", "transient", "state_changing", "(a|b", "x.y"]),
)
_VALUES = st.recursive(
    _SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=10,
)
_KEYS = st.sampled_from(
    [
        "tools",
        "side_effect",
        "retry_on",
        "attempts",
        "deadline",
        "attempt_timeout",
        "min_attempt_time",
        "idle_timeout",
        "backoff",
        "retry_after_cap",
        "rules",
        "trust",
        "unclassified",
        "idempotency_key",
        "ledger_window",
        "jsonrpc_errors_as_results",
        "report",
        "anti_storm",
    ]
)
_RULE_KEYS = st.sampled_from(
    ["name", "category", "text", "path", "equals", "jsonrpc_codes", "http_statuses", "retryable", "other"]
)


@st.composite
def policy_shaped(draw: st.DrawFn) -> dict[str, Any]:
    doc: dict[str, Any] = {}
    for key in draw(st.lists(_KEYS | st.text(max_size=10), max_size=6, unique=True)):
        if key == "rules" and draw(st.booleans()):
            doc[key] = [draw(st.dictionaries(_RULE_KEYS, _VALUES, max_size=5)) for _ in range(draw(st.integers(0, 3)))]
        elif key == "backoff" and draw(st.booleans()):
            doc[key] = draw(st.dictionaries(st.sampled_from(["initial", "max", "multiplier", "jitter"]), _VALUES))
        else:
            doc[key] = draw(_VALUES)
    return doc


def _dump(doc: Any) -> bytes:
    return yaml.safe_dump(doc, allow_unicode=True, sort_keys=False).encode()


_FRAGMENTS = st.sampled_from(
    [
        "tools: &t [a, b]\nreport: {alternatives: *t}\n",
        "tools: *undefined\n",
        "<<: {attempts: 2}\ntools: [x]\n",
        "tools: !!python/object:os.system [x]\n",
        "tools: !custom [x]\n",
        "tools: [a]\n---\ntools: [b]\n",
        "tools: [a\n",
        "\t tools: [a]\n",
        "tools: [a]\ntools: [b]\n",
        "? [a, b]\n: c\n",
        "tools: [x]\nrules:\n  - {name: r, category: transient, text: '(a'}\n",
        "tools: [x]\ndeadline: 1e400s\n",
        "%YAML 1.1\n---\ntools: [x]\n",
        'tools: ["\\ud800"]\n',
    ]
)
_DOCUMENTS = st.one_of(
    policy_shaped().map(_dump),
    _VALUES.map(_dump),
    _FRAGMENTS.map(str.encode),
    st.tuples(_FRAGMENTS, policy_shaped().map(_dump)).map(lambda p: p[0].encode() + p[1]),
    st.text(max_size=200).map(str.encode),
    st.binary(max_size=200),
)
_NAMES = st.sampled_from(["a.yaml", "b.yml", "defaults.yaml", "defaults.yml"])


@settings(deadline=None)  # file I/O per example: a wall-clock deadline would flake on a busy machine
@given(files=st.lists(st.tuples(_NAMES, _DOCUMENTS), min_size=1, max_size=3, unique_by=lambda f: f[0]))
def test_the_loader_returns_a_policy_set_or_a_policy_error_naming_the_file(files: list[tuple[str, bytes]]) -> None:
    triples = [(name, f"policies/{name}", content) for name, content in files]
    try:
        policy_set = compile_files(triples)
    except PolicyError as exc:
        assert exc.problems, "a refusal lists its problems"
        for problem in exc.problems:
            assert isinstance(problem, str) and problem.startswith("policies"), problem
            assert "Traceback" not in problem
        return
    # Valid input is still answered: any tool name resolves to a policy.
    for tool in ("anything", "a", ""):
        assert policy_set.resolve(tool, None) is not None


@settings(deadline=None)  # file I/O per example: a wall-clock deadline would flake on a busy machine
@given(files=st.lists(st.tuples(_NAMES, _DOCUMENTS), min_size=1, max_size=2, unique_by=lambda f: f[0]))
def test_policies_check_answers_ok_or_every_problem_and_never_a_traceback(
    files: list[tuple[str, bytes]], tmp_path_factory: pytest.TempPathFactory
) -> None:
    folder = tmp_path_factory.mktemp("policies")
    for name, content in files:
        (folder / name).write_bytes(content)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli_main(["policies", "check", str(folder)])
    assert code in (0, 1), (code, out.getvalue(), err.getvalue())
    assert "Traceback" not in err.getvalue() + out.getvalue()
    if code == 0:
        assert out.getvalue().startswith("OK "), out.getvalue()
    else:
        lines = err.getvalue().splitlines()
        assert lines and lines[-1].startswith("FAILED "), err.getvalue()
        assert all(line.startswith(str(folder)) for line in lines[:-1]), err.getvalue()


def test_yaml_alias_bomb_is_refused_without_expanding(tmp_path: Path) -> None:
    """A policy cannot exhaust memory: YAML must be loaded without alias
    expansion (or with a node budget). A bomb kept small here (10**5 expanded nodes, ~200 bytes)
    so this test stays cheap while it fails; the real one (500 bytes, 2+ GB) is the same shape.
    The property: the file is refused with a problem that says why, not expanded into one
    validation error per expanded node."""
    levels = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    for i in range(1, 5):
        levels.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]")
    # The anchors live under unknown keys, referenced from a valid one.
    bomb = ("\n".join(levels) + "\ntools: [t]\nreport:\n  alternatives: *a4\n").encode()
    (tmp_path / "bomb.yaml").write_bytes(bomb)
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        code = cli_main(["policies", "check", str(tmp_path)])
    assert code == 1
    lines = err.getvalue().splitlines()
    assert len(lines) <= 20, f"{len(lines)} problem lines for a {len(bomb)}-byte file: its aliases were expanded"
    assert any("alias" in line.lower() for line in lines), lines[:5]


@pytest.mark.parametrize(
    ("content", "says"),
    [
        # yaml.SafeLoader(text) itself raised ReaderError (outside the loader's guard).
        (b"\x1f", "unacceptable character"),
        (b"tools: [x]\nnote: \x07\n", "unacceptable character"),
        # The constructor's int() of more than 4300 digits raised a plain ValueError.
        (b"tools: [x]\nattempts: " + b"1" * 5000 + b"\n", "cannot be read"),
        # The composer recursed once per level: RecursionError.
        (b"tools: [x]\nreport: {alternatives: " + b"[" * 2000 + b"]" * 2000 + b"}\n", "nested deeper than"),
    ],
)
def test_regression_hostile_yaml_is_a_problem_line_not_an_exception(content: bytes, says: str) -> None:
    """Found by the loader property above: each input made an exception escape `policies check`."""
    with pytest.raises(PolicyError) as caught:
        compile_files([("a.yaml", "policies/a.yaml", content)])
    assert any(says in problem for problem in caught.value.problems), caught.value.problems


@pytest.mark.parametrize(
    "content",
    [
        b'"\\r": 1\ntools: [x]\n',  # a key with a line break
        b"tools: [x]\n" + b"k" * 1000 + b": 1\n",  # a long key (YAML allows 1024 characters)
        b"tools: [x]\nattempts: '" + b"v" * 5000 + b"'\n",  # a value of any length
    ],
)
def test_regression_each_problem_is_one_bounded_line(content: bytes) -> None:
    """Found by the `policies check` property above: keys were printed raw (a key holding a line
    break split its problem over two lines) and values unbounded (a 5000-character value came back
    whole, and an alias could expand it further)."""
    with pytest.raises(PolicyError) as caught:
        compile_files([("a.yaml", "policies/a.yaml", content)])
    for problem in caught.value.problems:
        assert "\n" not in problem and "\r" not in problem, problem
        assert len(problem) < 600, problem[:200]


def test_a_deeply_nested_rule_regex_is_a_problem_not_an_exception() -> None:
    """A policy cannot crash its own check (the policy regex engine): a `text:` rule
    of 3000 nested groups makes `re.compile` raise RecursionError, which escapes the schema's
    check (it catches `re.error` only) and `policies check` with it. Whatever engine replaces
    `re`, the property is the same: a problem line, not an exception."""
    content = b"tools: [x]\nrules: [{name: r, category: transient, text: '" + b"(" * 3000 + b"'}]\n"
    with pytest.raises(PolicyError) as caught:
        compile_files([("a.yaml", "policies/a.yaml", content)])
    assert any("text" in problem for problem in caught.value.problems), caught.value.problems


def test_a_recursive_yaml_alias_is_a_problem_not_an_exception() -> None:
    """A policy cannot crash the loader (YAML without alias expansion). Found by
    bench/fuzz.py (atheris, policy target): an anchor that refers to itself composes into a cyclic
    node, and the loader's walk over the nodes (`_collect_lines`) recursed until RecursionError.
    Minimal input: `a: &a [x, *a]`."""
    with pytest.raises(PolicyError) as caught:
        compile_files([("a.yaml", "policies/a.yaml", b"a: &a [x, *a]\n")])
    assert caught.value.problems
