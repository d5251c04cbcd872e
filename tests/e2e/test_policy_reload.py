"""Policies reload under the running proxy the way a Kubernetes ConfigMap update swaps them.

The folder holds `..<timestamp>/` directories, a `..data` symlink to the current one, and
top-level symlinks through `..data`; an update creates a new timestamped directory and atomically
replaces `..data`. The test watches `/policies` change version and the proxy's behaviour (the
attempt count of a tool) change with it, without a restart; a bad update changes neither.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from mcp import Client

from tests.fixtures.journal import Journal
from tests.proxy_process import ProxyProcess, scripted_stdio_command

pytestmark = [pytest.mark.slow, pytest.mark.anyio]

DEFAULTS = """
retry_on: [transient]
attempts: 3
deadline: 4s
attempt_timeout: 1s
min_attempt_time: 100ms
backoff: {initial: 20ms, max: 100ms}
"""


def flaky_policy(attempts: int) -> str:
    return f"tools: [flaky_read]\nattempts: {attempts}\n"


class ConfigMapFolder:
    """A folder laid out like a mounted ConfigMap, updated the way the kubelet updates it."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.generation = 0
        root.mkdir()

    def publish(self, files: dict[str, str]) -> None:
        self.generation += 1
        data = self.root / f"..2026_11_29_00_00_{self.generation:02d}.000000000"
        data.mkdir()
        for name, text in files.items():
            (data / name).write_text(text)
        tmp = self.root / "..data_tmp"
        tmp.symlink_to(data.name)
        os.replace(tmp, self.root / "..data")  # the atomic swap
        for name in files:
            link = self.root / name
            if not link.is_symlink():
                link.symlink_to(f"..data/{name}")


def wait_until(predicate: Callable[[], Any], timeout_s: float = 15.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.05)


@pytest.fixture
def setup(tmp_path: Path) -> Iterator[tuple[ProxyProcess, ConfigMapFolder, Journal]]:
    folder = ConfigMapFolder(tmp_path / "policies")
    folder.publish({"defaults.yaml": DEFAULTS, "flaky.yaml": flaky_policy(2)})
    journal = Journal(tmp_path / "journal.jsonl")
    command = scripted_stdio_command(journal.path, tmp_path / "state.json")
    extra = ["--policies", str(folder.root)]
    with ProxyProcess(upstream=command, extra=extra, log_path=tmp_path / "proxy.log") as proxy:
        yield proxy, folder, journal


def policies(proxy: ProxyProcess) -> dict[str, Any]:
    return httpx.get(proxy.admin + "/policies", timeout=5).json()


async def flaky_call(proxy: ProxyProcess) -> tuple[Any, str]:
    cid = uuid.uuid4().hex[:10]
    with anyio.fail_after(20):
        async with Client(proxy.url, mode="legacy") as client:
            await client.list_tools()
            result = await client.call_tool("flaky_read", {"key": cid, "fail_times": 2, "call_id": cid})
    return result, cid


async def test_a_configmap_swap_changes_version_and_behaviour_without_a_restart(
    setup: tuple[ProxyProcess, ConfigMapFolder, Journal],
) -> None:
    proxy, folder, journal = setup
    first = policies(proxy)
    assert first["tools"]["flaky_read"].endswith("flaky.yaml") and first["last_error"] is None

    result, cid = await flaky_call(proxy)
    assert result.is_error and result.structured_content["stopReason"] == "attempts_exhausted"
    assert journal.executions("flaky_read", cid) == 2

    folder.publish({"defaults.yaml": DEFAULTS, "flaky.yaml": flaky_policy(3)})
    second = wait_until(lambda: (p := policies(proxy))["version"] != first["version"] and p)
    assert second["last_error"] is None

    result, cid = await flaky_call(proxy)
    assert not result.is_error and result.meta["io.mcp-recovery-proxy/attempts"] == 3
    assert journal.executions("flaky_read", cid) == 3

    # A bad update: the last good set stays active, the error is reported with file and key.
    folder.publish({"defaults.yaml": DEFAULTS, "flaky.yaml": flaky_policy(0)})
    failed = wait_until(lambda: (p := policies(proxy))["last_error"] and p)
    assert failed["version"] == second["version"]
    assert "flaky.yaml" in failed["last_error"] and "attempts" in failed["last_error"]

    result, cid = await flaky_call(proxy)
    assert not result.is_error and journal.executions("flaky_read", cid) == 3
    async with httpx.AsyncClient(timeout=5) as http:
        metrics = (await http.get(proxy.admin + "/metrics")).text
    assert 'mcp_recovery_policy_reloads_total{result="error"} 1.0' in metrics


def test_a_log_file_in_the_policy_folder_triggers_no_reload_of_its_own(tmp_path: Path) -> None:
    """The proxy's log written into the folder it watches: each line was a change, each change a
    reload, and each reload's own log line (watchfiles logs every change it sees) the next change,
    without end (152 lines in 15 s with no traffic). Now only the files the loader reads (and a
    ConfigMap's `..` entries) count: two real edits make two reloads, and nothing else reloads."""
    folder = tmp_path / "policies"
    folder.mkdir()
    (folder / "defaults.yaml").write_text(DEFAULTS)
    (folder / "flaky.yaml").write_text(flaky_policy(2))
    command = scripted_stdio_command(tmp_path / "journal.jsonl", tmp_path / "state.json")
    extra = ["--policies", str(folder)]
    with ProxyProcess(upstream=command, extra=extra, log_path=folder / "proxy.log") as proxy:
        version = policies(proxy)["version"]
        for attempts in (3, 4):
            (folder / "flaky.yaml").write_text(flaky_policy(attempts))
            version = wait_until(lambda v=version: (p := policies(proxy))["version"] != v and p["version"])
        reloads = policies(proxy)["reloads"]
        assert reloads["ok"] == 2 and reloads["error"] == 0, reloads
        assert reloads["unchanged"] == 0, f"the log file's own lines made reloads: {reloads}"
