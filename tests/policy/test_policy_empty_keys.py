"""A key left empty (`key:`, which YAML reads as null) is an error at any depth, as docs/policies.md
says, except the documented switch-offs `idle_timeout: null` and `idempotency_key: null`. An empty
key of a block was taken as "not set": `anti_storm:` with its two budget numbers left empty passed
`policies check` and left the tool with no retry budget at all. The keys are read from the schema,
so a block or key added later is covered too."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import pytest

from proxy.cli import main
from proxy.policy.compile import load_policy_dir
from proxy.policy.compiled import PolicySet
from proxy.policy.schema import MERGED_BLOCKS, NULL_MEANS_OFF, IdempotencyKeyModel, PolicyFile, RuleModel

from .conftest import write_files

EMPTY = "has no value; write a value, or remove the line"
RULE = {"name": "r", "category": "transient", "text": "x"}


def _cases() -> list[tuple[str, str, int]]:
    """(dotted key, file text, line of the empty key) for every key the schema knows."""
    cases = []
    for key, info in PolicyFile.model_fields.items():
        if key == "tools" or key in NULL_MEANS_OFF:
            continue
        if key not in MERGED_BLOCKS:  # an empty block sets nothing (below)
            cases.append((key, f"tools: [a]\n{key}:\n", 2))
        block = info.annotation
        inner = next(
            (a for a in getattr(block, "__args__", ()) if isinstance(a, type) and a.__name__.endswith("Model")), None
        )
        if inner is not None and key != "idempotency_key":
            cases += [(f"{key}.{sub}", f"tools: [a]\n{key}:\n  {sub}:\n", 3) for sub in inner.model_fields]
    for sub in IdempotencyKeyModel.model_fields:
        other = {"location": "  location: meta\n", "name": "  name: k\n"}
        del other[sub]
        cases.append(
            (f"idempotency_key.{sub}", f"tools: [a]\nidempotency_key:\n{''.join(other.values())}  {sub}:\n", 4)
        )
    for sub in RuleModel.model_fields:
        base = dict(RULE, path="a") if sub == "text" else dict(RULE)
        base.pop(sub, None)
        if sub == "path":
            base["text"] = "x"
        lines = "".join(f"    {k}: {v}\n" for k, v in base.items())
        text = f"tools: [a]\nrules:\n  - {lines[4:]}    {sub}:\n"
        cases.append((f"rules[0].{sub}", text, 3 + len(base)))
    return cases


CASES = _cases()


def test_the_cases_cover_every_block_and_rule_key() -> None:
    keys = {key for key, _, _ in CASES}
    assert {"anti_storm.retry_budget_ratio", "anti_storm.retry_budget_min_per_s", "anti_storm.breaker_cooldown"} <= keys
    assert {"report.status_check_tool", "backoff.initial", "trust.annotations", "rules[0].equals"} <= keys
    assert {"attempts", "rules", "idempotency_key.name"} <= keys
    assert not {"idle_timeout", "idempotency_key", "tools", *MERGED_BLOCKS} & keys


@pytest.mark.parametrize("block", sorted(MERGED_BLOCKS))
def test_a_block_whose_every_line_is_commented_out_sets_nothing(tmp_path: Path, block: str) -> None:
    """`anti_storm:` over lines all commented out is as if the block were absent: a folder that
    loaded before must not stop the proxy's start for it (its keys, left empty, are errors)."""
    with_block = write_files(tmp_path / "with", {"t.yaml": f"tools: [a]\n{block}:\n#  some_key: 1\nattempts: 2\n"})
    without = write_files(tmp_path / "without", {"t.yaml": "tools: [a]\nattempts: 2\n"})
    ours, plain = load_policy_dir(with_block).resolve("a"), load_policy_dir(without).resolve("a")
    names = [f.name for f in dataclasses.fields(ours) if f.name != "sources"]  # (sources: the folder's paths)
    assert [getattr(ours, n) for n in names] == [getattr(plain, n) for n in names]


@pytest.mark.parametrize(("key", "text", "line"), CASES, ids=[c[0] for c in CASES])
def test_an_empty_key_is_refused_by_the_loader_and_by_check(
    problems: Callable[..., list[str]],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    key: str,
    text: str,
    line: int,
) -> None:
    message = (
        EMPTY if not key.endswith("equals") else EMPTY.replace("value,", "value (equals: [null] compares with null),")
    )
    assert problems({"t.yaml": text}) == [f"policies/t.yaml:{line}: {key}: {message}"]
    folder = write_files(tmp_path / "cli", {"t.yaml": text})
    assert main(["policies", "check", str(folder)]) == 1
    out = capsys.readouterr()
    assert (out.out, out.err.splitlines()) == (
        "",
        [f"{folder}/t.yaml:{line}: {key}: {message}", f"FAILED {folder}: 1 problem"],
    )


def test_a_half_edited_anti_storm_block_names_each_empty_key(problems: Callable[..., list[str]]) -> None:
    text = "tools: [a]\nanti_storm:\n  retry_budget_ratio:\n  retry_budget_min_per_s:\n  breaker_cooldown:\n"
    assert problems({"defaults.yaml": "attempts: 2\n", "a.yaml": text}) == [
        f"policies/a.yaml:3: anti_storm.retry_budget_ratio: {EMPTY}",
        f"policies/a.yaml:4: anti_storm.retry_budget_min_per_s: {EMPTY}",
        f"policies/a.yaml:5: anti_storm.breaker_cooldown: {EMPTY}",
    ]


def test_an_empty_key_in_the_defaults_file_is_refused(problems: Callable[..., list[str]]) -> None:
    assert problems({"defaults.yaml": "report:\n  status_check_tool:\n"}) == [
        f"policies/defaults.yaml:2: report.status_check_tool: {EMPTY}"
    ]


@pytest.mark.parametrize("null", ["", " null", " ~"], ids=["empty", "null", "tilde"])
def test_the_documented_switch_offs_still_switch_off(
    policies: Callable[..., PolicySet], tmp_path: Path, capsys: pytest.CaptureFixture[str], null: str
) -> None:
    files = {
        "defaults.yaml": "idle_timeout: 5s\nidempotency_key: {location: meta, name: key}\n",
        "a.yaml": f"tools: [a]\nidle_timeout:{null}\nidempotency_key:{null}\n",
    }
    policy = policies(files).resolve("a")
    assert (policy.idle_timeout_s, policy.idempotency_key) == (None, None)
    assert policy.sources["idle_timeout_s"].endswith("a.yaml:idle_timeout")
    folder = write_files(tmp_path / "cli", files)
    assert main(["policies", "check", str(folder)]) == 0
    assert capsys.readouterr().out.startswith(f"OK {folder}: ")


def test_a_null_inside_a_list_is_a_value(policies: Callable[..., PolicySet]) -> None:
    # `equals: [null]` is how a rule compares with null: a list item is no key left empty
    policy_set = policies(
        {"t.yaml": "tools: [a]\nrules:\n  - {name: r, category: business, path: e, equals: [null]}\n"}
    )
    [rule] = policy_set.resolve("a").rules
    assert rule.equals == (None,)
