"""`policies init` in front of real servers no one here wrote (the interop matrix's npm and PyPI
servers, over stdio; the TypeScript SDK's Streamable HTTP server), run as a person runs it.

Each test lists the server's tools itself with the MCP Python SDK (every page) and checks the
drafted folder against that listing: `policies check` accepts it, it names every tool exactly, and
each tool's class is what its annotations say (readOnlyHint true -> read_only, else idempotentHint
true -> idempotent, else state_changing), with the comment that says where the value came from.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio
import pytest

from proxy.policy.compile import load_policy_dir
from tests.fixtures.helpers import REPO_ROOT, free_port
from tests.interop.harness import Prerequisites, ts_http_server
from tests.proxy_process import pid_alive

pytestmark = [pytest.mark.slow, pytest.mark.interop]

INIT_BOUND_S = 120.0  # one `policies init` run: a Python server's start was seen taking 7-20 s here
LIST_BOUND_S = 60.0
PAGED = (sys.executable, str(REPO_ROOT / "tests" / "fixtures" / "paged_tools.py"))


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "proxy", *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=INIT_BOUND_S,
        env={**os.environ, **(env or {})},
    )


async def _listed(server: Any) -> list[Any]:
    from mcp import Client

    tools: list[Any] = []
    with anyio.fail_after(LIST_BOUND_S):
        async with Client(server, mode="legacy") as client:
            cursor: str | None = None
            while True:
                page = await client.list_tools(cursor=cursor)
                tools += page.tools
                cursor = page.next_cursor
                if not cursor:
                    return tools


def listed_stdio(argv: Sequence[str]) -> list[Any]:
    """The server's tools as the MCP Python SDK lists them, every page."""
    from mcp import StdioServerParameters

    params = StdioServerParameters(command=argv[0], args=list(argv[1:]), cwd=str(REPO_ROOT), env=dict(os.environ))
    return anyio.run(_listed, params)


def expected_class(tool: Any) -> tuple[str, str]:
    """(class, the annotation the comment must name), from the SDK's view of the tool."""
    hints = tool.annotations
    if hints is not None and hints.read_only_hint is True:
        return "read_only", "readOnlyHint: true"
    if hints is not None and hints.idempotent_hint is True:
        return "idempotent", "idempotentHint: true"
    if hints is None:
        return "state_changing", "no annotations in tools/list: the MCP default"
    if hints.destructive_hint is True:
        return "state_changing", "destructiveHint: true"
    return "state_changing", "in tools/list"


def assert_drafted(folder: Path, tools: list[Any]) -> None:
    """`policies check` accepts `folder`, and every tool has its file with its class and reasons."""
    checked = cli("policies", "check", str(folder))
    assert checked.returncode == 0, checked.stderr
    assert checked.stdout.startswith(f"OK {folder}: ")
    policy_set = load_policy_dir(folder)
    assert set(policy_set.exact) == {t.name for t in tools}
    assert (folder / "defaults.yaml").read_bytes() == (REPO_ROOT / "proxy/builtin_policies/defaults.yaml").read_bytes()
    for tool in tools:
        side_effect, reason = expected_class(tool)
        policy = policy_set.resolve(tool.name)  # no annotations: the file alone must give the class
        assert policy.side_effect.value == side_effect, tool.name
        layer = policy_set.exact[tool.name]
        assert policy.sources["side_effect"] == f"{layer.file}:side_effect"
        text = Path(layer.file).read_text()
        [line] = [x for x in text.splitlines() if x.startswith("side_effect:")]
        assert line.startswith(f"side_effect: {side_effect}  # ") and reason in line, (tool.name, line)
        first = next((x.strip() for x in (tool.description or "").splitlines() if x.strip()), "")
        head = text.splitlines()[0]
        assert head.startswith(f"# {tool.name}: "), head
        assert first[:100] in head or first[:100] == "", (first, head)


def _git_repo(tmp: Path) -> Path:
    repo = (tmp / "repo").resolve()
    repo.mkdir()
    git = ["git", "-C", str(repo), "-c", "user.name=Interop", "-c", "user.email=interop@example.invalid"]
    subprocess.run([*git, "init", "-q", "-b", "main"], check=True, timeout=30)
    (repo / "README").write_text("interop\n")
    subprocess.run([*git, "add", "README"], check=True, timeout=30)
    subprocess.run([*git, "commit", "-q", "-m", "first"], check=True, timeout=30)
    return repo


def server_argv(name: str, prereq: Prerequisites, tmp: Path) -> list[str]:
    if name == "server-everything":
        return [prereq.node, prereq.server_everything, "stdio"]
    if name == "server-filesystem":
        (tmp / "files").mkdir()
        return [prereq.node, prereq.server_filesystem, str((tmp / "files").resolve())]
    if name == "server-memory":
        return ["env", f"MEMORY_FILE_PATH={tmp / 'memory.jsonl'}", prereq.node, prereq.server_memory]
    if name == "mcp-server-time":
        return [prereq.mcp_server_time, "--local-timezone", "UTC"]
    assert name == "mcp-server-git"
    return [prereq.mcp_server_git, "--repository", str(_git_repo(tmp))]


