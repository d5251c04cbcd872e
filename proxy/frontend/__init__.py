"""Frontends: how MCP clients reach the proxy (Streamable HTTP, stdio)."""
