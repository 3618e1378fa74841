"""Re-verification requests: ``GET /v1/best`` answered from a config verified on another device or software.

A published best is ``exact`` only for the device name and software it was verified under
(:mod:`tuner.lookup`). When an answer comes from an entry of another device name or software
(:attr:`tuner.lookup.Answer.foreign`), the config may well be right for the requester, but nobody
has measured it there: :class:`Reverifier` queues a verify job (the job kind of ``tuner verify``) for the
entry's shape on the requester's device kind and device name (any device of the kind when the request gave
none), so that a worker there re-measures the config in fresh processes and records the verification
with its own fingerprint.

Not for an entry of a version the template carries (:class:`tuner.spec.CarriedVersion`): there is no
current-version best to verify; tuning the shape replaces it.
Only when a live worker of that device kind (and name, when given) advertises the template at its version:
a device name or software that no worker serves queues nothing (a reader's requests alone cannot fill the
queue with jobs nobody can run). At most one job per (template, entry shape, device kind, device name,
requested software) among the latest 4096 such requests of a server process, and none while a verify job
for the same template, shape and device is queued or running. A request that queued nothing because no live
worker could run it, or because the store failed, is asked again after a minute (a worker may start).
Submission happens on one background thread: a lookup never waits for it, and a failure (store down…) is
logged, never raised. ``tuner serve`` turns it on by default (``TUNER_REVERIFY_FOREIGN``,
``--no-reverify``). Thread-safe.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from tuner.api.best_service import BestRequest
from tuner.api.catalog import Catalog
from tuner.api.deps import StoreProvider
from tuner.frozen import Shape
from tuner.lookup import Answer
from tuner.settings import engine_settings
from tuner.store.records import ACTIVE_JOB_STATES, check_job_kind, has_template, is_live

log = logging.getLogger(__name__)
SUBMITTER = "tuner-serve:reverify"  # submitted_by of the jobs it queues
SEEN_MAX = 4096  # requests remembered as handled (each asks for one job at most once while remembered)
RETRY_S = 60.0  # a request that queued nothing (no live worker could run it; the store failed) is asked again after


class Reverifier:
    """Callable as ``BestService.on_foreign``; see the module docstring."""

    def __init__(self, stores: StoreProvider, catalog: Catalog, *, processes: int = 5,
                 comparator_processes: int | None = None, on_queued: Callable[[int], None] | None = None) -> None:
        """``processes``: fresh processes per verification; ``comparator_processes``: the comparators in only
        the first that many (None: all); ``on_queued(job_id)``: called after each job is queued (tests, logs)."""
        check_job_kind("verify", 0, processes, comparator_processes)  # the jobs it queues must be valid
        self.stores, self.catalog, self.processes, self.on_queued = stores, catalog, processes, on_queued
        self.comparator_processes = comparator_processes
        # the latest SEEN_MAX requests, each with the monotonic time until which it counts as handled (inf: a
        # job was queued for it, or one like it was queued or running)
        self._seen: OrderedDict[tuple[object, ...], float] = OrderedDict()
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tuner-reverify")

    def __call__(self, request: BestRequest, answer: Answer) -> None:
        entry = answer.entry
        if entry is None or not answer.foreign:
            return
        try:
            current = self.catalog.get(entry.template).spec.version
        except Exception:  # an unknown template cannot have been answered; never fail a lookup over it
            return
        if entry.template_version != current:
            # a carried version's best (tuner.spec.CarriedVersion): a verify job re-measures the current
            # version's published best, which this shape does not have yet; tuning it replaces the entry
            return
        shape = Shape(dict(entry.shape))
        key = (entry.template, shape, request.device_kind, request.device_name,
               tuple(sorted(request.software.items())))
        with self._lock:
            if self._seen.get(key, -math.inf) > time.monotonic():
                self._seen.move_to_end(key)
                return
            self._seen[key] = math.inf
            self._seen.move_to_end(key)
            if len(self._seen) > SEEN_MAX:
                self._seen.popitem(last=False)
        self._pool.submit(self._queue, key, entry.template, shape, request.device_kind, request.device_name, answer)

    def _queue(self, key: tuple[object, ...], template: str, shape: Shape, device_kind: str, device_name: str | None,
               answer: Answer) -> None:
        try:
            job_id = self._submit(template, shape, device_kind, device_name)
        except Exception as exc:  # a background convenience: never fatal, never silent
            log.warning("could not queue a re-verification of %s %s: %s", template, shape.key(), exc)
            self._retry_later(key)
            return
        if job_id is None:
            return
        what = ", ".join(str(d) for d in answer.differences if not d.what.startswith("shape."))
        log.info("queued verify job %s for %s %s on %s %s (%s)", job_id, template, shape.key(), device_kind,
                 device_name or "(any)", what)
        if self.on_queued is not None:
            self.on_queued(job_id)

    def _retry_later(self, key: tuple[object, ...], *, prefix: bool = False) -> None:
        """The request ``key`` (with ``prefix``: every remembered request whose key starts so, whatever its
        software) counts as handled for RETRY_S more seconds only: a worker may start, the store come back."""
        until = time.monotonic() + RETRY_S
        with self._lock:
            for seen in [k for k in self._seen if (k[:len(key)] == key if prefix else k == key)]:
                self._seen[seen] = until

    def _submit(self, template: str, shape: Shape, device_kind: str, device_name: str | None) -> int | None:
        """The id of the verify job queued, or None when no live worker could run it (a device name or
        software nobody serves: the caller's request alone must not fill the queue) or an equal job is
        already queued or running."""
        spec = self.catalog.get(template).spec
        store = self.stores.get()
        now = store.clock()  # leases are the store's clock's
        if not any(is_live(w, now) and w.device_kind == device_kind and device_name in (None, w.device_name)
                   and has_template(w, template, spec.version)
                   for w in store.list_workers()):
            log.info("no live worker of %s %s has %s version %s: no re-verification queued", device_kind,
                     device_name or "(any)", template, spec.version)
            self._retry_later((template, shape, device_kind, device_name), prefix=True)
            return None
        for state in ACTIVE_JOB_STATES:
            for job in store.list_jobs(state=state, limit=1000):
                if (job.kind == "verify" and job.template == template and job.device_kind == device_kind
                        and job.device_name == device_name and any(t.shape_key == shape.key() for t in job.tasks)):
                    return None
        job = store.create_verify_job(
            template=template, template_version=spec.version, backend=spec.backend, device_kind=device_kind,
            device_name=device_name, tasks=[(f"reverify {shape.key()}", shape.key(), shape.to_json())],
            processes=self.processes, submitted_by=SUBMITTER, max_attempts=engine_settings().task_attempts,
            comparator_processes=self.comparator_processes,
        )
        return job.id

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
