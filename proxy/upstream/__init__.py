"""Upstream adapters: one per transport (stdio, Streamable HTTP, legacy SSE) behind `UpstreamLink`."""
