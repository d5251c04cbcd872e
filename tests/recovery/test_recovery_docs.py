"""docs/recovery.md stays in step with the code: every decision row, a schema-valid example."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from proxy.recovery.decide import describe_decision_table

DOC = Path(__file__).resolve().parents[2] / "docs" / "recovery.md"


@pytest.mark.parametrize("row", describe_decision_table(), ids=lambda r: r.reason.value)
def test_docs_list_every_decision_row(row):
    line = f"| `{row.reason.value}` | {row.stage} | {row.condition} | {row.example} |"
    assert line in DOC.read_text(encoding="utf-8")


def test_docs_example_is_schema_valid(assert_schema_valid):
    text = DOC.read_text(encoding="utf-8")
    example = re.search(r"### Example.*?```json\n(.*?)```", text, re.S)
    assert example is not None
    assert_schema_valid(json.loads(example.group(1)))
