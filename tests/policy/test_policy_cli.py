"""`policies check` and `policies explain` as a person sees them."""

from __future__ import annotations

import json
from pathlib import Path

from proxy.policy.cli import check, explain

from .conftest import write_files

FOLDER = {
    "defaults.yaml": "deadline: 20s\n",
    "refund.yaml": "tools: [refund]\nside_effect: state_changing\nattempts: 2\n"
    "report: {status_check_tool: refund_status}\n",
    "reads.yaml": "tools: ['get_*']\nattempt_timeout: 2s\n",
}


def test_check_ok_prints_one_summary_line(tmp_path: Path, capsys) -> None:
    folder = write_files(tmp_path / "p", FOLDER)
    assert check(folder) == 0
    out = capsys.readouterr()
    assert out.err == ""
    [line] = out.out.splitlines()
    assert line.startswith(f"OK {folder}: version ")
    assert line.endswith(f"3 file(s), 1 exact tool name(s), 1 glob(s), defaults from {folder}/defaults.yaml")


def test_check_prints_every_problem_and_fails(tmp_path: Path, capsys) -> None:
    folder = write_files(tmp_path / "p", {"a.yaml": "tools: [a]\nattempts: 0\n", "b.yaml": "tools: [a]\n"})
    assert check(folder) == 1
    err = capsys.readouterr().err.splitlines()
    assert err[0] == (
        f"{folder}/a.yaml:2: attempts: 0 is too few: attempts counts every call, the first included; use 1 for no retry"
    )
    assert err[1].startswith(f"{folder}/b.yaml:1: tools[0]: 'a' is also claimed by {folder}/a.yaml:1")
    assert err[2] == f"FAILED {folder}: 2 problems"


def test_explain_prints_an_aligned_table_with_sources(tmp_path: Path, capsys) -> None:
    folder = write_files(tmp_path / "p", FOLDER)
    assert explain(folder, "refund", '{"readOnlyHint": true}') == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("tool 'refund'  (policies version ")
    assert lines[1] == f"files applied, first wins: {folder}/refund.yaml, {folder}/defaults.yaml"
    assert lines[2] == 'annotations: {"readOnlyHint": true}'
    table = lines[4:]
    column = table[0].index("value")
    assert table[0].split() == ["setting", "value", "from"]
    rows = {row.split()[0]: row for row in table[1:]}
    assert rows["side_effect"].split() == ["side_effect", "state_changing", f"{folder}/refund.yaml:side_effect"]
    assert rows["deadline"].split() == ["deadline", "20s", f"{folder}/defaults.yaml:deadline"]
    assert rows["backoff.initial"].split() == ["backoff.initial", "200ms", "built-in"]
    assert rows["report.status_check_tool"].split()[1] == "refund_status"
    assert all(row[column - 2 : column] == "  " and row[column] != " " for row in table)


def test_explain_shows_annotations_as_the_source(tmp_path: Path, capsys) -> None:
    folder = write_files(tmp_path / "p", FOLDER)
    assert explain(folder, "get_user", '{"readOnlyHint": true}') == 0
    rows = {row.split()[0]: row.split() for row in capsys.readouterr().out.splitlines()[4:]}
    assert rows["side_effect"][1:] == ["read_only", "annotations:readOnlyHint"]
    assert rows["attempt_timeout"][1:] == ["2s", f"{folder}/reads.yaml:attempt_timeout"]
    assert rows["min_attempt_time"][1:] == ["500ms", "derived:attempt_timeout/4"]


def test_explain_json(tmp_path: Path, capsys) -> None:
    folder = write_files(tmp_path / "p", FOLDER)
    assert explain(folder, "refund", None, as_json=True) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["tool"] == "refund" and out["annotations"] is None
    assert out["settings"]["attempts"] == 2 and out["settings"]["deadline_s"] == 20.0
    assert out["sources"]["attempts"] == f"{folder}/refund.yaml:attempts"
    assert out["files_applied"] == [f"{folder}/refund.yaml", f"{folder}/defaults.yaml"]


def test_explain_without_folder_uses_the_embedded_defaults(capsys) -> None:
    assert explain(None, "anything", None) == 0
    assert "<built-in>/defaults.yaml:attempts" in capsys.readouterr().out


def test_explain_rejects_bad_annotations(tmp_path: Path, capsys) -> None:
    folder = write_files(tmp_path / "p", FOLDER)
    assert explain(folder, "refund", "{readOnlyHint: true}") == 2
    assert capsys.readouterr().err.startswith("--annotations: not JSON (")
    assert explain(folder, "refund", "[1]") == 2
    assert "must be a JSON object" in capsys.readouterr().err


def test_explain_on_a_bad_folder_prints_the_problems(tmp_path: Path, capsys) -> None:
    folder = write_files(tmp_path / "p", {"a.yaml": "tools: [a]\nattempts: 0\n"})
    assert explain(folder, "a", None) == 1
    assert "a.yaml:2: attempts:" in capsys.readouterr().err
