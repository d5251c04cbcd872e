"""Shared fixtures of the recovery core's tests: the published result schema."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest

SCHEMA_PATH = Path(__file__).resolve().parents[2] / "proxy" / "schemas" / "unresolved-result.schema.json"


@pytest.fixture(scope="session")
def unresolved_schema() -> dict[str, Any]:
    return json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))


@pytest.fixture(scope="session")
def assert_schema_valid(unresolved_schema: dict[str, Any]):
    validator = jsonschema.Draft202012Validator(unresolved_schema)

    def check(result: dict[str, Any]) -> None:
        assert result["isError"] is True
        # the report always travels in _meta; structuredContent carries it too where it may
        reports = [result["_meta"]["io.mcp-recovery-proxy/unresolved"]]
        if "errorCategory" in result.get("structuredContent", {}):
            reports.append(result["structuredContent"])
        for report in reports:
            errors = sorted(validator.iter_errors(report), key=lambda e: list(e.path))
            assert not errors, "; ".join(f"{list(e.path)}: {e.message}" for e in errors)
        json.dumps(result)  # plain JSON all the way down

    return check
