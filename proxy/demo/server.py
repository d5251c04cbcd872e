"""A deliberately flaky demo MCP server: put `mcp-recovery-proxy` in front of it and watch it recover.

Run it over stdio (the default) or Streamable HTTP on 127.0.0.1::

    python -m proxy.demo.server
    python -m proxy.demo.server --http --port 8765     # endpoint http://127.0.0.1:8765/mcp
    python -m proxy.demo.server --chaos                # failures without a category (below)

What each tool demonstrates:

- `lookup_customer(customer_id)` (read-only): a transient failure the proxy retries away. The
  first 2 of every 3 calls per customer id fail with `errorCategory: "transient"`; the 3rd
  answers. With the shipped policy (3 attempts) one proxied call succeeds.
- `search_archive(query)` (read-only): a failure retrying cannot fix. The archive is always
  down, so the proxy spends its budget and returns a structured unresolved result that keeps
  the partial result the server sent (`partialResults` in its error, beside `errorCategory`: the
  report lists it under its own `partialResults` and suggests `accept_partial`).
- `refund(order_id, amount)` (no annotations, so state-changing): an outcome the proxy must not
  guess. The refund is recorded first, then the tool hangs (`DEMO_REFUND_HANG_S`, default 30 s).
  When the proxy's attempt times out the refund may have happened, so it does not retry and
  instead points at the status check.
- `refund_status(order_id)` (read-only): that status check; it tells whether the refund exists.
- `slow_report(steps=5)` (read-only): progress notifications relayed through the proxy.
- `echo(text)` (read-only): a plain pass-through.

Chaos mode (`--chaos`, or `DEMO_CHAOS=1` in the environment, which reaches the server that
`mcp-recovery-proxy demo` starts): the server fails the way a server that follows no error
convention does. `lookup_customer` fails just as often, but its failure is a plain error text,
`the customer database is busy, try again in a moment`, with no `errorCategory` or
`isRetryable`: nothing tells the proxy it is temporary, so the call is reported unclassified and
not retried until a policy rule classifies the text (`mcp-recovery-proxy policies suggest`
drafts that rule from what the proxy saw).

State lives in memory, so restarting the server resets it.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
from collections import Counter
from typing import Annotated

import anyio
from mcp.server.mcpserver import Context, MCPServer
from mcp.types import CallToolResult, TextContent, ToolAnnotations
from pydantic import BaseModel

READ_ONLY = ToolAnnotations(readOnlyHint=True, openWorldHint=False)

mcp = MCPServer(
    name="flaky-demo",
    version="0.1.0",
    instructions=(
        "A demo shop backend that fails on purpose. Use lookup_customer and search_archive to read, "
        "refund to issue a refund, and refund_status to check whether a refund went through."
    ),
)

_lookups: Counter[str] = Counter()
# Chaos mode: failures as a plain text, without the error convention's category (module docstring).
_chaos = os.environ.get("DEMO_CHAOS", "").strip().lower() in ("1", "true", "yes", "on")
BUSY_TEXT = "the customer database is busy, try again in a moment"


class _RefundBook:
    """The shop's refunds, shared by every process of one demo run.

    The proxy gives each 2025 session its own server process, as a real stdio server would get;
    a real backend keeps its state in a database, so the demo keeps it in one small JSON file
    (`DEMO_STATE_FILE`, set by `mcp-recovery-proxy demo`; in memory when unset). Writes are
    whole-file replaces (atomic rename); a lost race between two demo processes is harmless here.
    """

    def __init__(self, path: str | None) -> None:
        self.path = path
        self.memory: dict[str, float] = {}

    def _read(self) -> dict[str, float]:
        if not self.path:
            return self.memory
        try:
            with open(self.path, encoding="utf-8") as f:
                data = json.load(f)
            return {str(k): float(v) for k, v in data.items()}
        except (OSError, ValueError, AttributeError):
            return {}

    def add(self, order_id: str, amount: float) -> None:
        book = self._read()
        book[order_id] = book.get(order_id, 0.0) + amount
        if not self.path:
            return
        tmp = f"{self.path}.{os.getpid()}.tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(book, f)
        os.replace(tmp, self.path)

    def get(self, order_id: str) -> float | None:
        return self._read().get(order_id)


_refunds = _RefundBook(os.environ.get("DEMO_STATE_FILE"))


class Customer(BaseModel):
    customer_id: str
    name: str
    email: str
    tier: str
    open_orders: int


def _transient_error(message: str, **extra: object) -> CallToolResult:
    structured = {"errorCategory": "transient", "isRetryable": True, "message": message, **extra}
    return CallToolResult(
        content=[TextContent(type="text", text=message)], structured_content=structured, is_error=True
    )


def _plain_error(message: str) -> CallToolResult:
    return CallToolResult(content=[TextContent(type="text", text=message)], is_error=True)


def _fake_customer(customer_id: str) -> Customer:
    digest = hashlib.sha256(customer_id.encode()).digest()
    first = ["Ada", "Grace", "Alan", "Edsger", "Barbara", "Donald"][digest[0] % 6]
    last = ["Lovelace", "Hopper", "Turing", "Dijkstra", "Liskov", "Knuth"][digest[1] % 6]
    return Customer(
        customer_id=customer_id,
        name=f"{first} {last}",
        email=f"{first.lower()}.{last.lower()}@example.com",
        tier=["bronze", "silver", "gold"][digest[2] % 3],
        open_orders=digest[3] % 5,
    )


@mcp.tool(title="Look up a customer", annotations=READ_ONLY)
async def lookup_customer(customer_id: str) -> Annotated[CallToolResult, Customer]:
    """Fetch a customer's profile (name, email, tier, open orders) by customer id.

    The customer database is flaky: it is briefly unavailable on 2 of every 3 lookups.
    """
    _lookups[customer_id] += 1
    if _lookups[customer_id] % 3 != 0:
        if _chaos:
            return _plain_error(BUSY_TEXT)
        return _transient_error("customer database briefly unavailable")
    customer = _fake_customer(customer_id)
    return CallToolResult(
        content=[TextContent(type="text", text=customer.model_dump_json())],
        structured_content=customer.model_dump(mode="json"),
    )


@mcp.tool(title="Search the order archive", annotations=READ_ONLY)
async def search_archive(query: str) -> CallToolResult:
    """Search archived orders older than a year. The archive is currently down."""
    note = f"recent orders matching {query!r} were checked; archived orders could not be searched"
    result = _transient_error(
        "order archive unavailable", partialResults={"searched": "recent orders only", "matches": 0}
    )
    result.content.append(TextContent(type="text", text=f"partial result: {note}"))
    return result


@mcp.tool(title="Refund an order")
async def refund(order_id: str, amount: float) -> CallToolResult:
    """Refund `amount` on an order. Not safe to repeat: each call issues a refund.

    The payment provider is slow to confirm: the refund is recorded at once, but the answer
    takes DEMO_REFUND_HANG_S seconds (default 30).
    """
    _refunds.add(order_id, amount)
    await anyio.sleep(float(os.environ.get("DEMO_REFUND_HANG_S", "30")))
    text = f"refunded {amount:.2f} on order {order_id}"
    return CallToolResult(
        content=[TextContent(type="text", text=text)],
        structured_content={"order_id": order_id, "refunded": amount, "status": "confirmed"},
    )


@mcp.tool(title="Check a refund", annotations=READ_ONLY)
async def refund_status(order_id: str) -> CallToolResult:
    """Tell whether a refund exists for an order, and its total amount."""
    total = _refunds.get(order_id)
    status = {"order_id": order_id, "refunded": total is not None, "amount": total or 0.0}
    text = f"order {order_id}: " + (f"refund of {total:.2f} recorded" if total is not None else "no refund")
    return CallToolResult(content=[TextContent(type="text", text=text)], structured_content=status)


@mcp.tool(title="Build a slow report", annotations=READ_ONLY)
async def slow_report(ctx: Context, steps: int = 5) -> str:
    """Build a sales report in `steps` stages, reporting progress after each one."""
    for step in range(1, steps + 1):
        await anyio.sleep(0.1)
        await ctx.report_progress(step, steps, f"stage {step} of {steps}")
    return f"report ready: {steps} stages"


@mcp.tool(title="Echo", annotations=READ_ONLY)
async def echo(text: str) -> str:
    """Return the text unchanged."""
    return text


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Flaky demo MCP server for mcp-recovery-proxy.")
    parser.add_argument("--http", action="store_true", help="serve Streamable HTTP on 127.0.0.1 instead of stdio")
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument(
        "--chaos",
        action="store_true",
        help="fail without an error category: lookup_customer's failures are a plain error text (also DEMO_CHAOS=1)",
    )
    args = parser.parse_args(argv)
    if args.chaos:
        global _chaos
        _chaos = True
    if args.http:
        mcp.run("streamable-http", host="127.0.0.1", port=args.port)
    else:
        mcp.run("stdio")


if __name__ == "__main__":
    main()
