"""The slow tier's scheduler (tests/scheduling.py) groups exactly the modules that share a fixture."""

from __future__ import annotations

from pathlib import Path

from tests.scheduling import shares_a_fixture

TESTS = Path(__file__).resolve().parent


def test_modules_defining_a_module_scoped_fixture_are_grouped_in_every_spelling() -> None:
    assert shares_a_fixture((TESTS / "e2e" / "test_load_faults.py").read_text())  # the 100 s run
    assert shares_a_fixture((TESTS / "e2e" / "test_limits.py").read_text())  # scope=..., params=... over lines
    assert shares_a_fixture('@pytest.fixture(\n    scope="module",\n    params=["a", "b"],\n)\ndef f(): ...')
    assert shares_a_fixture("@pytest.fixture(autouse=True, scope='class')\ndef f(): ...")
    assert shares_a_fixture('@pytest.fixture(params=range(3), ids=str, scope="module")\ndef f(): ...')


def test_modules_without_one_are_spread_test_by_test() -> None:
    assert not shares_a_fixture((TESTS / "e2e" / "test_session_starts.py").read_text())
    assert not shares_a_fixture('@pytest.fixture(scope="session")\ndef f(): ...')
    assert not shares_a_fixture("@pytest.fixture\ndef f(): ...\n# scope='module' in a comment")
