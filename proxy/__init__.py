"""mcp-recovery-proxy: a recovery layer in front of MCP tool servers."""

__version__ = "0.1.0"
