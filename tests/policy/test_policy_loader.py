"""The loader: which entries it reads, duplicate claims, the version, and the shipped files."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from proxy.errors import PolicyError
from proxy.policy.cli import check
from proxy.policy.compile import load_builtin_policies, load_policy_dir, policy_file_names
from proxy.policy.compiled import PolicySet

from .conftest import write_files

REPO = Path(__file__).resolve().parents[2]


def make_configmap(folder: Path, stamp: str, files: dict[str, str]) -> None:
    """The layout kubelet writes: `..<stamp>/` holds the files, `..data` -> it, `x.yaml -> ..data/x.yaml`."""
    write_files(folder / f"..{stamp}", files)
    tmp = folder / "..data_tmp"
    tmp.symlink_to(f"..{stamp}")
    os.replace(tmp, folder / "..data")  # the atomic swap
    for name in files:
        link = folder / name
        if not link.is_symlink():
            link.symlink_to(f"..data/{name}")


def test_reads_yaml_and_yml_only_directly_in_the_folder(tmp_path: Path) -> None:
    folder = write_files(
        tmp_path / "p",
        {
            "a.yaml": "tools: [a]\n",
            "b.yml": "tools: [b]\n",
            "README.md": "not policy",
            "c.yaml.bak": "garbage: [",
            ".hidden.yaml": "garbage: [",
            "notes.txt": "x",
        },
    )
    write_files(folder / "examples", {"copy-me.yaml": "tools: [a]\nattempts: 99\n"})
    write_files(folder / "sub.yaml", {"inner.yaml": "tools: [a]\n"})  # a folder named like a file
    (folder / "dangling.yaml").symlink_to("nowhere.yaml")
    assert policy_file_names(folder) == ["a.yaml", "b.yml"]
    ps = load_policy_dir(folder)
    assert ps.files == (f"{folder}/a.yaml", f"{folder}/b.yml")
    assert sorted(ps.exact) == ["a", "b"]


def test_configmap_layout_loads_through_the_symlinks_once(tmp_path: Path) -> None:
    folder = tmp_path / "cm"
    folder.mkdir()
    make_configmap(folder, "2026_11_29_10_00_00.1", {"defaults.yaml": "attempts: 2\n", "x.yaml": "tools: [x]\n"})
    assert sorted(os.listdir(folder)) == ["..2026_11_29_10_00_00.1", "..data", "defaults.yaml", "x.yaml"]
    ps = load_policy_dir(folder)
    assert ps.files == (f"{folder}/defaults.yaml", f"{folder}/x.yaml")
    assert ps.resolve("x").attempts == 2


def test_same_exact_name_in_two_files_names_both(problems) -> None:
    found = problems({"a.yaml": "tools: [refund]\n", "b.yaml": "attempts: 2\ntools:\n  - other\n  - refund\n"})
    assert found == [
        "policies/b.yaml:4: tools[1]: 'refund' is also claimed by policies/a.yaml:1; "
        "a tool name (or glob) may appear in one file only, remove it from one"
    ]


def test_same_glob_in_two_files_is_an_error(problems) -> None:
    [found] = problems({"a.yaml": "tools: ['x_*']\n", "b.yaml": "tools: ['x_*']\n"})
    assert "'x_*' is also claimed by policies/a.yaml:1" in found


def test_a_name_twice_in_one_file_is_harmless(policies) -> None:
    assert list(policies({"a.yaml": "tools: [a, a]\n"}).exact) == ["a"]


def test_missing_folder_is_a_problem(tmp_path: Path) -> None:
    with pytest.raises(PolicyError) as info:
        load_policy_dir(tmp_path / "nope")
    assert info.value.problems == [
        f"{tmp_path}/nope: is not a folder; pass the folder that holds the policy YAML files"
    ]


def test_empty_folder_gives_built_in_defaults(tmp_path: Path) -> None:
    (tmp_path / "p").mkdir()
    ps = load_policy_dir(tmp_path / "p")
    assert ps.files == () and ps.resolve("t").sources["attempts"] == "built-in"


def test_version_depends_on_names_and_contents_only(tmp_path: Path) -> None:
    files = {"a.yaml": "tools: [a]\n", "defaults.yaml": "attempts: 2\n"}
    one = load_policy_dir(write_files(tmp_path / "one", files)).version
    two = load_policy_dir(write_files(tmp_path / "two", files)).version
    changed = load_policy_dir(write_files(tmp_path / "three", {**files, "a.yaml": "tools: [a]\n# x\n"})).version
    moved = {"b.yaml": files["a.yaml"], "defaults.yaml": files["defaults.yaml"]}
    renamed = load_policy_dir(write_files(tmp_path / "four", moved)).version
    assert one == two and len(one) == 12
    assert len({one, changed, renamed}) == 3


def test_shipped_defaults_pass_check(capsys) -> None:
    assert check(REPO / "policies") == 0
    assert capsys.readouterr().out.startswith(f"OK {REPO / 'policies'}: version ")


@pytest.mark.parametrize("example", sorted(p.name for p in (REPO / "policies" / "examples").glob("*.yaml")))
def test_every_example_passes_check_next_to_the_shipped_defaults(tmp_path: Path, example: str) -> None:
    shutil.copy(REPO / "policies" / "defaults.yaml", tmp_path)
    shutil.copy(REPO / "policies" / "examples" / example, tmp_path)
    assert check(tmp_path) == 0


def test_the_three_examples_exist() -> None:
    names = {p.name for p in (REPO / "policies" / "examples").iterdir()}
    assert {"customer-history.yaml", "refund.yaml", "untrusted-errors.yaml"} <= names


def test_embedded_defaults_are_the_shipped_file() -> None:
    shipped = (REPO / "policies" / "defaults.yaml").read_bytes()
    embedded = (REPO / "proxy" / "builtin_policies" / "defaults.yaml").read_bytes()
    assert embedded == shipped


def test_shipped_defaults_equal_the_built_in_defaults() -> None:
    """Running with no folder, with the shipped folder, or with an empty one gives the same policy."""
    builtin = load_builtin_policies()
    shipped = load_policy_dir(REPO / "policies")
    bare = PolicySet(version="x")
    for hints in (None, {"readOnlyHint": True}, {"idempotentHint": True}):
        a, b, c = (ps.resolve("some_tool", hints) for ps in (builtin, shipped, bare))
        strip = {"sources": {}}
        assert a.__class__(**{**_fields(a), **strip}) == b.__class__(**{**_fields(b), **strip})
        assert a.__class__(**{**_fields(a), **strip}) == c.__class__(**{**_fields(c), **strip})
    assert builtin.defaults is not None and builtin.defaults.file == "<built-in>/defaults.yaml"


def _fields(policy: object) -> dict[str, object]:
    import dataclasses

    return {f.name: getattr(policy, f.name) for f in dataclasses.fields(policy) if f.init}  # type: ignore[arg-type]


def test_shipped_defaults_say_what_recovery_md_promises() -> None:
    ps = load_policy_dir(REPO / "policies")
    read_only = ps.resolve("lookup", {"readOnlyHint": True})
    assert read_only.side_effect.value == "read_only"
    assert ps.resolve("lookup", {}).side_effect.value == "state_changing"
    # Do no harm: a deadline below the SDK clients' 60 s request timeout (with room for the answer),
    # and no timer that cuts an attempt before it: a tool silent for 55 s answers in one attempt
    assert (read_only.attempts, read_only.deadline_s, read_only.attempt_timeout_s) == (3, 58.0, 58.0)
    assert read_only.idle_timeout_s is None and 55.0 < read_only.deadline_s <= 58.0
    assert (read_only.min_attempt_s, read_only.retry_after_cap_s, read_only.ledger_window_s) == (14.5, 30.0, 60.0)
    # connection failures: the last of 3 attempts starts 5.25-10.5 s after the first failure
    assert read_only.backoff.reconnect_s == 3.5
    assert read_only.backoff.initial_s == 0.2 and read_only.backoff.max_s == 2.0
    assert read_only.backoff.multiplier == 2.0 and read_only.backoff.jitter == "full"
    assert read_only.trust_annotations and read_only.trust_error_category
    assert read_only.unclassified.value == "business" and {c.value for c in read_only.retry_on} == {"transient"}


def test_the_built_in_values_are_the_shipped_defaults_file() -> None:
    """A folder without defaults.yaml (built-in values) and the shipped file give a tool the same."""
    from proxy.policy.compiled import SETTINGS, _attr

    shipped = load_builtin_policies().resolve("anything", {"readOnlyHint": True})
    built_in = PolicySet(version="none").resolve("anything", {"readOnlyHint": True})
    assert {k: _attr(shipped, k) for k, _ in SETTINGS} == {k: _attr(built_in, k) for k, _ in SETTINGS}
    assert (REPO / "policies" / "defaults.yaml").read_bytes() == (
        REPO / "proxy" / "builtin_policies" / "defaults.yaml"
    ).read_bytes()
