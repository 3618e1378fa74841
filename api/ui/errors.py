"""Errors on pages render as pages: 404 (unknown id, template or path), 422 (malformed query value, naming the
field; any other refused input), 409, 401 (sends the browser to ``/ui/login``), 503 (store unreachable): a
domain error gets the status the API gives it (:func:`api.errors.status_of`). Requests for anything but a page
keep the JSON answers of :mod:`api.errors` and FastAPI: each handler here wraps the one it replaces.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from urllib.parse import quote

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import RedirectResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from tuner.api.errors import DOMAIN_ERRORS, FieldError, status_of
from tuner.api.ui.assets import PREFIX, VENDOR
from tuner.errors import StoreError, TunerError

log = logging.getLogger(__name__)
Handler = Callable[[Request, Exception], Awaitable[Response] | Response]


def is_page(request: Request) -> bool:
    path = request.url.path
    return (path == "/" or path.startswith("/ui/") or path == "/ui") and not path.startswith((PREFIX, VENDOR))


def _page(request: Request, status: int, title: str, messages: list[str]) -> Response:
    from tuner.api.ui.pages import render  # the pages import this module's siblings; render is only needed here

    return render(request, "error.html", {"status": status, "title": title, "messages": messages}, status)


def _validation_messages(exc: RequestValidationError) -> list[str]:
    out = []
    for error in exc.errors():
        loc = ".".join(str(part) for part in error.get("loc", ()) if part not in ("query", "path", "body"))
        out.append(f"{loc}: {error.get('msg', 'invalid value')}")
    return out


def _for_page(request: Request, exc: Exception) -> Response | None:
    """The page for an error, or None when the error is not one a page shows this way."""
    if isinstance(exc, RequestValidationError):
        return _page(request, 422, "Malformed request", _validation_messages(exc))
    if isinstance(exc, FieldError) and exc.status == 401:
        return RedirectResponse(f"/ui/login?next={quote(request.url.path)}", status_code=303)
    if isinstance(exc, FieldError):
        loc = ".".join(str(p) for p in exc.loc[1:])
        titles = {403: "Forbidden", 404: "Not found"}
        return _page(request, exc.status, titles.get(exc.status, "Malformed request"), [f"{loc}: {exc}"])
    if isinstance(exc, StoreError):
        log.warning("%s: %s", request.url.path, exc)
        page = _page(request, 503, "Store unavailable", [str(exc), "Retry in a few seconds."])
        page.headers["Retry-After"] = "5"  # as the API's 503 says
        return page
    if isinstance(exc, StarletteHTTPException):
        title = "Not found" if exc.status_code == 404 else "Error"
        return _page(request, exc.status_code, title, [f"nothing at {request.url.path}"]
                     if exc.status_code == 404 else [str(exc.detail)])
    if isinstance(exc, TunerError):
        status = status_of(exc)
        if status == 500:
            log.error("%s: %s: %s", request.url.path, type(exc).__name__, exc)
            return _page(request, 500, "Error", [f"{type(exc).__name__}: {exc}"])
        titles = {404: "Not found", 409: "Conflict"}
        return _page(request, status, titles.get(status, "Malformed request"), [str(exc)])
    return None


def install(app: FastAPI) -> None:
    """Wrap the app's handlers (install after :func:`api.errors.install`): each class it registers, since
    Starlette answers with the handler of the nearest class in an exception's MRO (an unwrapped
    UserInputError handler would answer a page with the API's JSON)."""
    for cls in (RequestValidationError, FieldError, StoreError, StarletteHTTPException, *DOMAIN_ERRORS):
        previous = app.exception_handlers.get(cls) or _nearest(app, cls)
        app.add_exception_handler(cls, _wrap(previous))


def _nearest(app: FastAPI, cls: type) -> Handler | None:
    for base in cls.__mro__[1:]:
        if base in app.exception_handlers:
            return app.exception_handlers[base]
    return None


def _wrap(previous: Handler | None) -> Handler:
    async def handler(request: Request, exc: Exception) -> Response:
        if is_page(request):
            page = _for_page(request, exc)
            if page is not None:
                return page
        if previous is None:
            raise exc
        result = previous(request, exc)
        return await result if isinstance(result, Awaitable) else result

    return handler
