"""``GET /v1/best``: the best verified config for a shape, with the fallback chain exact → nearest → default.

The answer is :func:`tuner.lookup.choose` over the store's published best configs of the template (current
template version, and those of the versions it carries where it has none yet:
:func:`tuner.store.entries.served_entries`; ``measured_version`` says which) and device kind, checked against
the template's constraints for the requested shape (an invalid one repaired within the search space's domains,
``repaired`` listing the changes), with the search space's default as the last resort — the same function the
runtime client runs over an export file.
The requester's fingerprint (``device_name``, ``software``, ``template_version``; each optional) decides which
entries are preferred and whether the answer is ``exact``: see :mod:`tuner.lookup`. An answer served from an
entry of another device name or software (:attr:`tuner.lookup.Answer.foreign`) is reported to ``on_foreign``
(``tuner serve`` queues a re-verification there).

Two in-process caches keep the endpoint off the database under load (``ttl_s=0`` disables both):
  * answers, as the response body bytes, keyed by the raw query string: every parameter that changes the
    answer (template, shape or dims, device, device name, fingerprint) is in it, and a hit costs one dict
    lookup (served before routing, see :mod:`tuner.api.fast_best`). Differently ordered queries are different keys
    with the same answer: harmless duplicates. An answer is fresh for ``ttl_s``; for another ``ttl_s`` it is
    still served while one background thread refreshes it (stale-while-revalidate: requests never wait for
    the database once an answer is cached, and expiries never make a burst of misses). A refresh recomputes
    the answer only if the entries it came from changed (their signature), else it just renews it, so the
    refresher holds the GIL for microseconds, not milliseconds, and the event loop is not kept waiting.
    An answer reflects the store as it was at most ``3 × ttl_s`` ago (entries up to ``ttl_s`` old, answers
    served up to ``2 × ttl_s``) while the store answers. While it is unreachable (StoreError), the last
    answer is served on, marked ``"stale": true`` in the body and ``x-stale: true`` in the headers, and
    its refresh is tried again every ``ttl_s``; the first refresh that succeeds serves fresh answers again.
    A request whose answer is not cached then gets the route's 503.
  * the best-config entries of one (template, device kind), for ``ttl_s``: a new shape of a known template,
    and every refresh but the first of a round, costs no query.
The caches are bounded (``max_entries``; full → expired entries dropped, then everything). Errors are not
cached. Misses run in a worker thread (they may query the database).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from tuner.api.catalog import Catalog, CatalogEntry
from tuner.api.deps import StoreProvider
from tuner.api.errors import FieldError
from tuner.api.schemas import BestOut
from tuner.distance import DEFAULT_DISTANCE, ShapeDistance
from tuner.errors import ShapeError, StoreError, UnknownTemplateError
from tuner.frozen import Shape
from tuner.lookup import Answer, Entry, Requester, answer_fields, fit_distance
from tuner.store.entries import lookup_answer, served_entries

log = logging.getLogger(__name__)


class TTLCache:
    """A bounded dict of values that expire ``ttl_s`` after being stored. Reads are lock-free."""

    def __init__(self, ttl_s: float, max_entries: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl_s, self.max_entries, self.clock = ttl_s, max_entries, clock
        self._data: dict[Any, tuple[float, Any]] = {}
        self._lock = threading.Lock()

    def get(self, key: Any) -> Any | None:
        hit = self._data.get(key)
        if hit is None or hit[0] < self.clock():
            return None
        return hit[1]

    def put(self, key: Any, value: Any) -> None:
        if self.ttl_s <= 0:
            return
        now = self.clock()
        with self._lock:
            if len(self._data) >= self.max_entries:
                self._data = {k: v for k, v in self._data.items() if v[0] >= now}
                if len(self._data) >= self.max_entries:
                    self._data = {}
            self._data[key] = (now + self.ttl_s, value)


@dataclass(frozen=True)
class BestRequest:
    """Everything a best-config answer depends on (besides the store's content)."""

    template: str
    raw_shape: Mapping[str, object]
    device_kind: str
    device_name: str | None = None
    fingerprint: str | None = None
    software: Mapping[str, str] = field(default_factory=dict)
    template_version: str | None = None


@dataclass(frozen=True)
class EntrySet:
    """The best configs served of one template on one device kind (its current version's, and carried
    versions' where it has none: :func:`tuner.store.entries.served_entries`), and a signature that changes
    whenever one of them is published or replaced (so unchanged answers need not be recomputed)."""

    entries: tuple[Entry, ...]
    signature: tuple[tuple[int | None, str | None, str | None], ...]  # measurement, published, verified
    distance: ShapeDistance = DEFAULT_DISTANCE  # the lookup's distance fitted to ``entries`` (once per set)


@dataclass(frozen=True)
class CachedAnswer:
    body: bytes
    fresh_until: float
    stale_until: float
    request: BestRequest  # what produced it, to recompute it
    basis: object  # the signature of the entries it was computed from (None: recompute at the next refresh)
    stale: bool = False  # served from the cache while the store is unreachable


def mark_stale(body: bytes) -> bytes:
    """A rendered answer with ``"stale": true``."""
    data = json.loads(body)
    data["stale"] = True
    return json.dumps(data, separators=(",", ":")).encode()


class AnswerCache:
    """Response bodies with stale-while-revalidate; ``get`` is lock-free and never blocks."""

    def __init__(self, service: BestService, ttl_s: float, max_entries: int, clock: Callable[[], float]) -> None:
        self.service, self.ttl_s, self.max_entries, self.clock = service, ttl_s, max_entries, clock
        self._data: dict[bytes, CachedAnswer] = {}
        self._refreshing: set[bytes] = set()
        self._lock = threading.Lock()
        self._refresher = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tuner-best-refresh")

    def get(self, key: bytes) -> CachedAnswer | None:
        hit = self._data.get(key)
        if hit is None:
            return None
        now = self.clock()
        if now < hit.fresh_until:
            return hit
        if now >= hit.stale_until:
            return None
        with self._lock:
            if key in self._refreshing:
                return hit
            self._refreshing.add(key)
        self._refresher.submit(self._refresh, key, hit)
        return hit

    def fallback(self, key: bytes) -> CachedAnswer | None:
        """The last answer of ``key`` however old, marked stale: for a request the store cannot answer now."""
        hit = self._data.get(key)
        if hit is None:
            return None
        if not hit.stale:
            hit = self._stale(hit)
            with self._lock:
                self._data[key] = hit
        return hit

    def _stale(self, hit: CachedAnswer) -> CachedAnswer:
        now = self.clock()
        return CachedAnswer(mark_stale(hit.body), now + self.ttl_s, now + 2 * self.ttl_s, hit.request, None, True)

    def put(self, key: bytes, body: bytes, request: BestRequest, basis: object) -> None:
        if self.ttl_s <= 0:
            return
        now = self.clock()
        with self._lock:
            if len(self._data) >= self.max_entries:
                self._data = {k: v for k, v in self._data.items() if v.stale_until >= now}
                if len(self._data) >= self.max_entries:
                    self._data = {}
            self._data[key] = CachedAnswer(body, now + self.ttl_s, now + 2 * self.ttl_s, request, basis)

    def _refresh(self, key: bytes, hit: CachedAnswer) -> None:
        try:
            basis = self.service.signature(hit.request)
            if basis == hit.basis:
                self.put(key, hit.body, hit.request, basis)  # nothing published since: renew as it is
            else:
                self.put(key, *self.service.render(hit.request))
        except StoreError as exc:  # unreachable: serve the last answer on, marked stale, and retry later
            log.info("refreshing a cached best answer failed (%s); served stale", exc)
            now = self.clock()
            again = dataclasses.replace(hit, fresh_until=now + self.ttl_s, stale_until=now + 2 * self.ttl_s)
            with self._lock:
                self._data[key] = again if hit.stale else self._stale(hit)
        except Exception as exc:  # the template changed…: let the route answer next time
            log.info("refreshing a cached best answer failed (%s); dropped", type(exc).__name__)
            with self._lock:
                self._data.pop(key, None)
        finally:
            with self._lock:
                self._refreshing.discard(key)

    def close(self) -> None:
        self._refresher.shutdown(wait=False, cancel_futures=True)


class BestService:
    """Computes and caches best-config answers. Thread-safe."""

    def __init__(self, catalog: Catalog, stores: StoreProvider, *, ttl_s: float, max_entries: int,
                 clock: Callable[[], float] = time.monotonic,
                 on_foreign: Callable[[BestRequest, Answer], None] | None = None) -> None:
        """``on_foreign(request, answer)``: called (from a worker thread, never raising into the request)
        whenever an answer is computed from an entry of another device name or software."""
        self.catalog, self.stores, self.on_foreign = catalog, stores, on_foreign
        self.answers = AnswerCache(self, ttl_s, max_entries, clock)
        self._entries = TTLCache(ttl_s, max_entries, clock)

    def render(self, request: BestRequest) -> tuple[bytes, BestRequest, object]:
        """The response body, with what :meth:`AnswerCache.put` keeps beside it."""
        out, entry_set = self._compute(request)
        return out.model_dump_json().encode(), request, entry_set.signature

    def answer(self, request: BestRequest, *, report_foreign: bool = True) -> BestOut:
        """The answer for one request. Raises FieldError (404 unknown template, 422 bad shape), StoreError.
        ``report_foreign=False``: a foreign answer is not reported to ``on_foreign`` (a page showing what a
        device would be served asks nothing of the workers)."""
        return self._compute(request, report_foreign)[0]

    def signature(self, request: BestRequest) -> object:
        """The signature of the entries the answer to ``request`` depends on now (may query the store)."""
        return self.entry_set(self._template(request), request.device_kind).signature

    def _template(self, request: BestRequest) -> CatalogEntry:
        try:
            return self.catalog.get(request.template)
        except UnknownTemplateError as exc:
            raise FieldError.wrap(exc, ("query", "template")) from None

    def _compute(self, request: BestRequest, report_foreign: bool = True) -> tuple[BestOut, EntrySet]:
        entry = self._template(request)
        try:
            shape = entry.spec.make_shape(request.raw_shape)
        except ShapeError as exc:
            raise FieldError.wrap(exc, ("query", "shape")) from None
        entry_set = self.entry_set(entry, request.device_kind)
        entries = entry_set.entries
        if request.fingerprint is not None:
            entries = tuple(e for e in entries if e.fingerprint_hash == request.fingerprint)
        requester = Requester(request.device_name, dict(request.software), request.template_version,
                              entry.spec.backend)
        answer = lookup_answer(entries, shape=shape, space=entry.space, version=entry.spec.version,
                               requester=requester, distance=entry_set.distance)
        if answer.foreign and report_foreign and self.on_foreign is not None:
            try:
                self.on_foreign(request, answer)
            except Exception as exc:  # queueing a re-verification must never fail a lookup
                log.warning("re-verification request failed: %s", exc)
        return _out(entry, shape, request.device_kind, answer), entry_set

    def entry_set(self, entry: CatalogEntry, device_kind: str) -> EntrySet:
        """The best configs served of the template on a device kind (cached): its current version's, then the
        carried versions' where it has none (:func:`tuner.store.entries.served_entries`)."""
        key = (entry.name, device_kind)
        cached = self._entries.get(key)
        if cached is not None:
            return cached
        found = tuple(e for _, e in served_entries(self.stores.get(), template=entry.name, device_kind=device_kind,
                                                   version=entry.spec.version, carries=entry.spec.carries,
                                                   admits=entry.space.in_domain))
        signature = tuple((e.measurement_id, e.published_at, (e.verification or {}).get("verified_at"))
                          for e in found)
        entry_set = EntrySet(found, signature, fit_distance(DEFAULT_DISTANCE, found))
        self._entries.put(key, entry_set)
        return entry_set


def _out(entry: CatalogEntry, shape: Shape, device_kind: str, answer: Answer) -> BestOut:
    return BestOut.model_validate(answer_fields(answer, template=entry.name, version=entry.spec.version,
                                                shape=shape.to_dict(), shape_key=shape.key(), device_kind=device_kind))
