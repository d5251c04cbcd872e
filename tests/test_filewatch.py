"""proxy/filewatch.py: the one watch loop of the hot-reloaded files, with a real watchfiles watch on
a temporary folder. The owners' own behaviour (policy folder, tokens file, upstream TLS files) is
tested with each of them; here: what the loop promises whoever uses it."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from pathlib import Path

import pytest

from proxy.filewatch import FolderWatcher, log_refused

BOUND_S = 30.0


class Calls:
    """What `on_change` was called with, and an event for each call (no polling)."""

    def __init__(self) -> None:
        self.reasons: list[str] = []
        self.changed = asyncio.Event()

    def note(self, reason: str) -> None:
        self.reasons.append(reason)
        self.changed.set()

    async def poke_until(self, folder: Path, count: int) -> None:
        """Write into the folder until `on_change` was called `count` times: a watch is live only
        some time after it starts (or restarts), so one write could land before it (bounded)."""
        for attempt in range(100):
            if len(self.reasons) >= count:
                return
            self.changed.clear()
            (folder / "poke.txt").write_text(str(attempt))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.changed.wait(), 0.5)
        raise AssertionError(f"on_change was called {len(self.reasons)} times, not {count}")


def test_a_failing_reload_is_logged_and_the_watch_goes_on(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    calls = Calls()

    async def on_change(reason: str) -> None:
        calls.note(reason)
        if len(calls.reasons) == 1:
            raise RuntimeError("the first reload breaks")

    async def scenario() -> None:
        watcher = FolderWatcher([tmp_path, tmp_path], on_change, what="test files", debounce_ms=20)
        assert watcher.folders == (str(tmp_path),)  # one watch per folder, however often it is named
        watcher.start()
        try:
            await calls.poke_until(tmp_path, 1)
            await calls.poke_until(tmp_path, 2)  # after the 1 s restart
        finally:
            await watcher.aclose()
        assert watcher._task is None

    with caplog.at_level(logging.ERROR, logger="proxy.filewatch"):
        asyncio.run(asyncio.wait_for(scenario(), BOUND_S))
    assert calls.reasons[:2] == ["watch", "watch"]
    failed = [r for r in caplog.records if "test files watcher on" in r.getMessage()]
    assert failed and failed[0].exc_info is not None and "restarting in 1s" in failed[0].getMessage()


def test_aclose_stops_a_reload_in_progress_and_start_works_again(tmp_path: Path) -> None:
    calls = Calls()

    async def slow(reason: str) -> None:
        calls.note(reason)
        await asyncio.Event().wait()  # never ends by itself

    async def scenario() -> None:
        watcher = FolderWatcher([tmp_path], slow, what="test files", debounce_ms=20)
        watcher.start()
        await calls.poke_until(tmp_path, 1)
        await watcher.aclose()  # returns although the reload would never end
        watcher.start()
        try:
            await calls.poke_until(tmp_path, 2)
        finally:
            await watcher.aclose()

    asyncio.run(asyncio.wait_for(scenario(), BOUND_S))


def test_a_refused_reload_logs_each_problem_and_returns_them_joined(caplog: pytest.LogCaptureFixture) -> None:
    logger = logging.getLogger("proxy.test")
    with caplog.at_level(logging.ERROR, logger="proxy.test"):
        joined = log_refused(logger, "policy", "watch", "version v1", ["a.yaml:1: bad", "b.yaml:2: worse"])
    assert joined == "a.yaml:1: bad; b.yaml:2: worse"
    assert [r.getMessage() for r in caplog.records] == [
        "policy reload (watch) refused, keeping version v1: a.yaml:1: bad",
        "policy reload (watch) refused, keeping version v1: b.yaml:2: worse",
    ]


def test_a_log_file_beside_the_tokens_file_triggers_no_reload(tmp_path: Path) -> None:
    """A log written into the tokens file's folder made each line a reload (and, with the reload's
    own log line, a loop). Only the tokens file (and a Secret volume's `..` entries) counts now:
    lines written to the log leave the reload count alone; an edit of the tokens file reloads."""
    from proxy.auth.base import AuthRefused
    from proxy.auth.tokens import TokensAuthenticator

    tokens = tmp_path / "tokens"
    tokens.write_text("alice alice-token-0123456789ab\n")

    async def scenario() -> None:
        auth = TokensAuthenticator(tokens, debounce_ms=20)
        await auth.start()
        try:
            log_file = tmp_path / "proxy.log"
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 2.0  # the absence of a reload, looked for this long (bounded)
            line = 0
            while loop.time() < deadline and auth.reloads_ok == 0:
                line += 1
                with log_file.open("a") as f:
                    f.write(f"line {line}\n")
                await asyncio.sleep(0.05)  # the pace of a log being written, not a wait for an event
            assert auth.reloads_ok == 0, "a log line reloaded the tokens file"
            tokens.write_text("alice alice-token-0123456789ab\nbob bob-token-0123456789abcd\n")
            header = {"authorization": "Bearer bob-token-0123456789abcd"}
            for _ in range(200):  # bounded: until the watch has reloaded the edit
                try:
                    await auth.authenticate(header)
                    break
                except AuthRefused:
                    await asyncio.sleep(0.05)
            assert (await auth.authenticate(header)).id.endswith("bob")
            assert auth.reloads_ok == 1
        finally:
            await auth.aclose()

    asyncio.run(asyncio.wait_for(scenario(), BOUND_S))
