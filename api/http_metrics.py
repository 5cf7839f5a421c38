"""Counts and times every HTTP request by method, route template and status, as a plain ASGI
middleware (see ``api.guard`` for why not Starlette's ``@app.middleware``).

The route is the matched route's template (``/admin/v2/persistent/{tenant}/{namespace}/{topic}``),
never the path: one series per route, however many topics there are. Starlette's router leaves
the matched route in ``scope["route"]``; a request no route matched counts as ``unmatched``.
"""

from __future__ import annotations

import time

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.metrics import ServiceMetrics

UNMATCHED = "unmatched"


class HttpMetrics:
    def __init__(self, app: ASGIApp, *, metrics: ServiceMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 500  # what the client sees if the app raises before answering

        async def send_and_note(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_and_note)
        finally:
            route = scope.get("route")
            template = getattr(route, "path", None) or UNMATCHED
            self.metrics.observe_request(scope["method"], template, status, time.perf_counter() - start)
