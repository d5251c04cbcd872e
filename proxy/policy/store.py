"""The live policy snapshot, and how it is reloaded while the proxy runs (docs/policies.md, "Precedence").

Contract:
- `store.current` is the `PolicySet` a call reads once at its start; reading it is a plain
  attribute read, and a call keeps the set it started with.
- `reload()` validates the whole folder in a worker thread, then swaps `current` in one
  assignment. A bad folder keeps the last good set: every problem is logged (logger
  `proxy.policy`) with file and key, `last_error` remembers them, and the reload is counted.
  A reload that fails for any other reason (an exception in the loader, a RecursionError on a
  deeply nested file, a MemoryError) is recorded the same way, as one problem naming it: it never
  escapes unrecorded, and never replaces the last good set.
- Results: `ok` (a new version is live), `unchanged` (same content hash), `error`. Counters are
  plain ints (`reloads_ok`, `reloads_unchanged`, `reloads_error`); `on_reload(result, version,
  error)` is called after each reload (telemetry subscribes there; a failing hook is logged).
- `start()` watches the folder itself (proxy/filewatch.py: not the files, since a ConfigMap swaps
  its `..data` symlink, which leaves every top-level link untouched) and reloads after a debounce;
  `install_sighup(loop)` reloads on SIGHUP; `aclose()` stops both.
- `folder=None` serves the defaults embedded in the package and never reloads.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from proxy.errors import PolicyError
from proxy.filewatch import FolderWatcher, log_refused
from proxy.policy.compile import load_builtin_policies, load_policy_dir
from proxy.policy.compiled import PolicySet, resolve_defaults
from proxy.policy.render import policy_as_dict

log = logging.getLogger("proxy.policy")

ReloadResult = Literal["ok", "unchanged", "error"]
ReloadHook = Callable[[str, str, str | None], None]


def _iso(epoch_s: float | None) -> str | None:
    return None if epoch_s is None else datetime.fromtimestamp(epoch_s, UTC).isoformat(timespec="milliseconds")


class PolicyStore:
    """Holds the current `PolicySet`; raises `PolicyError` at construction if the folder is bad."""

    def __init__(
        self,
        folder: str | os.PathLike[str] | None,
        *,
        debounce_ms: int = 300,
        on_reload: ReloadHook | None = None,
        force_polling: bool | None = None,
    ) -> None:
        self.folder = Path(folder) if folder is not None else None
        self.current: PolicySet = self._load()
        self.loaded_at: float = time.time()  # wall clock of the last successful swap
        self.last_reload_at: float | None = None
        self.last_error: str | None = None
        self.last_problems: tuple[str, ...] = ()
        self.reloads_ok = 0
        self.reloads_unchanged = 0
        self.reloads_error = 0
        self.on_reload = on_reload
        self._debounce_ms = debounce_ms
        self._force_polling = force_polling
        self._lock = asyncio.Lock()
        self._watcher: FolderWatcher | None = None
        self._pending: set[asyncio.Task[Any]] = set()
        self._sighup_loop: asyncio.AbstractEventLoop | None = None

    def _load(self) -> PolicySet:
        return load_builtin_policies() if self.folder is None else load_policy_dir(self.folder)

    async def reload(self, reason: str = "manual") -> ReloadResult:
        """Validate everything off the event loop, then swap atomically (or keep the last good set)."""
        async with self._lock:  # one reload at a time, so an older read never overwrites a newer one
            return self._apply(await asyncio.to_thread(self._candidate), reason)

    def reload_now(self, reason: str = "manual") -> ReloadResult:
        """The same as `reload`, for code without an event loop (tests, one-shot tools)."""
        return self._apply(self._candidate(), reason)

    def _candidate(self) -> PolicySet | PolicyError:
        try:
            return self._load()
        except PolicyError as exc:
            return exc
        except Exception as exc:  # MemoryError and RecursionError included: still a refused reload
            text = str(exc)
            text = text if len(text) <= 200 else text[:199] + "…"
            return PolicyError(
                [f"{self.folder}: the policy loader failed ({type(exc).__name__}: {text}); fix the folder and reload"]
            )

    def _apply(self, candidate: PolicySet | PolicyError, reason: str) -> ReloadResult:
        self.last_reload_at = time.time()
        result: ReloadResult
        if isinstance(candidate, PolicyError):
            result = "error"
            self.reloads_error += 1
            error = log_refused(log, "policy", reason, f"version {self.current.version}", candidate.problems)
            self.last_error, self.last_problems = error, tuple(candidate.problems)
        else:
            error = None
            self.last_error, self.last_problems = None, ()
            if candidate.version == self.current.version:
                result = "unchanged"
                self.reloads_unchanged += 1
            else:
                result = "ok"
                old, self.current = self.current.version, candidate  # the one atomic swap
                self.loaded_at = self.last_reload_at
                self.reloads_ok += 1
                log.info(
                    "policy reload (%s): version %s -> %s (%s)",
                    reason,
                    old,
                    candidate.version,
                    ", ".join(candidate.files) or "no files",
                )
        if self.on_reload is not None:
            try:
                self.on_reload(result, self.current.version, error)
            except Exception:
                log.exception("policy on_reload hook failed")
        return result

    async def start(self) -> None:
        """Start watching the folder (no-op without a folder or when already started)."""
        if self.folder is None or self._watcher is not None:
            return
        self._watcher = FolderWatcher(
            [self.folder],
            self.reload,
            what="policy",
            debounce_ms=self._debounce_ms,
            force_polling=self._force_polling,
            reads=lambda name: name.lower().endswith((".yaml", ".yml")),
        )
        self._watcher.start()

    def install_sighup(self, loop: asyncio.AbstractEventLoop) -> bool:
        """Reload on SIGHUP; False where the platform has no SIGHUP or signals are not available."""
        if not hasattr(signal, "SIGHUP"):
            return False
        try:
            loop.add_signal_handler(signal.SIGHUP, self._on_sighup, loop)
        except (NotImplementedError, RuntimeError, ValueError):
            return False
        self._sighup_loop = loop
        return True

    def _on_sighup(self, loop: asyncio.AbstractEventLoop) -> None:
        task = loop.create_task(self.reload("sighup"))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def aclose(self) -> None:
        if self._watcher is not None:
            await self._watcher.aclose()
            self._watcher = None
        if self._sighup_loop is not None:
            with contextlib.suppress(Exception):
                self._sighup_loop.remove_signal_handler(signal.SIGHUP)
            self._sighup_loop = None
        tasks = list(self._pending)
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def snapshot(self) -> dict[str, Any]:
        """JSON-able state for the admin `/policies` endpoint."""
        current = self.current
        return {
            "version": current.version,
            "folder": str(self.folder) if self.folder is not None else None,
            "files": list(current.files),
            "loaded_at": _iso(self.loaded_at),
            "last_reload_at": _iso(self.last_reload_at),
            "last_error": self.last_error,
            "problems": list(self.last_problems),
            "reloads": {"ok": self.reloads_ok, "unchanged": self.reloads_unchanged, "error": self.reloads_error},
            "tools": {tool: layer.file for tool, layer in current.exact.items()},
            "globs": [{"pattern": pattern, "file": layer.file} for pattern, layer in current.globs],
            "defaults": policy_as_dict(resolve_defaults(current)),
        }
