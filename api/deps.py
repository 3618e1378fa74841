"""Dependencies of the routes: the store, the template catalog, the best-config service, and auth.

Auth: ``Authorization: Bearer <token>``, checked against ``TUNER_TOKENS`` (see :mod:`tuner.api.settings`).
No token (or not a bearer one) → 401 with ``WWW-Authenticate: Bearer``; an unknown token → 401 with
``error="invalid_token"``; a known token without the scope → 403. Reads need no token unless
``TUNER_READ_REQUIRES_TOKEN`` is on. Tokens never appear in responses or logs: callers are named by
:func:`tuner.api.settings.token_label`.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from tuner import db
from tuner.api.catalog import Catalog
from tuner.api.errors import FieldError
from tuner.api.settings import ApiSettings, Scope, token_label
from tuner.errors import StoreError


class StoreProvider:
    """The app's store, opened on first use (and again on later requests while opening fails), so that the
    server starts and answers (503 where the store is needed) while the database is down. Thread-safe."""

    def __init__(self, url: str | None, store: db.Store | None = None) -> None:
        self._url, self._store = url, store
        self._lock = threading.Lock()

    def get(self) -> db.Store:
        """The store; StoreError when it cannot be opened now. Blocks: call from a worker thread."""
        store = self._store
        if store is not None:
            return store
        with self._lock:
            if self._store is None:
                self._store = db.Store.open(self._url)
            return self._store

    def close(self) -> None:
        with self._lock:
            if self._store is not None:
                self._store.close()


def get_settings(request: Request) -> ApiSettings:
    settings: ApiSettings = request.app.state.settings
    return settings


def get_catalog(request: Request) -> Catalog:
    catalog: Catalog = request.app.state.catalog
    return catalog


def get_store(request: Request) -> db.Store:
    """A sync dependency (FastAPI runs it in a worker thread): opening may wait for the database."""
    provider: StoreProvider = request.app.state.stores
    try:
        return provider.get()
    except StoreError:
        raise
    except Exception as exc:  # e.g. an unexpected driver error while connecting: still "store unavailable"
        raise StoreError(f"cannot open store: {type(exc).__name__}") from exc


@dataclass(frozen=True)
class Principal:
    """Who is calling: a token's label and scopes, or anonymous (label None, no scope)."""

    label: str | None
    scopes: frozenset[Scope]


ANONYMOUS = Principal(None, frozenset())
_bearer = HTTPBearer(auto_error=False, description="A token from TUNER_TOKENS.")


def _unauthorized(message: str, error: str | None = None) -> FieldError:
    challenge = f'Bearer error="{error}"' if error else "Bearer"
    return FieldError(message, ("header", "Authorization"), status=401, kind="not_authenticated",
                      headers={"WWW-Authenticate": challenge})


def authenticate(settings: ApiSettings, credentials: HTTPAuthorizationCredentials | None, scope: Scope,
                 required: bool) -> Principal:
    """The caller, checked for ``scope`` when ``required``; FieldError 401/403 otherwise."""
    if credentials is None:
        if required:
            raise _unauthorized(f"this endpoint needs a bearer token with the '{scope}' scope (header "
                                "'Authorization: Bearer <token>', a token of the server's TUNER_TOKENS; a server "
                                "without TUNER_TOKENS wrote one to $TUNER_HOME/token on its host)")
        return ANONYMOUS
    scopes = settings.scopes_of(credentials.credentials)
    if scopes is None:
        raise _unauthorized("unknown token: not one of the server's TUNER_TOKENS (a server without TUNER_TOKENS "
                            "takes only the token it wrote to $TUNER_HOME/token on its host)", "invalid_token")
    principal = Principal(token_label(credentials.credentials), scopes)
    if required and scope not in scopes:
        raise FieldError(f"this token lacks the '{scope}' scope", ("header", "Authorization"), status=403,
                         kind="forbidden")
    return principal


# async: pure CPU work, so FastAPI calls it on the event loop instead of hopping to a worker thread.
async def submitter(
    request: Request, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]
) -> Principal:
    return authenticate(get_settings(request), credentials, "submit", required=True)


# The session cookie `/ui/login` sets: a browser's pages and the page scripts' own /v1 reads carry it
# (SameSite=Strict, HttpOnly); it grants reads only, never a submission.
READ_COOKIE = "tuner_read_token"


async def reader(
    request: Request, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]
) -> Principal:
    """The caller of a read: a bearer header, else the session cookie of ``/ui/login``."""
    settings = get_settings(request)
    if credentials is None and (token := request.cookies.get(READ_COOKIE)):
        credentials = HTTPAuthorizationCredentials(scheme="Bearer", credentials=token)
    return authenticate(settings, credentials, "read", required=settings.read_requires_token)


StoreDep = Annotated[db.Store, Depends(get_store)]
CatalogDep = Annotated[Catalog, Depends(get_catalog)]
Submitter = Annotated[Principal, Depends(submitter)]
Reader = Annotated[Principal, Depends(reader)]
