"""The one part of the MCP Python SDK the proxy runs, `mcp.shared.inbound`, loaded without the rest.

The proxy checks a 2026 request with the SDK's own validation ladder, so that it rejects exactly
what the reference server rejects; it runs no other SDK code. That module imports only the
standard library and `mcp_types`, but an ordinary `import mcp.shared.inbound` first runs the `mcp`
package's `__init__`, which imports the SDK's whole client and server: most of the proxy's
start-up time, for code the proxy never calls.

Contract: `inbound` is the module `mcp.shared.inbound` itself, from the SDK's own file, found
through the import system (`sys.meta_path`, so an import hook sees it as it would any import)
and registered in `sys.modules` under its own name, so a later import of it by name (the SDK's
own `from mcp.shared.inbound import ...`, in a process that also runs the SDK) gets this very
module: one copy, the same classes. Its code runs at the first read of one of its attributes
(`importlib.util.LazyLoader`), not at import: importing the proxy loads none of the SDK's code
nor `mcp_types`, and whoever binds its names at import time gives that up. Where `mcp` is
already imported, or its files cannot be located, the ordinary import is used. Only the `mcp`
package's `__init__` is skipped: when some other code imports `mcp` later, it runs then, as usual
(the `mcp.shared` package it creates does not list `inbound` as an attribute; the SDK only ever
imports it by name).

`ensure_loaded()` runs the module's code in a worker thread, once per process, and returns when it
has run (what it built then frozen out of the garbage collector's reach, `gc.freeze`); after that
it returns at once. Code on the event loop awaits it before its first read of
`inbound`, so the few hundred milliseconds the load takes never hold the loop: the requests already
in flight go on meanwhile. A read of `inbound` never happens while that load runs elsewhere (the
lazy module is not safe to read from two threads at once on Python 3.11): whoever reads it awaits
`ensure_loaded()` first or runs off the event loop with no load in flight (a test, a script).
"""

from __future__ import annotations

import asyncio
import gc
import importlib
import importlib.util
import os
import sys
import threading
from types import ModuleType
from typing import TYPE_CHECKING

_NAME = "mcp.shared.inbound"


def _load_inbound() -> ModuleType:
    loaded = sys.modules.get(_NAME)
    if loaded is not None:
        return loaded
    if "mcp" in sys.modules:
        return importlib.import_module(_NAME)
    package = importlib.util.find_spec("mcp")  # locates the package without running its __init__
    locations = list(package.submodule_search_locations or ()) if package is not None else []
    search = [os.path.join(location, "shared") for location in locations]
    spec = None
    for finder in sys.meta_path:
        find_spec = getattr(finder, "find_spec", None)
        spec = find_spec(_NAME, search) if find_spec is not None and search else None
        if spec is not None:
            break
    if spec is None or spec.loader is None:
        return importlib.import_module(_NAME)
    # Lazily: the module object is made and registered now, its code (and `mcp_types`, which it
    # imports: a few hundred milliseconds of CPU building pydantic models) runs at the first
    # attribute read. Only a 2026 request reads one, so a proxy that serves 2025 clients never pays
    # for it; the first 2026 request does, once.
    spec.loader = importlib.util.LazyLoader(spec.loader)
    module = importlib.util.module_from_spec(spec)
    sys.modules[_NAME] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(_NAME, None)
        raise
    return module


if TYPE_CHECKING:
    import mcp.shared.inbound as inbound
else:
    inbound = _load_inbound()


_LOAD_LOCK = threading.Lock()
_loaded = False


def _load_now() -> None:
    global _loaded
    with _LOAD_LOCK:
        if not _loaded:
            _ = inbound.MCP_METHOD_HEADER  # the first read of an attribute runs the module
            _loaded = True


async def ensure_loaded() -> None:
    """Returns once `inbound`'s code has run; the first call runs it in a worker thread."""
    if not _loaded:
        await asyncio.to_thread(_load_now)
        # What the load built (the SDK's models: some 10,000 objects the collector tracks) lives
        # as long as the process: out of the collector's reach, as the start-up heap is
        # (`McpHttpApp._lifespan`), or every full collection after it walks them all (2 ms here),
        # stopping every call in flight meanwhile.
        gc.freeze()
