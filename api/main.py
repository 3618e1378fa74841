"""The application factory: ``create_app(settings, store=None)``; run it with uvicorn (``tuner serve``).

Routes live under ``/v1`` (OpenAPI UI at ``/docs`` and ``/redoc``, served from local files; schema at
``/openapi.json``); the exploration pages at ``/`` and ``/ui/…`` (:mod:`api.ui.pages`); ``GET /healthz``
answers without touching the store and ``GET /readyz`` checks it (503 while it is unreachable).
"""

from __future__ import annotations

import gc
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import APIRouter, FastAPI, Request
from starlette.concurrency import run_in_threadpool

import tuner
from tuner import db
from tuner.api import errors, openapi
from tuner.api.best_service import BestService
from tuner.api.catalog import Catalog
from tuner.api.deps import StoreProvider
from tuner.api.fast_best import CachedBest
from tuner.api.importance import Importances
from tuner.api.limits import BodyLimit
from tuner.api.reverify import Reverifier
from tuner.api.routes import best, history, jobs, studies, templates, workers
from tuner.api.settings import ApiSettings
from tuner.api.ui import assets, pages
from tuner.api.ui import errors as page_errors

log = logging.getLogger(__name__)

DESCRIPTION = """Kernel autotuning service: submit tuning jobs, follow them, and read the best verified config
per shape. Submitting and cancelling need a bearer token with the `submit` scope; reads are open unless the
server requires the `read` scope."""


def create_app(settings: ApiSettings | None = None, store: db.Store | None = None) -> FastAPI:
    """A new application. ``store``: use this store (tests, ``tuner serve``); None → open ``settings.db_url``
    on first use (the server starts even while the database is down, answering 503 where it is needed)."""
    settings = settings or ApiSettings()
    catalog = Catalog()
    stores = StoreProvider(settings.db_url, store)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if settings.warm_templates:
            # Before serving: imports hold the GIL for long stretches, which would stall the event loop of a
            # server already under load. Then what start-up allocated (modules, templates) is frozen out of
            # the garbage collector's full passes, which would otherwise walk it all, pausing requests.
            await run_in_threadpool(catalog.warm)
            gc.freeze()
        yield
        app.state.best.answers.close()
        if reverifier is not None:
            reverifier.close()
        if store is None:
            stores.close()

    app = FastAPI(
        title="tuner", version=tuner.__version__, description=DESCRIPTION, lifespan=lifespan,
        openapi_tags=[{"name": n} for n in ("jobs", "best", "templates", "history", "studies", "workers")],
        docs_url=None, redoc_url=None,  # served by api.ui.assets from local files
    )
    app.state.settings = settings
    app.state.catalog = catalog
    app.state.stores = stores
    reverifier = (Reverifier(stores, catalog, processes=settings.reverify_processes,
                              comparator_processes=settings.reverify_comparator_processes)
                  if settings.reverify_foreign else None)
    app.state.reverifier = reverifier
    app.state.best = BestService(catalog, stores, ttl_s=settings.best_cache_ttl_s,
                                 max_entries=settings.best_cache_size, on_foreign=reverifier)
    app.state.importances = Importances()
    errors.install(app)
    openapi.install(app, settings)
    page_errors.install(app)
    v1 = APIRouter(prefix="/v1")
    for module in (jobs, best, templates, history, studies, workers):
        v1.include_router(module.router)
    app.include_router(v1)
    app.include_router(pages.router)
    assets.install(app)
    app.add_api_route("/healthz", _healthz, methods=["GET"], include_in_schema=False)
    app.add_api_route("/readyz", _readyz, methods=["GET"], include_in_schema=False)
    app.add_middleware(BodyLimit, max_bytes=settings.max_body_bytes)
    app.add_middleware(CachedBest, service=app.state.best, settings=settings)  # outermost of ours: first to run
    return app


async def _healthz() -> dict[str, str]:
    return {"status": "ok"}


async def _readyz(request: Request) -> dict[str, str]:
    stores: StoreProvider = request.app.state.stores

    def check() -> str:
        store = stores.get()
        store.count_jobs(state="queued")
        return store.url

    url = await run_in_threadpool(check)  # StoreError → 503 by the handler
    return {"status": "ok", "store": url}
