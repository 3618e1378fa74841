"""Liveness of a worker: one beating thread for its lease in the job queue and its trials' heartbeats.

A worker holds a lease in the queue (:meth:`tuner.store.JobQueue.heartbeat`) and, while it drives a
study shared with other workers, Optuna heartbeats of the trials it has in flight (so that a worker that
dies has its trials failed and retried by the others). :class:`Heartbeat` does both from one thread, every
``interval_s``; the trial loop adds and removes in-flight trials through :class:`InFlight` meanwhile.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator

import optuna

from tuner.db.retry import STORAGE_ERRORS, StoreHealth
from tuner.driver import optuna_access
from tuner.store import JobQueue

log = logging.getLogger(__name__)


class InFlight:
    """The storage ids of the trials a driver has asked and not yet told. Thread-safe (one lock): the trial
    loop changes it while the heartbeat thread reads it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ids: set[int] = set()

    def add(self, trial_id: int) -> None:
        with self._lock:
            self._ids.add(trial_id)

    def discard(self, trial_id: int) -> None:
        with self._lock:
            self._ids.discard(trial_id)

    def __contains__(self, trial_id: object) -> bool:
        with self._lock:
            return trial_id in self._ids

    def __iter__(self) -> Iterator[int]:
        """Iterates over a snapshot (the set may change meanwhile)."""
        with self._lock:
            return iter(sorted(self._ids))

    def __len__(self) -> int:
        with self._lock:
            return len(self._ids)


class Heartbeat:
    """Renews ``worker_id``'s lease every ``interval_s`` and beats for the in-flight trials of the study
    attached with :meth:`attach`. When the queue says the worker was declared lost, ``on_lost`` is called
    once and the thread ends. Store outages (Optuna's storage errors too) are reported to ``health``, which
    logs each outage once, and retried at the next beat.

    Thread-safe: :meth:`attach` and :meth:`detach` may be called from any thread while it runs; the
    attached pair is read and replaced under a lock. ``start`` once, ``stop`` once (idempotent).
    """

    def __init__(
        self, queue: JobQueue, worker_id: str, *, interval_s: float, lease_s: float, on_lost: Callable[[], None],
        health: StoreHealth | None = None,
    ) -> None:
        self._queue, self._worker_id = queue, worker_id
        self._interval_s, self._lease_s, self._on_lost = interval_s, lease_s, on_lost
        self._health = health or StoreHealth()
        self._lock = threading.Lock()
        self._trials: tuple[optuna.storages.BaseStorage, InFlight] | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tuner-heartbeat", daemon=True)

    def attach(self, storage: optuna.storages.BaseStorage, in_flight: InFlight) -> None:
        """Beat for the trials in ``in_flight`` (of ``storage``) from now on."""
        with self._lock:
            self._trials = (storage, in_flight)

    def detach(self) -> None:
        with self._lock:
            self._trials = None

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop beating and wait (at most one interval and a few seconds) for the thread to end."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=self._interval_s + 5)

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            try:
                if not self._queue.heartbeat(worker_id=self._worker_id, lease_s=self._lease_s):
                    log.error("worker %s was declared lost; stopping", self._worker_id)
                    self._on_lost()
                    return
                with self._lock:
                    trials = self._trials
                if trials is not None:
                    storage, in_flight = trials
                    for trial in in_flight:
                        optuna_access.record_heartbeat(storage, trial)
                self._health.ok()
            except STORAGE_ERRORS as exc:  # an outage: logged once (StoreHealth), retried at the next beat
                self._health.failed(exc)
            except Exception:  # anything else (a bug, a trial Optuna no longer has): say so, beat on
                log.exception("worker %s: heartbeat failed; retried at the next beat", self._worker_id)
