"""The eras a network upstream speaks are learnt again when it says proxy and upstream disagree
(a 2026 header or version error means renegotiate before further tool calls: docs/recovery.md), and
on each readiness re-probe: an upstream redeployed without (or with) the 2026-07-28 revision is
then served accordingly: natively, or (`--era-bridge`, on by default) over a 2025 session of the
proxy's while the upstream lacks 2026. A real uvicorn upstream whose eras the test switches."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from proxy.core.engine import Engine
from proxy.core.relay import Relay
from proxy.core.service import Service
from proxy.policy.compiled import PolicySet
from proxy.settings import Settings
from proxy.upstream.bridge import ModernOverLegacy
from proxy.upstream.streamable.upstream import HttpUpstream

from .servers import serve

pytestmark = pytest.mark.anyio
MODERN = "2026-07-28"
LEGACY = "2025-11-25"


class SwitchableUpstream:
    """Speaks 2025 always and 2026 while `modern`; a 2026 request it does not speak gets -32022."""

    def __init__(self, modern: bool) -> None:
        self.modern = modern
        self.discovers = 0

    def app(self) -> Starlette:
        async def endpoint(request: Request) -> Response:
            if request.method == "DELETE":
                return Response(status_code=200)  # a session ended
            body = orjson.loads(await request.body())
            method, id_ = body.get("method"), body.get("id")
            if id_ is None:
                return Response(status_code=202)
            meta = (body.get("params") or {}).get("_meta") or {}
            if method == "server/discover":
                self.discovers += 1
                versions = [MODERN, LEGACY] if self.modern else [LEGACY]
                return self._result(id_, {"supportedVersions": versions, "capabilities": {"tools": {}}})
            if method == "initialize":
                result = {"protocolVersion": LEGACY, "capabilities": {"tools": {}}, "serverInfo": {"name": "s"}}
                return self._result(id_, result, {"mcp-session-id": "s1"})
            if "io.modelcontextprotocol/protocolVersion" in meta and not self.modern:
                error = {"code": -32022, "message": "Unsupported protocol version"}
                error["data"] = {"supported": [LEGACY], "requested": MODERN}
                return JSONResponse({"jsonrpc": "2.0", "id": id_, "error": error}, status_code=400)
            if method == "tools/list":
                tool = {"name": "echo", "inputSchema": {"type": "object"}, "annotations": {"readOnlyHint": True}}
                return self._result(id_, {"tools": [tool]})
            return self._result(id_, {"content": [{"type": "text", "text": "ok"}]})

        return Starlette(routes=[Route("/mcp", endpoint, methods=["POST", "DELETE"])])

    @staticmethod
    def _result(id_: Any, result: Any, headers: dict[str, str] | None = None) -> JSONResponse:
        return JSONResponse({"jsonrpc": "2.0", "id": id_, "result": result}, headers=headers)


class Answers:
    closed = False

    def __init__(self) -> None:
        self.messages: list[dict[str, Any]] = []

    def send(self, message: dict[str, Any]) -> None:
        self.messages.append(message)


def modern_call(name: str = "echo") -> dict[str, Any]:
    meta = {"io.modelcontextprotocol/protocolVersion": MODERN, "io.modelcontextprotocol/clientCapabilities": {}}
    return {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": name, "arguments": {}, "_meta": meta}}


async def wait_until(predicate: Any, timeout_s: float = 10.0) -> None:
    async with asyncio.timeout(timeout_s):
        while not predicate():  # noqa: ASYNC110 - polls a plain attribute the service sets
            await asyncio.sleep(0.02)


@pytest.mark.parametrize("bridge", [True, False], ids=["bridged", "refused"])
@pytest.mark.parametrize("engine", [True, False], ids=["engine", "plain-relay"])
async def test_an_upstream_that_dropped_the_2026_revision_is_renegotiated_after_its_version_error(
    engine: bool, bridge: bool
) -> None:
    upstream = SwitchableUpstream(modern=True)
    async with serve(upstream.app()) as port:
        settings = Settings(listen="http://127.0.0.1:1/mcp", upstream=f"http://127.0.0.1:{port}/mcp", era_bridge=bridge)
        tool_calls = Engine(policies=lambda: PolicySet(version="t")) if engine else None
        service = Service(settings, HttpUpstream(settings.upstream), tool_calls=tool_calls)  # type: ignore[arg-type]
        await service.start()
        try:
            relay = await service.modern_relay()
            assert isinstance(relay, Relay) and service.capabilities is not None and service.capabilities.modern
            assert not isinstance(relay.link, ModernOverLegacy)
            upstream.modern = False  # redeployed without 2026-07-28
            answers = Answers()
            await relay.handle_request(modern_call(), answers, by_id=False)
            assert answers.messages[0]["error"]["code"] == -32022, "the version error reaches the caller as is"
            await wait_until(lambda: service.capabilities is not None and not service.capabilities.modern)
            assert service.legacy_supported()
            discovers = upstream.discovers
            await relay.handle_request(modern_call(), Answers(), by_id=False)
            await asyncio.sleep(0.2)
            assert upstream.discovers == discovers, "renegotiation is rate-limited"
            bridged = await service.modern_relay()
            if not bridge:
                assert bridged is None, "2026 requests are now refused by the proxy itself"
                return
            # 2026 requests now go over a 2025 session of the proxy's (the upstream refuses any
            # request that still carries the 2026 `_meta` keys with -32022)
            assert bridged is not None and isinstance(bridged.link, ModernOverLegacy)
            answers = Answers()
            await bridged.handle_request(modern_call(), answers, by_id=False)
            result = answers.messages[0]["result"]
            assert result["content"][0]["text"] == "ok" and result["resultType"] == "complete"
        finally:
            await service.aclose()


@pytest.mark.parametrize("bridge", [True, False], ids=["bridged", "refused"])
async def test_an_upstream_that_gained_the_2026_revision_is_learnt_by_the_readiness_probe(bridge: bool) -> None:
    upstream = SwitchableUpstream(modern=False)
    async with serve(upstream.app()) as port:
        settings = Settings(
            listen="http://127.0.0.1:1/mcp",
            upstream=f"http://127.0.0.1:{port}/mcp",
            ready_check_interval_s=0.05,
            era_bridge=bridge,
        )
        service = Service(settings, HttpUpstream(settings.upstream))  # type: ignore[arg-type]
        await service.start()
        try:
            before = await service.modern_relay()
            if bridge:
                assert before is not None and isinstance(before.link, ModernOverLegacy)
                answers = Answers()
                await before.handle_request(modern_call(), answers, by_id=False)
                assert answers.messages[0]["result"]["content"][0]["text"] == "ok"
            else:
                assert before is None
            upstream.modern = True
            await asyncio.sleep(0.1)
            assert (await service.readiness())[0]
            assert service.capabilities is not None and service.capabilities.modern
            relay = await service.modern_relay()
            assert relay is not None and not isinstance(relay.link, ModernOverLegacy), "the upstream's own 2026 link"
            answers = Answers()
            await relay.handle_request(modern_call(), answers, by_id=False)
            assert answers.messages[0]["result"]["content"][0]["text"] == "ok"
        finally:
            await service.aclose()


async def test_an_upstream_whose_eras_flap_leaves_at_most_two_relays_retired_and_closes_the_older_bridges() -> None:
    """A rolling deploy behind a load balancer: the eras change on every re-probe. Each change
    gives the next request a relay of the fitting kind; the replaced ones are not kept for ever
    (a retired bridge holds a 2025 session)."""
    upstream = SwitchableUpstream(modern=False)
    async with serve(upstream.app()) as port:
        settings = Settings(
            listen="http://127.0.0.1:1/mcp", upstream=f"http://127.0.0.1:{port}/mcp", ready_check_interval_s=0.01
        )
        service = Service(settings, HttpUpstream(settings.upstream))  # type: ignore[arg-type]
        await service.start()
        bridges: list[ModernOverLegacy] = []
        try:
            for flip in range(8):
                modern = flip % 2 == 1
                upstream.modern = modern
                async with asyncio.timeout(10):
                    while service.capabilities is None or service.capabilities.modern is not modern:
                        await asyncio.sleep(0.02)  # the next re-probe is due
                        await service.readiness()
                relay = await service.modern_relay()
                assert relay is not None and isinstance(relay.link, ModernOverLegacy) is not modern
                if not modern:
                    bridges.append(relay.link)  # type: ignore[arg-type]
                answers = Answers()
                await relay.handle_request(modern_call(), answers, by_id=False)
                assert answers.messages[0]["result"]["content"][0]["text"] == "ok"
                assert len(service.eras.retired) <= 2
            await wait_until(lambda: not service.eras.closing)  # the closes under way
        finally:
            await service.aclose()
    assert len(bridges) == 4