@pytest.mark.parametrize(
    "server", ["server-everything", "server-filesystem", "server-memory", "mcp-server-time", "mcp-server-git"]
)
def test_init_drafts_a_folder_check_accepts_with_each_tools_class_from_its_annotations(
    server: str, prereq: Prerequisites, tmp_path: Path
) -> None:
    argv = server_argv(server, prereq, tmp_path)
    tools = listed_stdio(argv)
    assert tools, f"{server} lists no tools"
    folder = tmp_path / "policies"
    run = cli("policies", "init", str(folder), "--", *argv, env=prereq.node_env())
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines()[0].startswith(f"{len(tools)} tool(s) listed: ")
    assert f"wrote {len(tools) + 1} file(s) in {folder}, 0 already the same, 0 left as they are" in run.stdout
    assert_drafted(folder, tools)


def test_init_over_streamable_http_lists_the_typescript_sdk_server(prereq: Prerequisites, tmp_path: Path) -> None:
    port = free_port()
    server = ts_http_server(prereq, port).start()
    try:
        url = f"http://127.0.0.1:{port}/mcp"
        tools = anyio.run(_listed, url)
        folder = tmp_path / "policies"
        run = cli("policies", "init", str(folder), "--upstream", url, "--upstream-header", "X-Trace: init")
        assert run.returncode == 0, run.stderr
        assert_drafted(folder, tools)
    finally:
        server.stop()


def test_rerun_writes_only_what_is_new_and_prints_a_diff_of_a_changed_file(
    prereq: Prerequisites, tmp_path: Path
) -> None:
    argv = server_argv("server-memory", prereq, tmp_path)
    folder = tmp_path / "policies"
    assert cli("policies", "init", str(folder), "--", *argv).returncode == 0
    # A person reviewed the folder: edited one tool's file, deleted another's, and moved a third
    # tool into a file of their own; one file of theirs is not init's at all.
    edited = folder / "create_entities.yaml"
    drafted = edited.read_text()
    [drafted_line] = [x for x in drafted.splitlines() if x.startswith("side_effect: ")]
    edited_text = drafted.replace(drafted_line, "side_effect: idempotent")
    edited_text += "deadline: 20s\n"
    edited.write_text(edited_text)
    (folder / "delete_entities.yaml").unlink()
    (folder / "read_graph.yaml").unlink()
    (folder / "reads.yaml").write_text("tools: [read_graph]\nside_effect: read_only\nattempt_timeout: 5s\n")
    before = {p.name: p.read_bytes() for p in folder.iterdir()}

    dry = cli("policies", "init", str(folder), "--dry-run", "--", *argv)
    assert dry.returncode == 1, dry.stderr  # a file would differ: left undone
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before  # a dry run writes nothing
    assert f"new      {folder / 'delete_entities.yaml'}:" in dry.stdout
    assert "+tools: [delete_entities]" in dry.stdout

    run = cli("policies", "init", str(folder), "--", *argv)
    assert run.returncode == 1, run.stderr
    assert edited.read_text() == edited_text  # not touched
    assert f"differs  {edited}: not touched" in run.stdout
    assert f"--- {edited} (as it is)" in run.stdout
    assert "-side_effect: idempotent" in run.stdout and "-deadline: 20s" in run.stdout
    assert f"\n+{drafted_line}\n" in run.stdout
    assert f"wrote    {folder / 'delete_entities.yaml'}" in run.stdout  # what was missing is new again
    assert (folder / "delete_entities.yaml").exists()
    assert not (folder / "read_graph.yaml").exists()  # reads.yaml names it: not drafted a second time
    assert f"kept     {folder / 'reads.yaml'}: names 'read_graph' already" in run.stdout
    assert f"same     {folder / 'defaults.yaml'}" in run.stdout
    assert "wrote 1 file(s)" in run.stdout and "1 left as they are (diffs above)" in run.stdout
    assert cli("policies", "check", str(folder)).returncode == 0


def test_init_failures_are_one_line_and_a_non_zero_exit(prereq: Prerequisites, tmp_path: Path) -> None:
    port = free_port()  # nothing listens there now
    unreachable = cli("policies", "init", str(tmp_path / "a"), "--upstream", f"http://127.0.0.1:{port}/mcp")
    refused = cli("policies", "init", str(tmp_path / "b"), "--", *PAGED, "--refuse-initialize")
    (tmp_path / "file").write_text("not a folder\n")
    a_file = cli("policies", "init", str(tmp_path / "file"), "--", *server_argv("server-memory", prereq, tmp_path))
    no_repo = tmp_path / "no-such-repo"  # mcp-server-git exits at start, saying why on stderr
    exited = cli("policies", "init", str(tmp_path / "c"), "--", prereq.mcp_server_git, "--repository", str(no_repo))
    for run, says in [
        (unreachable, f"initialize failed: cannot connect to 127.0.0.1:{port}"),
        (
            refused,
            "the server refused initialize: this server speaks no 2025 revision (code -32602), and does not list"
            " 2026-07-28 in an answer to server/discover",
        ),
        (a_file, f"{tmp_path / 'file'}: is a file, not a folder"),
        (exited, "initialize failed: upstream process exited with code "),
    ]:
        assert run.returncode == 2
        assert run.stdout == ""
        [line] = run.stderr.splitlines()
        assert line.startswith("mcp-recovery-proxy: ") and says in line, line
    assert f"; its stderr said: ERROR:mcp_server_git.server:{no_repo} does not exist" in exited.stderr
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
    assert (tmp_path / "file").read_text() == "not a folder\n"


