"""The slow tier's scheduler over pytest-xdist workers (`-n 4 --dist loadgroup`, tests/conftest.py).

The tests of a module that defines a module-scoped fixture (a proxy and its upstream shared by the
module, the load-and-fault run) go to one worker, as one unit: spread over the workers, as
`worksteal` or `load` spread them, every worker that runs one of them sets the fixture up again (the
load-and-fault run's 100 s of CPU four times over, at its worst). Every other test is a unit of its
own. Units go out largest first (xdist's `--loadscope-reorder`, on by default): the modules that
share a fixture start early and the single tests fill the workers up at the end.

Why not xdist's own `loadgroup` with `xdist_group` marks: xdist 3.8 groups a marked test by
rewriting `Node._nodeid`, which pytest 9 no longer reads (a node's id is `Node._id`), so its groups
never form. The module's source is read here, on the controller, which has no collected items: a
module-scoped fixture defined in a conftest.py is not seen (only tests/conformance/ has one, and its
tests run one at a time anyway).
"""

from __future__ import annotations

import re

import pytest
from xdist.remote import Producer
from xdist.scheduler import LoadScopeScheduling

# `@pytest.fixture(` up to `scope="module"` (or package, class), over lines and past one level of
# parentheses in the arguments before it (`params=range(3)`).
SHARED_FIXTURE = re.compile(r"""@pytest\.fixture\((?:[^()]|\([^()]*\))*?\bscope=["'](?:module|package|class)["']""")


class ModuleFixtureScheduling(LoadScopeScheduling):
    def __init__(self, config: pytest.Config, log: Producer | None = None) -> None:
        super().__init__(config, log)
        self._shares: dict[str, bool] = {}

    def _split_scope(self, nodeid: str) -> str:
        module = nodeid.split("::", 1)[0]
        return module if self._shares_a_fixture(module) else nodeid

    def _shares_a_fixture(self, module: str) -> bool:
        shares = self._shares.get(module)
        if shares is None:
            try:
                source = (self.config.rootpath / module).read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError):
                source = ""
            shares = self._shares[module] = shares_a_fixture(source)
        return shares


def shares_a_fixture(source: str) -> bool:
    """Whether a test module's source defines a fixture its tests share (module, package or class scope)."""
    return SHARED_FIXTURE.search(source) is not None
