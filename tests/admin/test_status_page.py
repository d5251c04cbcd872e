"""The status page behind the admin token: Basic credentials (what a browser sends after its own
prompt) with the token as password, or the bearer token; anything else is 401 with a challenge a
browser answers. The page's own headers keep it from being framed or running foreign script.

The ASGI app is driven in-process (httpx's ASGI transport): the paths checked here never reach
the service, so none is built (`None` stands in for it; a path that used it would fail)."""

from __future__ import annotations

import base64
import re

import httpx
import pytest

from proxy.admin.app import build_admin_app

pytestmark = pytest.mark.anyio

TOKEN = "s3cret-admin-token"


def _basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


async def _get(path: str, authorization: str | None = None) -> httpx.Response:
    app = build_admin_app(None, admin_token=TOKEN)  # type: ignore[arg-type]
    headers = {"authorization": authorization} if authorization is not None else {}
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1:9464") as client:
        return await client.get(path, headers=headers)


@pytest.mark.parametrize(
    "authorization",
    [None, _basic("operator", "wrong"), "Basic !!not-base64!!", f"Bearer {TOKEN}x", _basic(TOKEN, ""), TOKEN],
    ids=["none", "wrong-password", "bad-base64", "wrong-bearer", "token-as-user", "bare-token"],
)
@pytest.mark.parametrize("path", ["/", "/status.json", "/status/explain?tool=x"])
async def test_the_status_page_refuses_without_the_token(path: str, authorization: str | None) -> None:
    answer = await _get(path, authorization)
    assert answer.status_code == 401
    assert answer.headers["www-authenticate"].startswith("Basic "), "a browser prompts for it"
    assert "Problem calls" not in answer.text


@pytest.mark.parametrize("authorization", [_basic("anyone", TOKEN), _basic("", TOKEN), f"Bearer {TOKEN}"])
async def test_the_token_opens_the_page_as_basic_password_or_bearer(authorization: str) -> None:
    answer = await _get("/", authorization)
    assert answer.status_code == 200 and "Problem calls" in answer.text
    assert TOKEN not in answer.text


async def test_the_other_admin_paths_keep_their_bearer_challenge() -> None:
    answer = await _get("/metrics")
    assert answer.status_code == 401 and answer.headers["www-authenticate"].startswith("Bearer ")


async def test_the_page_runs_only_its_own_inline_script_and_cannot_be_framed() -> None:
    answer = await _get("/", f"Bearer {TOKEN}")
    policy = answer.headers["content-security-policy"]
    (nonce,) = re.findall(r"script-src 'nonce-([^']+)'", policy)
    assert "default-src 'none'" in policy and "frame-ancestors 'none'" in policy
    assert answer.headers["x-frame-options"] == "DENY" and answer.headers["cache-control"] == "no-store"
    scripts = re.findall(r"<script([^>]*)>", answer.text)
    assert scripts == [f' nonce="{nonce}"'], "one script, carrying this response's nonce"
    again = await _get("/", f"Bearer {TOKEN}")
    assert nonce not in again.headers["content-security-policy"], "a fresh nonce per response"
