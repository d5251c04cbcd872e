"""Files reloaded while the proxy runs: the one watch loop, and the one way a refused reload is told.

Three things reload from mounted files without a restart: the policy folder (proxy/policy/store.py),
the tokens file (proxy/auth/tokens.py) and the upstream's TLS files (proxy/net/tls.py). Each
owns its reload (read off the event loop, validate whole, swap in one assignment, or keep the last
good state); this module owns what they share.

Contract:
- `FolderWatcher(folders, on_change, what=..., debounce_ms=..., reads=...)` watches each folder
  itself, not below it (subfolders, examples and the volume's timestamped folders, are not ours to
  load). A change counts when its name is one the owner reads (`reads(name)`: the policy files,
  the tokens file, the TLS files) or a dot-dot entry: a Kubernetes ConfigMap or Secret volume
  swaps its `..data` link, which leaves every top-level name untouched. Anything else in the
  folder is not looked at: a log file written there (the proxy's own, or the upstream's) made
  every line trigger a reload, whose own log line (watchfiles logs each change it sees) triggered
  the next, without end. After each debounced batch of changes that count, it awaits
  `on_change("watch")`, one call at a time.
- An exception from the watch or from `on_change` is logged (`proxy.filewatch`, naming `what` and
  the folders) and the watch starts again after 1 s; it never ends the watcher silently.
- `start()` starts the watch task on the running loop (again only after `aclose()`); `aclose()`
  stops it and returns once it has ended, a reload in progress cancelled.
- `watchfiles` is imported by the task, not by this module: a proxy that watches nothing (the
  usual `--listen stdio` sidecar) never pays its import (~15 ms, anyio among it) before its first
  answer.
- `log_refused(log, what, reason, keeping, problems)` logs a refused reload, one ERROR line per
  problem, `"<what> reload (<reason>) refused, keeping <keeping>: <problem>"`, and returns the
  problems joined, the owner's `last_error`. Problems name files, lines and keys; the owners make
  sure they never hold a file's content (a token, a key).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterable, Sequence
from pathlib import Path

__all__ = ["FolderWatcher", "log_refused"]

log = logging.getLogger("proxy.filewatch")

RESTART_AFTER_S = 1.0


def log_refused(logger: logging.Logger, what: str, reason: str, keeping: str, problems: Sequence[str]) -> str:
    """Log why a reload was refused and what stays in use; the problems joined, for `last_error`."""
    for problem in problems:
        logger.error("%s reload (%s) refused, keeping %s: %s", what, reason, keeping, problem)
    return "; ".join(problems)


class FolderWatcher:
    """Calls `on_change("watch")` after each debounced change in `folders`; see the module docstring."""

    def __init__(
        self,
        folders: Iterable[Path],
        on_change: Callable[[str], Awaitable[object]],
        *,
        what: str,
        debounce_ms: int,
        force_polling: bool | None = None,
        reads: Callable[[str], bool] | None = None,
    ) -> None:
        self.folders = tuple(sorted({str(folder) for folder in folders}))
        self._reads = reads
        self.what = what
        self._on_change = on_change
        self._debounce_ms = debounce_ms
        self._force_polling = force_polling
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None:
            self._stop.clear()
            name = self.what.replace(" ", "-").lower() + "-watcher"
            self._task = asyncio.get_running_loop().create_task(self._watch(), name=name)

    async def _watch(self) -> None:
        import watchfiles

        while not self._stop.is_set():
            try:
                async for _changes in watchfiles.awatch(
                    *self.folders,
                    watch_filter=self._counts,
                    debounce=self._debounce_ms,
                    recursive=False,
                    stop_event=self._stop,
                    force_polling=self._force_polling,
                ):
                    await self._on_change("watch")
            except Exception:
                log.exception("%s watcher on %s failed; restarting in 1s", self.what, ", ".join(self.folders))
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stop.wait(), timeout=RESTART_AFTER_S)

    def _counts(self, _change: object, path: str) -> bool:
        name = Path(path).name
        return name.startswith("..") or self._reads is None or self._reads(name)

    async def aclose(self) -> None:
        self._stop.set()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