def test_init_follows_every_page_of_tools_list(tmp_path: Path) -> None:
    argv = [*PAGED, "--tools", "9", "--page-size", "2"]
    tools = listed_stdio(argv)
    assert len(tools) == 9  # five pages
    folder = tmp_path / "policies"
    pid_file = tmp_path / "server.pid"
    run = cli("policies", "init", str(folder), "--", *argv, "--pid-file", str(pid_file), "--linger-s", "300")
    assert run.returncode == 0, run.stderr
    # the server init started is stopped when init ends: gone, or a zombie when its guard was
    # killed before reaping it (re-parented to the namespace's init, which reaps when it will)
    assert not pid_alive(int(pid_file.read_text()))
    assert run.stdout.splitlines()[0] == "9 tool(s) listed: 3 read_only, 2 idempotent, 4 state_changing"
    assert_drafted(folder, tools)
    texts = {t.name: (folder / f"{t.name}.yaml").read_text() for t in tools}
    assert "side_effect: state_changing  # destructiveHint: true in tools/list" in texts["tool_02"]
    assert "side_effect: idempotent  # idempotentHint: true in tools/list" in texts["tool_01"]
    assert "A second line" not in texts["tool_00"]


def test_a_tools_list_whose_pages_never_end_is_refused(tmp_path: Path) -> None:
    run = cli("policies", "init", str(tmp_path / "p"), "--", *PAGED, "--loop")
    assert run.returncode == 2 and run.stdout == ""
    [line] = run.stderr.splitlines()
    assert "repeats an earlier nextCursor; the listing does not end" in line
    assert not (tmp_path / "p").exists()


def test_init_over_sse_and_over_mutual_tls_drafts_the_same_folder_as_over_http(tmp_path: Path) -> None:
    """`sse+http://`, and `https://` with `--upstream-ca` and a client certificate, as `serve` takes
    them; a missing client certificate is one line and exit 2."""
    from tests.fixtures.helpers import ScriptedHTTP
    from tests.fixtures.tls import make_pki

    pki = make_pki(tmp_path / "pki")
    mtls = ["--ssl-certfile", str(pki.server_cert), "--ssl-keyfile", str(pki.server_key), "--ssl-ca-certs", str(pki.ca)]
    folders = {}
    with (
        ScriptedHTTP(tmp_path / "http.jsonl") as http,
        ScriptedHTTP(tmp_path / "sse.jsonl", transport="sse") as sse,
        ScriptedHTTP(tmp_path / "tls.jsonl", extra=mtls) as tls,
    ):
        tools = anyio.run(_listed, http.url)
        https = f"https://127.0.0.1:{tls.port}/mcp"
        client = ["--upstream-client-cert", str(pki.client_cert), "--upstream-client-key", str(pki.client_key)]
        for name, flags in [
            ("http", ["--upstream", http.url]),
            ("sse", ["--upstream", f"sse+{sse.url}"]),
            ("tls", ["--upstream", https, "--upstream-ca", str(pki.ca), *client]),
        ]:
            folders[name] = tmp_path / name
            run = cli("policies", "init", str(folders[name]), *flags)
            assert run.returncode == 0, (name, run.stderr)
        refused = cli("policies", "init", str(tmp_path / "no-cert"), "--upstream", https, "--upstream-ca", str(pki.ca))
    assert_drafted(folders["http"], tools)
    for name in ("sse", "tls"):
        assert {p.name: p.read_bytes() for p in folders[name].iterdir()} == {
            p.name: p.read_bytes() for p in folders["http"].iterdir()
        }, name
    assert refused.returncode == 2 and refused.stdout == ""
    [line] = refused.stderr.splitlines()
    assert line.startswith(f"mcp-recovery-proxy: policies init: http:127.0.0.1:{tls.port}/mcp: initialize failed"), line


def test_a_server_that_speaks_only_2026_is_listed_in_that_revision(tmp_path: Path) -> None:
    argv = [*PAGED, "--refuse-initialize", "--modern", "--tools", "5", "--page-size", "2"]
    folder = tmp_path / "policies"
    run = cli("policies", "init", str(folder), "--", *argv)
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines()[0] == "5 tool(s) listed: 2 read_only, 1 idempotent, 2 state_changing"
    assert set(load_policy_dir(folder).exact) == {f"tool_{i:02d}" for i in range(5)}
