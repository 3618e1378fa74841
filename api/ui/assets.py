"""Every file a page loads, served by this app from installed packages: the pages' own CSS and JS (package
data beside this module), plotly.js from the ``plotly`` package, and Swagger UI / ReDoc for ``/docs`` and
``/redoc`` from ``fastapi-offline``. No page, and no file served here, makes the browser contact another
host: tests/ui check every route's HTML and assets, and record the browser's requests.

Asset URLs carry a digest of the file (``?v=…``) so that browsers may cache them for a year.
"""

from __future__ import annotations

import hashlib
import importlib.util
from functools import cache
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html, get_swagger_ui_oauth2_redirect_html
from fastapi.responses import FileResponse, HTMLResponse, Response
from fastapi.staticfiles import StaticFiles

from tuner.errors import TunerError

STATIC = Path(__file__).parent / "static"
PREFIX = "/ui/static"
VENDOR = "/ui/vendor"
CACHE = {"Cache-Control": "public, max-age=31536000, immutable"}
# Content-Security-Policy of every HTML answer: the browser itself refuses to contact another host, whatever a
# vendored bundle holds (ReDoc's sidebar links an image on its makers' CDN: the browser never requests it).
# The pages run no inline script; Swagger UI and ReDoc start from one inline script, and ReDoc from a worker.
_CSP = ("default-src 'self'; script-src 'self'{extra}; style-src 'self' 'unsafe-inline'; img-src 'self' data: blob:; "
        "font-src 'self' data:; connect-src 'self'; worker-src 'self' blob:; frame-ancestors 'none'; "
        "base-uri 'self'; form-action 'self'")
PAGE_HEADERS = {"Content-Security-Policy": _CSP.format(extra=""), "X-Content-Type-Options": "nosniff"}
DOCS_HEADERS = {"Content-Security-Policy": _CSP.format(extra=" 'unsafe-inline'"), "X-Content-Type-Options": "nosniff"}


class MissingAssetError(TunerError):
    """A package that ships an asset of the pages is not installed."""


def _package_dir(name: str) -> Path:
    spec = importlib.util.find_spec(name)  # locates the package without importing it (plotly's import is slow)
    if spec is None or not spec.submodule_search_locations:
        raise MissingAssetError(f"the {name!r} package is not installed; install tuner's dependencies")
    return Path(next(iter(spec.submodule_search_locations)))


@cache
def vendor_files() -> dict[str, Path]:
    """Name under ``/ui/vendor`` → file of an installed package."""
    plotly = _package_dir("plotly") / "package_data" / "plotly.min.js"
    docs = _package_dir("fastapi_offline") / "static"
    files = {"plotly.min.js": plotly, **{p.name: p for p in docs.iterdir() if p.suffix in (".js", ".css", ".png")}}
    for name, path in files.items():
        if not path.is_file():
            raise MissingAssetError(f"{path} ({name}) is missing from its package")
    return files


@cache
def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:12]


def asset_url(name: str) -> str:
    """The URL of one of the pages' files (``ui.css``) or of a vendor file (``vendor/plotly.min.js``)."""
    if name.startswith("vendor/"):
        file = name.removeprefix("vendor/")
        return f"{VENDOR}/{file}?v={_digest(vendor_files()[file])}"
    return f"{PREFIX}/{name}?v={_digest(STATIC / name)}"


def install(app: FastAPI) -> None:
    """Serve the assets, and ``/docs`` and ``/redoc`` from local files (the app must be created with
    ``docs_url=None, redoc_url=None``)."""
    app.mount(PREFIX, _VersionedStatic(directory=STATIC), name="ui-static")
    app.add_api_route(VENDOR + "/{name}", _vendor, methods=["GET"], include_in_schema=False)
    title = app.title

    async def docs(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "")
        return _with_headers(get_swagger_ui_html(
            openapi_url=f"{root}{app.openapi_url}", title=f"{title} - Swagger UI",
            oauth2_redirect_url=f"{root}/docs/oauth2-redirect",
            swagger_js_url=root + asset_url("vendor/swagger-ui-bundle.js"),
            swagger_css_url=root + asset_url("vendor/swagger-ui.css"),
            swagger_favicon_url=root + asset_url("vendor/favicon.png"),
            # validatorUrl: Swagger UI would otherwise send the schema to its public validator service.
            swagger_ui_parameters={"validatorUrl": None, "persistAuthorization": False},
        ))

    async def oauth2_redirect() -> HTMLResponse:
        return get_swagger_ui_oauth2_redirect_html()

    async def redoc(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "")
        return _with_headers(get_redoc_html(
            openapi_url=f"{root}{app.openapi_url}", title=f"{title} - ReDoc",
            redoc_js_url=root + asset_url("vendor/redoc.standalone.js"),
            redoc_favicon_url=root + asset_url("vendor/favicon.png"), with_google_fonts=False,
        ))

    app.add_api_route("/docs", docs, methods=["GET"], include_in_schema=False)
    app.add_api_route("/docs/oauth2-redirect", oauth2_redirect, methods=["GET"], include_in_schema=False)
    app.add_api_route("/redoc", redoc, methods=["GET"], include_in_schema=False)


class _VersionedStatic(StaticFiles):
    """The pages' own files; a URL naming the file's digest (``?v=``, as :func:`asset_url` writes it) may be
    kept for a year: another content has another URL."""

    def file_response(self, full_path: Any, stat_result: Any, scope: Any, status_code: int = 200) -> Response:
        response = super().file_response(full_path, stat_result, scope, status_code)
        if b"v=" in scope.get("query_string", b""):
            response.headers.update(CACHE)
        return response


def _with_headers(response: HTMLResponse) -> HTMLResponse:
    response.headers.update(DOCS_HEADERS)
    return response


async def _vendor(name: str) -> Response:
    path = vendor_files().get(name)
    if path is None:
        return Response(status_code=404)
    return FileResponse(path, headers=CACHE)
