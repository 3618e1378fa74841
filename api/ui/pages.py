"""The exploration pages, served by the API's own app: ``/`` (overview), ``/ui/templates/{name}``,
``/ui/studies/{id}``, ``/ui/jobs/{id}``, ``/ui/compare``; rendered on the server (Jinja2), plots drawn in the
browser by plotly.js, which is served from the installed ``plotly`` package like every other asset
(:mod:`api.ui.assets`): a page loads nothing from another host.

Reads follow the API's rule: open unless ``TUNER_READ_REQUIRES_TOKEN``; then a page needs the ``read`` token,
given once on ``/ui/login`` and kept in a session cookie (HttpOnly, gone when the browser closes).
Unknown ids render a 404 page, malformed query values (an id beyond 64 bits too) a 422 page naming the field
(except a shape the template page's lookup form sent that the template rejects: that page itself, 422, the
message in the form); nothing renders a traceback (the store being down renders a 503 page).
"""

from __future__ import annotations

import json
import math
import re
from datetime import datetime, timezone
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import parse_qs

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.templating import Jinja2Templates
from markupsafe import Markup, escape
from pydantic import Field

from tuner import db
from tuner.api.best_service import BestService
from tuner.api.catalog import Catalog
from tuner.api.deps import READ_COOKIE, Reader, get_catalog, get_settings, get_store
from tuner.api.errors import FieldError
from tuner.api.routes.jobs import JobId
from tuner.api.routes.studies import StudyId
from tuner.api.schemas import MAX_ID, DeviceKind
from tuner.api.ui import views
from tuner.api.ui.assets import PAGE_HEADERS, asset_url
from tuner.api.ui.plots import param_value
from tuner.results import reason_line

TEMPLATES = Jinja2Templates(directory=str(Path(__file__).parent / "templates"))
ASK_PREFIX = "shape."  # the template page's lookup form: one query parameter per dim
router = APIRouter(include_in_schema=False)


def _us(value: float | None) -> str:
    if value is None or math.isnan(value):
        return "–"
    return f"{value:.2f}" if value < 100 else f"{value:,.1f}"


def _ratio(other: float | None, best: float | None) -> Markup:
    if not other or not best:
        return Markup("–")
    r = other / best
    if round(r, 2) == 1.0:
        return Markup('<span class="even">{:.2f}×</span>').format(r)
    cls = "good" if r > 1 else "bad"
    return Markup('<span class="{}">{:.2f}×&nbsp;{}</span>').format(cls, r, "🟢" if r > 1 else "🔴")


def _against(this: float | None, first: float | None, first_id: int) -> Markup:
    """A study's best against the first study's, on the compare page: the ratio, coloured and said for this
    study (slower 🔴, faster 🟢), where :func:`_ratio` colours for the best in its denominator."""
    if not this or not first:
        return Markup("–")
    r = this / first
    if round(r, 2) == 1.0:
        return Markup('<span class="even">{:.2f}×</span>').format(r)
    if r > 1:
        return Markup('<span class="bad">{:.2f}×&nbsp;🔴 slower than #{}</span>').format(r, first_id)
    return Markup('<span class="good">{:.2f}×&nbsp;🟢 faster than #{}</span>').format(r, first_id)


def _ago(value: datetime | float | None) -> str:
    if value is None:
        return "–"
    seconds = value if isinstance(value, float) else (datetime.now(timezone.utc) - value).total_seconds()
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f} {unit} ago"
    return f"{max(seconds, 0):.0f} s ago"


def _doc(text: str | None) -> Markup:
    """A template's docstring as HTML: escaped, its reStructuredText ``literals`` as <code>."""
    escaped = str(escape(text or ""))
    return Markup(re.sub(r"``(.+?)``", r"<code>\1</code>", escaped))


def _json(value: Any) -> Markup:
    """JSON for a ``<script type="application/json">`` block: '<' escaped so that no text ends the block."""
    return Markup(json.dumps(value, separators=(",", ":"), allow_nan=False, default=str).replace("<", "\\u003c"))


TEMPLATES.env.filters.update(us=_us, ratio=_ratio, ago=_ago, tojson_script=_json, reason=reason_line, doc=_doc,
                             against=_against, param=param_value)
TEMPLATES.env.globals.update(asset=asset_url)


PageReader = Reader  # a bearer header (scripts) or the session cookie of /ui/login (browsers)
StoreDep = Annotated[db.Store, Depends(get_store)]
CatalogDep = Annotated[Catalog, Depends(get_catalog)]


def render(request: Request, name: str, context: dict[str, Any], status: int = 200) -> HTMLResponse:
    return TEMPLATES.TemplateResponse(request, name, context, status_code=status, headers=PAGE_HEADERS)


@router.get("/", response_class=HTMLResponse)
def overview(request: Request, _: PageReader, store: StoreDep, catalog: CatalogDep) -> HTMLResponse:
    return render(request, "overview.html", views.overview(store, catalog))


@router.get("/ui", response_class=HTMLResponse)
def ui_root() -> Response:
    return RedirectResponse("/", status_code=307)


