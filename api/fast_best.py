"""The hot path of ``GET /v1/best`` as plain ASGI middleware: a cached answer is sent before routing.

FastAPI's routing and dependency solving cost about half a millisecond of CPU per request on a small machine,
ten times the rest of a cached answer; at the target load (500 requests/s, p99 ≤ 5 ms) that is most of a
core. So a request for ``/v1/best`` whose answer is in :class:`tuner.api.best_service.BestService`'s cache (keyed
by the raw query string) is answered here. Everything else — misses, errors, and any request whose read
access is not plainly granted (``TUNER_READ_REQUIRES_TOKEN`` on and no token with the ``read`` scope) — goes
on to the FastAPI route, which validates, checks auth, computes, documents and fills the cache; so the answers
and the errors are the route's own.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send

from tuner.api.best_service import BestService
from tuner.api.settings import ApiSettings

PATH = "/v1/best"
_HEADERS = [(b"content-type", b"application/json"), (b"x-cache", b"hit")]
_STALE = [*_HEADERS, (b"x-stale", b"true")]


class CachedBest:
    def __init__(self, app: ASGIApp, service: BestService, settings: ApiSettings) -> None:
        self.app, self.service, self.settings = app, service, settings

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] == PATH and scope["method"] == "GET" and self._may_read(scope):
            hit = self.service.answers.get(scope["query_string"])
            if hit is not None:
                await send({"type": "http.response.start", "status": 200,
                            "headers": [*(_STALE if hit.stale else _HEADERS),
                                        (b"content-length", str(len(hit.body)).encode())]})
                await send({"type": "http.response.body", "body": hit.body})
                return
        await self.app(scope, receive, send)

    def _may_read(self, scope: Scope) -> bool:
        """Whether the route would answer this caller: a bearer token it knows with the read scope, or none
        when reads are open. A token is checked even then (the route refuses an unknown one); anything
        else (another scheme, the session cookie) goes to the route."""
        for name, value in scope["headers"]:
            if name == b"authorization":
                scheme, _, token = value.decode("latin-1").partition(" ")
                if scheme.lower() != "bearer":
                    return False
                scopes = self.settings.scopes_of(token.strip())
                return scopes is not None and "read" in scopes
        return not self.settings.read_requires_token
