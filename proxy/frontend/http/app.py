"""The Streamable HTTP frontend: one endpoint serving both protocol eras (pure ASGI, on uvicorn).

- 2025 handshake revisions: `initialize` opens a session (`Mcp-Session-Id`, its own upstream
  link); later POSTs name it (missing → 400, unknown or expired → 404); GET opens the session's
  listen stream (one at a time, else 409); DELETE ends the session. A client that disconnects has
  not cancelled (the spec says so): the request in flight finishes, its answer is dropped.
- 2026-07-28: every POST stands alone. The `MCP-Protocol-Version`, `Mcp-Method`, `Mcp-Name` and
  `Mcp-Param-*` headers are checked with the SDK's own validation ladder (`mcp.shared.inbound`),
  so the proxy rejects exactly what the reference server rejects, even in front of a stdio
  upstream that never sees headers. Closing the response stream cancels the request.
- A request's answer is `application/json` when nothing else arrives first, with the HTTP status
  the 2026 table maps its error to; otherwise the response becomes `text/event-stream`, carrying
  the request's notifications and server-to-client requests, then its response, with keep-alive
  comments while nothing happens (`Answers`, proxy/frontend/http/answer.py, writes every answer).
- Safety: Host and Origin are checked against allow-lists (DNS rebinding), bodies are bounded,
  malformed JSON-RPC gets a JSON-RPC error, and nothing a peer sends can crash the proxy.
- Bounded for a client that does not read: every response and listen stream queues at most
  `--stream-buffer-bytes` (then a response stream drops what is not its answer and a listen
  stream is closed, counted), and the buffers kept for resumption are bounded in bytes per
  response (`--replay-stream-bytes`) and in total (`--replay-total-bytes`) (`resume.Replays`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import logging
from collections.abc import MutableMapping
from typing import Any

from proxy import jsonrpc, sdk
from proxy.auth.base import Authenticator, AuthRefused, Principal
from proxy.core.relay import Relay
from proxy.core.service import Service
from proxy.errors import UpstreamFailure
from proxy.frontend.clients import ClientIdentity
from proxy.frontend.hostcheck import (
    LOOPBACK_HOST_PATTERNS,
    LOOPBACK_ORIGIN_PATTERNS,
    HostAllowList,
    OriginAllowList,
    duplicated,
)
from proxy.frontend.http.answer import Answers
from proxy.frontend.http.checks import SINGLE_HEADERS, check_modern_headers, forwarded_headers
from proxy.frontend.http.identity import Identity
from proxy.frontend.http.listen import serve_listen
from proxy.frontend.http.outbox import ClientGone, Receive, Send, Stream, primes
from proxy.frontend.http.respond import respond, respond_error, respond_json, respond_session_refused
from proxy.frontend.http.resume import Replays
from proxy.jsonrpc import Message
from proxy.sdk import inbound
from proxy.settings import LOOPBACK_HOSTS, Settings
from proxy.telemetry.shed import SHED

log = logging.getLogger("proxy.frontend.http")

Scope = MutableMapping[str, Any]


class McpHttpApp:
    def __init__(self, service: Service, settings: Settings, *, auth: Authenticator | None = None) -> None:
        self.service = service
        self.path = settings.listen_path.rstrip("/") or "/"
        # Identity (proxy/auth/): every MCP request is authenticated before anything else is done
        # with it; None (`--auth none`) costs the request path nothing.
        self.auth = auth
        self.identity = Identity(service, settings, self.path, auth)
        self.max_body = settings.max_body_bytes
        host = settings.listen_host
        loopback = host in LOOPBACK_HOSTS
        hosts = list(settings.allowed_hosts)
        origins = list(settings.allowed_origins)
        if loopback:
            hosts += LOOPBACK_HOST_PATTERNS
            origins += LOOPBACK_ORIGIN_PATTERNS
        self.allowed_hosts = HostAllowList(hosts) if hosts else None  # None: any Host (non-loopback, no list)
        self.stream_buffer_bytes = settings.stream_buffer_bytes
        # jwt and tokens: per-client limits count by the principal the proxy verified (proxy/frontend/clients.py)
        self.clients = ClientIdentity(
            trusts_proxies=bool(settings.forwarded_allow_ips), by_principal=self.identity.binds_sessions
        )
        self.replays = Replays(settings.replay_stream_bytes, settings.replay_total_bytes)
        # Every POST's answer is written there (proxy/frontend/http/answer.py).
        self.answers = Answers(self.identity, self.replays, self.stream_buffer_bytes)
        # Open 2025 listen streams: they never end by themselves, so shutdown ends them
        # (`close_streams`) instead of uvicorn cancelling their tasks after its grace period.
        self._listening: set[Stream] = set()
        self._shutting_down = False
        self.allowed_origins = OriginAllowList(origins)
        if not loopback and not settings.allowed_hosts:
            log.warning(
                "listening on %s without --allowed-host (MCP_RECOVERY_ALLOWED_HOSTS): any Host header is accepted", host
            )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        try:
            await self._http(scope, receive, send)
        except ClientGone:
            return
        except Exception:  # the proxy never crashes because a peer misbehaved
            log.exception("unexpected error serving %s %s", scope.get("method"), scope.get("path"))
            with contextlib.suppress(Exception):
                await respond_error(send, 500, None, jsonrpc.INTERNAL_ERROR, "internal proxy error")

    def close_streams(self) -> None:
        """The server is shutting down: end every open listen stream (each writes its closing
        chunk and returns), and open no new one."""
        self._shutting_down = True
        for stream in list(self._listening):
            stream.close()

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    await self.service.start()
                except Exception as exc:
                    await send({"type": "lifespan.startup.failed", "message": str(exc)})
                    return
                # Everything built so far (modules, settings, policies, the SDK's models) lives as
                # long as the process: out of the collector's reach, a full collection walks only
                # what traffic created instead of the whole start-up heap.
                gc.freeze()
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.service.aclose()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope["path"].rstrip("/") or "/"
        if path != self.path and path not in self.identity.metadata_paths:
            await respond(send, 404, b"Not Found", [(b"content-type", b"text/plain")])
            return
        # Header values are trimmed as RFC 9110 says (some HTTP parsers keep surrounding blanks);
        # ASGI servers give header names in lower case already.
        raw = scope["headers"]
        headers = {k.decode("latin-1"): v.decode("latin-1").strip() for k, v in raw}
        if len(headers) < len(raw):
            twice = next((name for name in SINGLE_HEADERS if duplicated(raw, name)), None)
            if twice is not None:
                # A header that names one thing, given twice: which one a check read and which one
                # a later hop (an ingress, a gateway, the upstream) reads may differ, so the request
                # is refused rather than judged on either (RFC 9112 asks for 400 on a second Host).
                # The 2026 routing headers are the SDK ladder's (-32020, `_check_modern_headers`).
                text = b"Duplicate " + twice + b" header"
                await respond(send, 400, text, [(b"content-type", b"text/plain")])
                return
        host = headers.get("host", "")
        if self.allowed_hosts is not None and not self.allowed_hosts(host):
            await respond(send, 421, b"Invalid Host header", [(b"content-type", b"text/plain")])
            return
        origin = headers.get("origin")
        if origin is not None and not self.allowed_origins(origin):
            await respond(send, 403, b"Invalid Origin header", [(b"content-type", b"text/plain")])
            return
        method = scope["method"]
        if method == "GET" and self.service.draining:
            SHED.count("http_refused", "shutdown")
            await respond_error(send, 503, None, jsonrpc.SHUTTING_DOWN, "the proxy is shutting down")
            return
        if path != self.path:
            await self.identity.metadata(send, method)
            return
        principal: Principal | None = None
        if self.auth is not None:
            try:
                principal = await self.auth.authenticate(headers)
            except AuthRefused as refused:
                await self.identity.refuse(send, refused, method)
                return
        if method == "POST":
            await self._post(scope, receive, send, headers, principal)
        elif method == "GET":
            await self._get(receive, send, headers, principal)
        elif method == "DELETE":
            await self._delete(send, headers, principal)
        else:
            await respond(send, 405, b"", [(b"allow", b"GET, POST, DELETE")])

    # -- POST ---------------------------------------------------------------------------------
    async def _read_body(self, receive: Receive, headers: dict[str, str]) -> bytes | None:
        declared = headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_body:
            return None
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise ClientGone
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body:
                return None
            chunks.append(chunk)
            if not message.get("more_body"):
                return b"".join(chunks)

    async def _post(
        self, scope: Scope, receive: Receive, send: Send, headers: dict[str, str], principal: Principal | None
    ) -> None:
        ctype = headers.get("content-type", "")
        if not ctype.lower().startswith("application/json"):
            await respond_error(send, 415, None, jsonrpc.INVALID_REQUEST, "Content-Type must be application/json")
            return
        accept = headers.get("accept", "*/*").lower()
        if not any(a in accept for a in ("application/json", "text/event-stream", "*/*")):
            await respond_error(send, 406, None, jsonrpc.INVALID_REQUEST, "Accept must include application/json")
            return
        body = await self._read_body(receive, headers)
        if body is None:
            await respond_error(send, 413, None, jsonrpc.INVALID_REQUEST, f"body exceeds {self.max_body} bytes")
            return
        try:
            message = jsonrpc.loads(body)
        except jsonrpc.TooDeep as exc:
            await respond_error(send, 400, None, jsonrpc.PARSE_ERROR, f"Parse error: {exc}")
            return
        except (ValueError, RecursionError):
            await respond_error(send, 400, None, jsonrpc.PARSE_ERROR, "Parse error: the body is not valid JSON")
            return
        if isinstance(message, list):
            await respond_error(send, 400, None, jsonrpc.INVALID_REQUEST, "JSON-RPC batches are not supported")
            return
        problem = jsonrpc.validate(message)
        if problem is not None:
            id_ = message.get("id") if isinstance(message, dict) and jsonrpc.valid_id(message.get("id")) else None
            await respond_error(send, 400, id_, jsonrpc.INVALID_REQUEST, f"Invalid Request: {problem}")
            return
        if self.service.draining and "id" in message and "method" in message:
            # A new request while shutting down (notifications and a client's answers to server
            # requests still reach the calls in flight): refused, so a client retries elsewhere.
            SHED.count("http_refused", "shutdown")
            await respond_error(send, 503, message["id"], jsonrpc.SHUTTING_DOWN, "the proxy is shutting down")
            return
        version = headers.get("mcp-protocol-version")
        if version in jsonrpc.MODERN_VERSIONS and message.get("method") == "initialize" and "id" in message:
            # A 2026 endpoint has no handshake: initialize is an unknown method there.
            await respond_error(send, 404, message["id"], jsonrpc.METHOD_NOT_FOUND, "Method not found: initialize")
            return
        modern = (version in jsonrpc.MODERN_VERSIONS or jsonrpc.is_modern_request(message)) and (
            message.get("method") != "initialize"
        )
        if modern:
            await self._post_modern(scope, receive, send, headers, message, principal)
        else:
            await self._post_legacy(scope, receive, send, headers, message, version, principal)

    async def _post_modern(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        headers: dict[str, str],
        message: Message,
        principal: Principal | None,
    ) -> None:
        if "id" not in message or "method" not in message:
            # 2026 HTTP defines no client-to-server notifications or responses: acknowledge and drop.
            await respond(send, 202)
            return
        try:
            relay = await self.service.modern_relay_for(message)  # a tools/call: always one
        except UpstreamFailure as failure:
            await respond_error(send, 503, message["id"], jsonrpc.INTERNAL_ERROR, jsonrpc.bounded(failure.detail))
            return
        if relay is None:
            if message.get("method") == "server/discover":
                await respond_error(send, 404, message["id"], jsonrpc.METHOD_NOT_FOUND, "Method not found")
            else:
                await respond_json(
                    send,
                    400,
                    jsonrpc.error(
                        message["id"],
                        jsonrpc.UNSUPPORTED_PROTOCOL_VERSION,
                        "Unsupported protocol version",
                        {"supported": list(jsonrpc.LEGACY_VERSIONS), "requested": jsonrpc.LATEST_MODERN},
                    ),
                )
            return
        forwarded = forwarded_headers(headers, self.identity.forward_credentials)
        await sdk.ensure_loaded()  # the SDK's ladder loads at the first 2026 request, off the event loop
        rejection = check_modern_headers(scope, headers, message)
        if rejection is None and message.get("method") == "tools/call":
            claimed = forwarded is not None and any(k.startswith("mcp-param-") for k in forwarded)
            rejection = await self._check_param_headers(relay, headers, message, claimed, principal)
        if rejection is not None:
            await respond_json(
                send,
                inbound.ERROR_CODE_HTTP_STATUS.get(rejection.code, 400),
                jsonrpc.error(message["id"], rejection.code, rejection.message, rejection.data),
            )
            return
        if principal is not None and not await self.identity.scopes_suffice(send, relay, message, principal):
            return
        caller = self.clients.key(scope, headers, principal)
        await self.answers.answer(
            relay, message, receive, send, forwarded, modern=True, caller=caller, principal=principal
        )

    async def _check_param_headers(
        self, relay: Relay, headers: dict[str, str], message: Message, claimed: bool, principal: Principal | None
    ) -> Any:
        """`claimed`: the request carries `Mcp-Param-*` headers."""
        params = message.get("params") or {}
        name = params.get("name")
        arguments = params.get("arguments") or {}
        if not isinstance(name, str) or not isinstance(arguments, dict):
            return None
        if not arguments and not claimed:
            return None
        # a listing the proxy makes for this caller carries its credential (passthrough), nothing else
        credential = headers.get("authorization") if self.identity.forward_credentials else None
        tool = await relay.lookup_tool(
            name,
            message,
            headers={"authorization": credential} if credential is not None else None,
            principal=principal,
        )
        if tool is None:
            return None  # an unknown tool: the upstream owns that answer
        if not claimed and not relay.catalog_of(principal).declares_param_headers(name):
            return None  # nothing to mirror and nothing claimed: skip the schema walk
        return inbound.validate_mcp_param_headers(tool.get("inputSchema"), arguments, headers)

    async def _post_legacy(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        headers: dict[str, str],
        message: Message,
        version: str | None,
        principal: Principal | None,
    ) -> None:
        service = self.service
        if message.get("method") == "initialize":
            if not service.legacy_supported():
                await respond_json(
                    send,
                    400,
                    jsonrpc.error(
                        message.get("id"),
                        jsonrpc.UNSUPPORTED_PROTOCOL_VERSION,
                        "this upstream serves only the 2026-07-28 protocol; the initialize handshake is not accepted",
                        {"supported": list(jsonrpc.MODERN_VERSIONS)},
                    ),
                )
                return
            if "id" not in message:
                await respond_error(send, 400, None, jsonrpc.INVALID_REQUEST, "initialize must be a request")
                return
            try:
                owner = principal.id if self.identity.binds_sessions and principal is not None else None
                new_id, new_relay = await service.new_session(self.clients.key(scope, headers, principal), owner)
            except UpstreamFailure as failure:
                await respond_session_refused(send, message["id"], failure)
                return
            credentials = forwarded_headers(headers, True) if self.identity.forward_credentials else None
            ok = await self.answers.answer(
                new_relay, message, receive, send, credentials, modern=False, session_id=new_id, principal=principal
            )
            if not ok:
                await service.close_session(new_id)
            return
        if version is not None and version not in jsonrpc.LEGACY_VERSIONS:
            await respond_error(
                send,
                400,
                message.get("id"),
                jsonrpc.INVALID_REQUEST,
                f"Unsupported MCP-Protocol-Version: {jsonrpc.bounded(version, 40)}",
            )
            return
        session_id = headers.get("mcp-session-id")
        if session_id is None:
            await respond_error(
                send, 400, message.get("id"), jsonrpc.INVALID_REQUEST, "Bad Request: Missing session ID"
            )
            return
        relay = self.identity.session(session_id, principal)
        if relay is None:
            await respond_error(send, 404, message.get("id"), jsonrpc.INVALID_REQUEST, "Session not found")
            return
        if jsonrpc.is_request(message):
            if principal is not None and not await self.identity.scopes_suffice(send, relay, message, principal):
                return
            await self.answers.answer(
                relay,
                message,
                receive,
                send,
                forwarded_headers(headers, self.identity.forward_credentials),
                modern=False,
                session_id=session_id,
                prime=primes(version),
                principal=principal,
            )
        elif jsonrpc.is_notification(message):
            # A cancellation is acted on here (the request's task is cancelled), not judged by the
            # upstream; any other notification goes upstream with the caller's own credential.
            if message.get("method") == "notifications/cancelled" and not await self.identity.vouched(
                send, relay, headers, "POST", principal
            ):
                return
            credentials = forwarded_headers(headers, True) if self.identity.forward_credentials else None
            try:
                await relay.handle_notification(message, credentials, principal)
            except AuthRefused as refused:  # passthrough: the upstream refused the caller's credential
                await self.identity.refuse(send, refused, "POST")
                return
            await respond(send, 202)
        else:
            # An answer to the server's request goes upstream as the session's own message.
            if not await self.identity.vouched(send, relay, headers, "POST", principal):
                return
            await relay.handle_response(message)
            await respond(send, 202)

    # -- GET and DELETE ----------------------------------------------------------------------------
    async def _get(self, receive: Receive, send: Send, headers: dict[str, str], principal: Principal | None) -> None:
        if headers.get("mcp-protocol-version") in jsonrpc.MODERN_VERSIONS:
            await respond(send, 405, b"", [(b"allow", b"POST")])
            return
        if "text/event-stream" not in headers.get("accept", "").lower():
            await respond_error(send, 406, None, jsonrpc.INVALID_REQUEST, "Accept must include text/event-stream")
            return
        session_id = headers.get("mcp-session-id")
        relay = self.identity.session(session_id, principal) if session_id else None
        if session_id is None:
            await respond_error(send, 400, None, jsonrpc.INVALID_REQUEST, "Bad Request: Missing session ID")
            return
        if relay is None:
            await respond_error(send, 404, None, jsonrpc.INVALID_REQUEST, "Session not found")
            return
        if not await self.identity.vouched(send, relay, headers, "GET", principal):
            return
        last_event = headers.get("last-event-id", "")
        key, _, seq = last_event.partition(":")
        replay = self.replays.get(key)
        # Only this session's own stream resumes. Another session's key, a forged, malformed or
        # forgotten one are all alike: the GET opens the listen stream (or gets its 409), so the
        # answer never tells whether a key exists elsewhere. `seq` in ASCII digits and bounded:
        # `isdigit` alone takes `²` (a latin-1 header byte) and thousands of digits, on which
        # `int` raises (a 500 and a traceback per request).
        if (
            replay is not None
            and replay.session_id == session_id
            and seq.isascii()
            and seq.isdigit()
            and len(seq) <= 18
        ):
            await self.replays.resume(send, receive, replay, int(seq))
            return
        if self._shutting_down:
            await respond_error(send, 503, None, jsonrpc.INTERNAL_ERROR, "the proxy is shutting down")
            return
        stream = Stream(asyncio.get_running_loop(), listen=True, max_bytes=self.stream_buffer_bytes)
        if not relay.attach_listen(stream):
            await respond_error(send, 409, None, jsonrpc.INVALID_REQUEST, "Conflict: a listen stream is already open")
            return
        self._listening.add(stream)
        recheck = principal is not None and self.identity.binds_sessions and self.auth is not None
        try:
            still_valid = functools.partial(self.identity.still_valid, headers) if recheck else None
            await serve_listen(send, receive, stream, session_id, self.service.sessions, still_valid)
        finally:
            self._listening.discard(stream)
            relay.detach_listen(stream)

    async def _delete(self, send: Send, headers: dict[str, str], principal: Principal | None) -> None:
        if headers.get("mcp-protocol-version") in jsonrpc.MODERN_VERSIONS:
            await respond(send, 405, b"", [(b"allow", b"POST")])
            return
        session_id = headers.get("mcp-session-id")
        if session_id is None:
            await respond_error(send, 400, None, jsonrpc.INVALID_REQUEST, "Bad Request: Missing session ID")
            return
        relay = self.identity.session(session_id, principal)
        if relay is not None and not await self.identity.vouched(send, relay, headers, "DELETE", principal):
            return
        if relay is not None and await self.service.close_session(session_id):
            await respond(send, 200)
        else:
            await respond_error(send, 404, None, jsonrpc.INVALID_REQUEST, "Session not found")
