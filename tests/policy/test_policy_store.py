"""The live store: atomic reloads, last good set kept, counters and hook, watcher and SIGHUP."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from proxy.errors import PolicyError
from proxy.policy.store import PolicyStore

from .conftest import write_files
from .test_policy_loader import make_configmap

GOOD_A = {"defaults.yaml": "attempts: 2\n", "x.yaml": "tools: [x]\n"}
GOOD_B = {"defaults.yaml": "attempts: 5\n", "x.yaml": "tools: [x]\n"}
BAD = {"defaults.yaml": "attempts: 50\n", "x.yaml": "tools: [x]\n"}


def swap(folder: Path, stamp: str, files: dict[str, str]) -> None:
    make_configmap(folder, stamp, files)


def test_bad_folder_at_start_raises(tmp_path: Path) -> None:
    write_files(tmp_path / "p", BAD)
    with pytest.raises(PolicyError):
        PolicyStore(tmp_path / "p")


def test_no_folder_serves_the_embedded_defaults() -> None:
    store = PolicyStore(None)
    assert store.current.files == ("<built-in>/defaults.yaml",)
    assert store.reload_now() == "unchanged"


def test_configmap_swap_changes_the_version(tmp_path: Path) -> None:
    folder = tmp_path / "cm"
    folder.mkdir()
    swap(folder, "2026_a", GOOD_A)
    store = PolicyStore(folder)
    before = store.current
    assert before.resolve("other").attempts == 2
    swap(folder, "2026_b", GOOD_B)
    assert store.reload_now() == "ok"
    assert store.current.version != before.version
    assert store.current.resolve("other").attempts == 5
    assert before.resolve("other").attempts == 2  # a call keeps the snapshot it started with
    assert (store.reloads_ok, store.reloads_error, store.last_error) == (1, 0, None)


def test_bad_update_keeps_the_version_and_records_the_error(tmp_path: Path, caplog) -> None:
    folder = tmp_path / "cm"
    folder.mkdir()
    swap(folder, "2026_a", GOOD_A)
    events: list[tuple[str, str, str | None]] = []
    store = PolicyStore(folder, on_reload=lambda *event: events.append(event))
    version = store.current.version
    swap(folder, "2026_b", BAD)
    with caplog.at_level(logging.ERROR, logger="proxy.policy"):
        assert store.reload_now("test") == "error"
    assert store.current.version == version
    assert store.last_error is not None and "defaults.yaml:1: attempts: 50 is more than the cap" in store.last_error
    assert store.reloads_error == 1 and store.last_reload_at is not None
    assert events == [("error", version, store.last_error)]
    [record] = caplog.records
    assert f"refused, keeping version {version}" in record.getMessage()
    assert "defaults.yaml:1: attempts:" in record.getMessage()
    swap(folder, "2026_c", GOOD_A)  # fixed again: the same content as before
    assert store.reload_now() == "unchanged"
    assert store.last_error is None and events[-1] == ("unchanged", version, None)


def test_failing_hook_does_not_break_reload(tmp_path: Path) -> None:
    def hook(result: str, version: str, error: str | None) -> None:
        raise RuntimeError("telemetry down")

    store = PolicyStore(write_files(tmp_path / "p", GOOD_A), on_reload=hook)
    write_files(tmp_path / "p", GOOD_B)
    assert store.reload_now() == "ok"


def test_snapshot_is_json(tmp_path: Path) -> None:
    store = PolicyStore(write_files(tmp_path / "p", {**GOOD_A, "g.yaml": "tools: ['get_*']\n"}))
    snap = json.loads(json.dumps(store.snapshot()))
    assert snap["version"] == store.current.version
    assert snap["files"] == [f"{tmp_path}/p/defaults.yaml", f"{tmp_path}/p/g.yaml", f"{tmp_path}/p/x.yaml"]
    assert snap["last_error"] is None and snap["loaded_at"].endswith("+00:00")
    assert snap["tools"] == {"x": f"{tmp_path}/p/x.yaml"}
    assert snap["globs"] == [{"pattern": "get_*", "file": f"{tmp_path}/p/g.yaml"}]
    assert snap["defaults"]["settings"]["attempts"] == 2
    assert snap["defaults"]["sources"]["attempts"] == f"{tmp_path}/p/defaults.yaml:attempts"


async def wait_until(condition: Callable[[], bool], changed: asyncio.Event, timeout_s: float = 10.0) -> None:
    async def loop() -> None:
        while not condition():
            changed.clear()
            await changed.wait()

    await asyncio.wait_for(loop(), timeout_s)


async def until_watching(store: PolicyStore, folder: Path, changed: asyncio.Event) -> None:
    """Poke the folder until the watcher reacts: it is live from then on (bounded, no bare sleep).
    The poke is a `..` entry, which the watcher counts as a ConfigMap swap would be; other names it
    does not read (a log file) are not changes."""
    for attempt in range(50):
        seen = store.reloads_unchanged
        (folder / "..poke").write_text(str(attempt))
        try:
            await wait_until(lambda seen=seen: store.reloads_unchanged > seen, changed, timeout_s=0.5)
            return
        except TimeoutError:
            continue
    raise AssertionError("the watcher never reacted")


def run(test: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(test(), 30))


def test_watcher_follows_a_configmap_swap_end_to_end(tmp_path: Path) -> None:
    async def scenario() -> None:
        folder = tmp_path / "cm"
        folder.mkdir()
        swap(folder, "2026_a", GOOD_A)
        changed = asyncio.Event()
        store = PolicyStore(folder, debounce_ms=50, on_reload=lambda *_: changed.set())
        await store.start()
        try:
            await until_watching(store, folder, changed)
            first = store.current.version
            swap(folder, "2026_b", GOOD_B)
            await wait_until(lambda: store.current.version != first, changed)
            assert store.current.resolve("x").attempts == 5
            errors = store.reloads_error
            swap(folder, "2026_c", BAD)
            await wait_until(lambda: store.reloads_error > errors, changed)
            assert store.current.resolve("x").attempts == 5
            assert store.last_error is not None and "attempts: 50" in store.last_error
        finally:
            await store.aclose()

    run(scenario)


def test_watcher_sees_a_plain_file_edit(tmp_path: Path) -> None:
    async def scenario() -> None:
        folder = write_files(tmp_path / "p", GOOD_A)
        changed = asyncio.Event()
        store = PolicyStore(folder, debounce_ms=50, on_reload=lambda *_: changed.set())
        await store.start()
        try:
            await until_watching(store, folder, changed)
            (folder / "defaults.yaml").write_text("attempts: 7\n")
            await wait_until(lambda: store.current.resolve("x").attempts == 7, changed)
        finally:
            await store.aclose()
        assert store._watcher is None

    run(scenario)


@pytest.mark.skipif(not hasattr(signal, "SIGHUP"), reason="no SIGHUP on this platform")
def test_sighup_reloads(tmp_path: Path) -> None:
    async def scenario() -> None:
        folder = write_files(tmp_path / "p", GOOD_A)
        changed = asyncio.Event()
        store = PolicyStore(folder, on_reload=lambda *_: changed.set())
        assert store.install_sighup(asyncio.get_running_loop())
        try:
            write_files(folder, GOOD_B)
            os.kill(os.getpid(), signal.SIGHUP)
            await wait_until(lambda: store.reloads_ok == 1, changed)
            assert store.current.resolve("x").attempts == 5
        finally:
            await store.aclose()

    run(scenario)


def test_async_reload_runs_the_parse_off_the_loop(tmp_path: Path, monkeypatch) -> None:
    import threading

    folder = write_files(tmp_path / "p", GOOD_A)
    store = PolicyStore(folder)
    threads: list[str] = []
    original = store._load

    def spy():  # type: ignore[no-untyped-def]
        threads.append(threading.current_thread().name)
        return original()

    monkeypatch.setattr(store, "_load", spy)

    async def scenario() -> None:
        write_files(folder, GOOD_B)
        assert await store.reload() == "ok"

    run(scenario)
    assert threads and threads[0] != threading.main_thread().name
