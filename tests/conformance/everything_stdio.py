"""Run the SDK's everything-server (installed by scripts/setup-conformance.sh) over stdio."""

from mcp_everything_server.server import mcp

if __name__ == "__main__":
    mcp.run("stdio")
