"""`policies init`'s drafting and writing, from tool listings given here (no server, no process):
every drafted folder must load, and name each tool with the class the proxy would infer."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from proxy.policy.compile import load_policy_dir
from proxy.policy.compiled import annotation_side_effect
from proxy.policy.init import draft, shipped_defaults, side_effect_of, write


@pytest.mark.parametrize(
    ("annotations", "side_effect", "why"),
    [
        (None, "state_changing", "no annotations in tools/list: the MCP default"),
        ({}, "state_changing", "no readOnlyHint or idempotentHint in tools/list: the MCP default"),
        ({"title": "T"}, "state_changing", "no readOnlyHint or idempotentHint in tools/list: the MCP default"),
        ({"readOnlyHint": True, "destructiveHint": True}, "read_only", "readOnlyHint: true in tools/list"),
        ({"idempotentHint": True}, "idempotent", "idempotentHint: true in tools/list (readOnlyHint is not true)"),
        ({"destructiveHint": True}, "state_changing", "destructiveHint: true in tools/list"),
        (
            {"readOnlyHint": False, "idempotentHint": False},
            "state_changing",
            "readOnlyHint: false, idempotentHint: false in tools/list: neither read-only nor idempotent",
        ),
        (  # only the JSON value true counts, as at run time
            {"readOnlyHint": "true"},
            "state_changing",
            'readOnlyHint: "true" in tools/list: neither read-only nor idempotent',
        ),
        ("not an object", "state_changing", "no annotations in tools/list: the MCP default"),
    ],
)
def test_side_effect_and_its_reason_follow_the_run_time_rule(annotations: Any, side_effect: str, why: str) -> None:
    got, reason = side_effect_of(annotations)
    assert (got.value, reason) == (side_effect, why)
    assert got is annotation_side_effect(annotations if isinstance(annotations, dict) else None)[0]


def tool(name: str, description: Any = "Does a thing.", annotations: Any = None) -> dict[str, Any]:
    out: dict[str, Any] = {"name": name, "description": description, "inputSchema": {"type": "object"}}
    if annotations is not None:
        out["annotations"] = annotations
    return out


def test_names_that_would_clash_or_mislead_the_loader_still_give_a_folder_that_loads(tmp_path: Path) -> None:
    tools = [
        tool("defaults", annotations={"readOnlyHint": True}),  # not the defaults file
        tool("Lookup"),
        tool("lookup", annotations={"idempotentHint": True}),  # same file name on a case-blind disk
        tool(".hidden"),  # a dot-file is skipped by the loader
        tool("orders/get"),
        tool("yes"),  # YAML 1.1 reads a bare yes as true
        tool("null"),
        tool("billing_*"),  # a glob: cannot be named exactly
        tool("lookup", annotations={"readOnlyHint": True}),  # listed twice: the first is drafted
    ]
    planned = draft(tools)
    names = [n.lower() for n in planned.files]
    assert len(set(names)) == len(names)
    assert planned.files["defaults.yaml"] == shipped_defaults()
    assert not any(n.startswith(".") for n in planned.files)
    assert planned.skipped == ["'billing_*': its name has * ? or [, which a policy file reads as a glob"]
    assert write(tmp_path / "p", planned) == 0
    policy_set = load_policy_dir(tmp_path / "p")
    assert set(policy_set.exact) == {"defaults", "Lookup", "lookup", ".hidden", "orders/get", "yes", "null"}
    assert policy_set.resolve("defaults").side_effect.value == "read_only"
    assert policy_set.resolve("lookup").side_effect.value == "idempotent"
    assert policy_set.resolve("Lookup").side_effect.value == "state_changing"
    assert policy_set.defaults is not None and policy_set.defaults.file.endswith("/defaults.yaml")


def test_a_description_becomes_one_comment_line_whatever_it_holds(tmp_path: Path) -> None:
    # every line break Python or YAML knows ends the first line (NEL, LS, PS included); other
    # control characters become spaces
    nasty = "Reads\x00 the\x1b[31m log\tfile\u00a0now\u2028tools: [evil]\x85second\u2029third\r\nfourth"
    planned = draft([tool("t", description=nasty), tool("u", description="\n\n  " + "x" * 500), tool("v", None)])
    text = planned.files["t.yaml"]
    assert text.split("\n")[0] == "# t: Reads the [31m log file now"
    assert not any(word in text for word in ("evil", "second", "third", "fourth", "\x1b", "\x00"))
    assert len(planned.files["u.yaml"].splitlines()[0]) <= len("# u: ") + 160
    assert planned.files["v.yaml"].startswith("# v: (no description)\n")
    assert write(tmp_path / "p", planned) == 0
    assert set(load_policy_dir(tmp_path / "p").exact) == {"t", "u", "v"}


def test_an_existing_defaults_yml_is_the_one_compared_and_no_second_defaults_file_is_added(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "p"
    folder.mkdir()
    (folder / "defaults.yml").write_text("deadline: 20s\n")
    assert write(folder, draft([tool("t")])) == 1
    out = capsys.readouterr().out
    assert f"differs  {folder / 'defaults.yml'}: not touched" in out
    assert "-deadline: 20s" in out
    assert not (folder / "defaults.yaml").exists()
    assert (folder / "defaults.yml").read_text() == "deadline: 20s\n"
    assert (folder / "t.yaml").exists()
    load_policy_dir(folder)