@router.get("/ui/templates/{name}", response_class=HTMLResponse)
def template(
    request: Request, name: str, _: PageReader, store: StoreDep, catalog: CatalogDep,
    device: Annotated[str | None, Query(max_length=256, description="Device name (default: the first).")] = None,
    kind: Annotated[DeviceKind | None, Query(description="The lookup form's device kind.")] = None,
) -> HTMLResponse:
    """The template page; ``shape.<dim>=value`` parameters (the page's lookup form) ask ``GET /v1/best``'s
    lookup for that shape on the page's device, and the page shows its answer; a shape the template rejects
    is shown in the form, with the whole page, as a 422. Parameters the form never sends (a dim twice, an
    overlong value, a device kind that does not exist) get the 422 error page, as any malformed query does."""
    best: BestService = request.app.state.best
    ask = _asked_dims(request.query_params.multi_items())
    context = views.template_page(store, catalog, best, name, device, ask, kind)
    return render(request, "template.html", context, 422 if context["ask"].error else 200)


def _asked_dims(params: list[tuple[str, str]]) -> dict[str, str] | None:
    """The dims the lookup form sent (``shape.B=1`` → ``{"B": "1"}``), None when it sent none; FieldError for
    a dim given twice or an overlong value."""
    found: dict[str, str] = {}
    for key, value in params:
        if not key.startswith(ASK_PREFIX):
            continue
        dim = key[len(ASK_PREFIX):]
        if dim in found:
            raise FieldError(f"shape dim {dim} is given twice", ("query", key))
        if len(value) > 64 or len(found) >= 32:
            raise FieldError("at most 32 dims of at most 64 characters each", ("query", key))
        found[dim] = value
    return found if found else None


@router.get("/ui/studies/{study_id}", response_class=HTMLResponse)
def study(request: Request, study_id: StudyId, _: PageReader, store: StoreDep, catalog: CatalogDep) -> HTMLResponse:
    return render(request, "study.html", views.study_page(store, catalog, study_id))


@router.get("/ui/jobs/{job_id}", response_class=HTMLResponse)
def job(request: Request, job_id: JobId, _: PageReader, store: StoreDep, catalog: CatalogDep) -> HTMLResponse:
    return render(request, "job.html", views.job_page(store, catalog, job_id))


@router.get("/ui/compare", response_class=HTMLResponse)
def compare(
    request: Request, _: PageReader, store: StoreDep, catalog: CatalogDep,
    study: Annotated[list[Annotated[str, Field(max_length=20)]] | None,
                     Query(max_length=4, description="Study ids (two to four); empty ones are left out.")] = None,
) -> HTMLResponse:
    return render(request, "compare.html", views.compare_page(store, catalog, _study_ids(study or [])))


def _study_ids(values: list[str]) -> list[int]:
    """The study ids of the compare form: its selects send an empty value for "none chosen", left out here;
    anything else must be an id (422 on the field otherwise)."""
    ids = []
    for i, value in enumerate(values):
        text = value.strip()
        if not text:
            continue
        if not (text.isascii() and text.isdigit()):
            raise FieldError("Input should be a valid integer", ("query", "study", i))
        if not 1 <= int(text) <= MAX_ID:
            raise FieldError(f"Input should be a study id from 1 to {MAX_ID}", ("query", "study", i))
        ids.append(int(text))
    return ids


@router.get("/ui/login", response_class=HTMLResponse)
def login_form(request: Request, next: Annotated[str, Query(max_length=512)] = "/") -> HTMLResponse:
    return render(request, "login.html", {"next": _local(next), "error": None})


@router.post("/ui/login", response_class=HTMLResponse)
async def login(request: Request) -> Response:
    # The form is parsed here (URL-encoded, two fields) rather than by FastAPI's Form, which needs another package.
    try:
        fields = parse_qs((await request.body()).decode("utf-8", "replace"), max_num_fields=4)
    except ValueError:  # more fields than a login form has
        return render(request, "login.html", {"next": "/", "error": "a login form has a token and a next page"}, 400)
    token, next = (fields.get("token") or [""])[0][:512], (fields.get("next") or ["/"])[0][:512]
    settings = get_settings(request)
    scopes = settings.scopes_of(token)
    if scopes is None or "read" not in scopes:
        return render(request, "login.html", {"next": _local(next), "error": "unknown token, or no 'read' scope"}, 401)
    response = RedirectResponse(_local(next), status_code=303)
    # no max-age: a session cookie; Secure over HTTPS (uvicorn takes the scheme from a trusted proxy's
    # X-Forwarded-Proto), so that the token it holds never travels in clear text once it went out encrypted
    response.set_cookie(READ_COOKIE, token, httponly=True, samesite="strict", path="/",
                        secure=request.url.scheme == "https")
    return response


def _local(path: str) -> str:
    """Only a path of this server: a login never redirects to another host."""
    return path if path.startswith("/") and not path.startswith("//") and "\\" not in path else "/"
