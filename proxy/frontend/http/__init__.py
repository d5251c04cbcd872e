"""The Streamable HTTP frontend: one endpoint serving both protocol eras (pure ASGI, on uvicorn).

`app` (the endpoint: routing, the request checks in order, POST/GET/DELETE), `listen` (a 2025
session's listen stream), `checks` (pure header and body checks), `identity` (authentication,
session ownership, OAuth metadata), `outbox` (the bounded stream a response is written from,
disconnect watching), `resume` (2025 resumable streams), `respond` (whole answers and errors).
"""
