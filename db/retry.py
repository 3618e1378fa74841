"""Waiting out store outages: which errors are the store's, and retries with capped exponential backoff.

A worker must survive the database going away (an outage, a partition, a restart): every store call it makes
is either retried here until the store answers again, or abandoned in a way the queue repairs (a task left,
a lease that lapses). :class:`StoreHealth` logs an outage once, when it begins, and once when it ends.
Retries use tenacity (exponential backoff with jitter, capped), and stop early when asked to (the worker is
stopping). It lives with the SQL store because it names SQLAlchemy's error root (Optuna's RDB storage, which
shares the database, sometimes raises it untranslated): no SQLAlchemy type outside db/.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TypeVar

import optuna
import sqlalchemy.exc
from tenacity import RetryCallState, Retrying, retry_if_exception_type, wait_exponential_jitter

from tuner.errors import StoreError

log = logging.getLogger(__name__)
T = TypeVar("T")

# The store's failures as the worker meets them: ours (translated by tuner.db), and Optuna's storage, which
# shares the database (it wraps SQLAlchemy's errors in StorageInternalError, not always).
STORAGE_ERRORS: tuple[type[BaseException], ...] = (
    StoreError, optuna.exceptions.StorageInternalError, sqlalchemy.exc.SQLAlchemyError,
)
BACKOFF_INITIAL_S = 0.2
BACKOFF_MAX_S = 5.0


class StoreHealth:
    """Whether the store answered the last call; logs each outage once. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._down_since: float | None = None
        self.back_at = time.monotonic()  # when the store last came back (or this object was made)
        self.outages = 0

    @property
    def down(self) -> bool:
        return self._down_since is not None

    def failed(self, exc: BaseException) -> None:
        with self._lock:
            if self._down_since is None:
                self._down_since = time.monotonic()
                self.outages += 1
                log.warning("store unavailable, retrying with backoff (%s: %s)", type(exc).__name__,
                            str(exc).splitlines()[0] if str(exc) else "")

    def ok(self) -> None:
        if self._down_since is None:  # the common case: no lock
            return
        with self._lock:
            if self._down_since is not None:
                log.warning("store back after %.1f s", time.monotonic() - self._down_since)
                self._down_since = None
                self.back_at = time.monotonic()


def durable(call: Callable[[], T], health: StoreHealth, stop: threading.Event) -> T:
    """``call()``, retried on store errors with capped exponential backoff and jitter until it succeeds, or
    until ``stop`` is set (the wait between tries ends at once; the last store error is raised). Other
    errors propagate at once."""

    def note(state: RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome is not None else None
        if exc is not None:
            health.failed(exc)

    retrying = Retrying(
        retry=retry_if_exception_type(STORAGE_ERRORS),
        wait=wait_exponential_jitter(multiplier=BACKOFF_INITIAL_S, max=BACKOFF_MAX_S, jitter=BACKOFF_INITIAL_S),
        stop=lambda state: stop.is_set(),
        sleep=lambda seconds: _wait(stop, seconds),
        before_sleep=note,
        reraise=True,
    )
    result = retrying(call)
    health.ok()
    return result


def _wait(stop: threading.Event, seconds: float) -> None:
    stop.wait(seconds)
