"""Compiled-kernel cache and a parallel pre-compiler.

Key: template name + version, config, shape, backend and the toolchain fingerprint (compiler, its version,
target; see kernels/tilelang_toolchain.py). Everything lives under ``$TUNER_HOME/kernel-cache`` (TUNER_HOME
defaults to ``~/.local/share/tuner``)::

    kernel-cache/entries/<2 hex>/<digest>.json   one record per key: ok, or the compile error it raised
    kernel-cache/<backend>/<toolchain digest>/   the backend's own artifact cache (TileLang: its cache dir)

Why wrap TileLang's cache rather than replace it: TileLang already stores each compiled library atomically
(staging directory + rename, with an integrity manifest) under a content key (TIR script + target + pass
configs), and loading a library back needs its adapter internals; copying that would break with each
TileLang release. What it lacks, this module adds: (1) our semantic key, so that a config known to fail is
answered without tracing or compiling it again (negative entries), (2) the toolchain in the key — TileLang's
key has its own version and the target but not the nvcc/compiler version, so each toolchain gets its own
artifact directory, (3) an in-process dict keyed by our key (TileLang's in-memory cache needs a trace and
warns on hits), (4) one documented root. An ``ok`` entry means "compiled here before": the next build still
traces the program (~0.2 s) and TileLang loads the library from its disk cache instead of compiling.

Concurrency: entries are written to a temporary file in the same directory and renamed into place
(``os.replace`` is atomic on POSIX), so readers see a whole record or none; two writers of one key both
write complete records. Within a process, a :class:`CompileCache` is thread-safe and compiles one key once.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import hashlib
import json
import logging
import multiprocessing
import os
import signal
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from tuner.errors import MeasureInterrupted
from tuner.frozen import Config, Shape
from tuner.measure.protocol import comparator_of
from tuner.settings import data_home

if TYPE_CHECKING:
    from tuner.template import KernelTemplate

T = TypeVar("T")
log = logging.getLogger(__name__)

MAX_ERROR_CHARS = 8000
_TRANSIENT_MARKERS = ("timed out", "timeout", "killed", "out of memory", "no space left")


def kernel_cache_dir() -> Path:
    """``kernel-cache`` in :func:`tuner.settings.data_home`."""
    return data_home() / "kernel-cache"


@dataclass(frozen=True)
class CacheKey:
    """Everything that changes a compiled kernel. Immutable; :meth:`digest` is stable across processes."""

    template: str
    version: str
    config: Config
    shape: Shape
    backend: str
    toolchain: Mapping[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "template": self.template,
            "version": self.version,
            "config": self.config.to_dict(),
            "shape": self.shape.to_dict(),
            "backend": self.backend,
            "toolchain": dict(sorted(self.toolchain.items())),
        }

    def toolchain_digest(self) -> str:
        text = json.dumps(dict(sorted(self.toolchain.items())), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def digest(self) -> str:
        text = json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()


@dataclass(frozen=True)
class CacheEntry:
    """The on-disk record of one key: ``status`` is ``ok`` or ``compile_error`` (then ``error`` says why)."""

    status: str
    error: str | None
    compile_s: float
    created: float
    key: Mapping[str, Any]


class CompileFailed(Exception):
    """The kernel does not compile; ``error`` is the compiler's message, ``cached`` whether it was recorded
    earlier (then nothing was compiled this time)."""

    def __init__(self, error: str, *, cached: bool) -> None:
        super().__init__(error)
        self.error = error
        self.cached = cached


def describe(exc: BaseException) -> str:
    """``Type: message``, cut to MAX_ERROR_CHARS (compiler errors can quote whole sources)."""
    text = exc.error if isinstance(exc, CompileFailed) else f"{type(exc).__name__}: {exc}"
    if len(text) <= MAX_ERROR_CHARS:
        return text
    half = MAX_ERROR_CHARS // 2
    return f"{text[:half]}\n… [{len(text) - MAX_ERROR_CHARS} chars cut] …\n{text[-half:]}"


class CompileCache:
    """Cache of compiled kernels under ``root`` (default ``$TUNER_HOME/kernel-cache``) plus a memory layer.

    :meth:`get_or_compile` returns the in-process object for a key, else raises :class:`CompileFailed` for a
    key recorded as failing, else compiles (once per key per process, even across threads) and records the
    outcome. ``stats`` counts ``memory_hits``, ``failed_hits`` (negative entries answered without compiling)
    and ``compiles``. Thread-safe. The memory layer keeps every kernel built in the process (measurement
    subprocesses are short-lived; call :meth:`forget_memory` in a long-lived one).
    """

    def __init__(self, root: Path | str | None = None) -> None:
        self.root = Path(root) if root is not None else kernel_cache_dir()
        self._lock = threading.Lock()
        self._key_locks: dict[str, threading.Lock] = {}
        self._memory: dict[str, Any] = {}
        self.stats = {"memory_hits": 0, "failed_hits": 0, "compiles": 0}

    def artifact_dir(self, key: CacheKey) -> Path:
        """Where the backend keeps its own artifacts for this key's toolchain (created on demand)."""
        return self.root / key.backend / key.toolchain_digest()

    def entry_path(self, key: CacheKey) -> Path:
        digest = key.digest()
        return self.root / "entries" / digest[:2] / f"{digest}.json"

    def entry(self, key: CacheKey) -> CacheEntry | None:
        """The record of ``key`` on disk, or None (also for an unreadable or foreign file)."""
        try:
            data = json.loads(self.entry_path(key).read_text())
            return CacheEntry(data["status"], data["error"], data["compile_s"], data["created"], data["key"])
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def get_or_compile(
        self,
        key: CacheKey,
        compile_fn: Callable[[Path], T],
        *,
        is_compile_error: Callable[[BaseException], bool],
    ) -> T:
        """The compiled object for ``key``; ``compile_fn(artifact_dir)`` runs on a miss.

        Raises CompileFailed for a failing key (recorded now or before); other exceptions of
        ``compile_fn`` (``is_compile_error`` false, or transient: timeouts, OOM) propagate unrecorded.
        """
        digest = key.digest()
        with self._lock:
            lock = self._key_locks.setdefault(digest, threading.Lock())
        with lock:
            return self._get_or_compile_locked(key, digest, compile_fn, is_compile_error)

    def _get_or_compile_locked(
        self,
        key: CacheKey,
        digest: str,
        compile_fn: Callable[[Path], T],
        is_compile_error: Callable[[BaseException], bool],
    ) -> T:
        if digest in self._memory:
            self._count("memory_hits")
            return self._memory[digest]
        recorded = self.entry(key)
        if recorded is not None and recorded.status == "compile_error":
            self._count("failed_hits")
            raise CompileFailed(recorded.error or "compile error", cached=True)
        self._count("compiles")
        start = time.perf_counter()
        try:
            artifact_dir = self.artifact_dir(key)
            artifact_dir.mkdir(parents=True, exist_ok=True)
            compiled = compile_fn(artifact_dir)
        except Exception as exc:
            if not is_compile_error(exc) or _transient(exc):
                raise
            error = describe(exc)
            self._record(key, "compile_error", error, time.perf_counter() - start)
            raise CompileFailed(error, cached=False) from exc
        if recorded is None:
            self._record(key, "ok", None, time.perf_counter() - start)
        self._memory[digest] = compiled
        return compiled

    def _count(self, name: str) -> None:
        with self._lock:
            self.stats[name] += 1

    def _record(self, key: CacheKey, status: str, error: str | None, seconds: float) -> None:
        record = {
            "status": status,
            "error": error,
            "compile_s": round(seconds, 3),
            "created": time.time(),
            "key": key.to_dict(),
        }
        _atomic_write_text(self.entry_path(key), json.dumps(record, sort_keys=True, indent=1))

    def forget_memory(self) -> None:
        """Drop the in-process layer (the disk stays)."""
        with self._lock:
            self._memory.clear()


def _transient(exc: BaseException) -> bool:
    text = str(exc).lower()
    return any(marker in text for marker in _TRANSIENT_MARKERS)


def _atomic_write_text(path: Path, text: str) -> None:
    """Write via a same-directory temporary file and os.replace: readers never see a partial file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


# -- the process-wide default cache ------------------------------------------------------------------------
_default_lock = threading.Lock()
_default: CompileCache | None = None


def default_cache() -> CompileCache:
    """The cache templates build through: ``$TUNER_HOME/kernel-cache`` unless :func:`set_default_cache`."""
    global _default
    with _default_lock:
        if _default is None:
            _default = CompileCache()
        return _default


def set_default_cache(cache: CompileCache | None) -> None:
    """Replace the process-wide cache (None: back to ``$TUNER_HOME`` at the next use)."""
    global _default
    with _default_lock:
        _default = cache


# -- parallel pre-compilation ------------------------------------------------------------------------------
def precompile(
    template: KernelTemplate,
    configs: Iterable[Config],
    shape: Shape,
    *,
    workers: int = 1,
    cache: CompileCache | None = None,
) -> dict[Config, str | None]:
    """Precompile every config for ``shape`` (:meth:`KernelTemplate.precompile`) so that later builds load
    from the cache.

    Returns config → None when it built, else the error (``Type: message``). ``workers`` > 1 builds in that
    many spawned processes (TVM and torch do not survive fork reliably); ``workers`` <= 1 builds here, one
    after another. A worker that dies (segfault in a compiler) fails only the configs it was building: they
    are retried one by one in fresh processes, and a config that kills its process again is reported as such.
    Builds go through ``cache`` (default: :func:`default_cache`); invalid configs simply fail to build.
    With ``workers`` <= 1 the process-wide default cache is swapped for ``cache`` meanwhile: not thread-safe.
    Spawned workers import the caller's main module: call it under ``if __name__ == "__main__":`` (else
    every worker dies and every config is reported as crashed).
    """
    configs = list(dict.fromkeys(configs))
    if not configs:
        return {}
    cache = cache if cache is not None else default_cache()
    ref = f"{type(template).__module__}:{type(template).__qualname__}"
    if workers <= 1:
        previous = _default
        set_default_cache(cache)
        try:
            return {c: _build_one(template, c, shape) for c in configs}
        finally:
            set_default_cache(previous)
    results, crashed, _ = _run_pool(ref, configs, shape, cache.root, workers)  # no timeout: nothing is late
    retried, _ = _retry_alone(ref, crashed, shape, cache.root)
    results.update(retried)
    return {c: results[c] for c in configs}


def _retry_alone(
    ref: str, crashed: list[Config], shape: Shape, root: Path, timeout_s: float | None = None,
    interrupted: threading.Event | None = None,
) -> tuple[dict[Config, str | None], list[tuple[Config, bool]]]:
    """Build each config a crash failed (it fails every build pending in the pool) alone in a fresh process,
    under the same timeout: the culprit crashes again, the others build. (results, late) as
    :func:`_submit_all`, which raises MeasureInterrupted once ``interrupted`` is set."""
    results: dict[Config, str | None] = {}
    late: list[tuple[Config, bool]] = []
    for config in crashed:
        retry, still, retry_late = _run_pool(ref, [config], shape, root, 1, timeout_s, interrupted)
        results.update(retry)
        results.update({c: "compile worker died (the compiler crashed the process twice)" for c in still})
        late.extend(retry_late)
    return results, late


def _run_pool(
    ref: str, configs: list[Config], shape: Shape, root: Path, workers: int, timeout_s: float | None = None,
    interrupted: threading.Event | None = None,
) -> tuple[dict[Config, str | None], list[Config], list[tuple[Config, bool]]]:
    """Build ``configs`` in a fresh pool of ``workers`` processes: (results, crashed, late), as
    :func:`_submit_all`; a late (or interrupted) build's processes are killed before the pool is shut down."""
    pool = _executor(min(workers, len(configs)) or 1, root)
    try:
        return _submit_all(pool, ref, configs, shape, workers, timeout_s, interrupted)
    finally:
        _shutdown(pool)


def _executor(workers: int, root: Path) -> cf.ProcessPoolExecutor:
    return cf.ProcessPoolExecutor(
        max_workers=workers,
        mp_context=multiprocessing.get_context("spawn"),
        initializer=_init_worker,
        initargs=(str(root),),
    )


# How long a shut-down pool's processes get to exit before they are killed: an idle one exits in well under a
# second; one whose exit waits on a thread or an exit handler a library left behind would hold its caller
# (`tuner tune`, a worker's job) for as long. On the H200 (2026-12-03) a MIMO compile process did not exit
# in 15 s after four of five final rounds and was killed: a shut-down pool has no build left, a kill loses nothing
# and the grace is short.
CLOSE_GRACE_S = 3.0


def _shutdown(pool: cf.ProcessPoolExecutor) -> None:
    """Shut ``pool`` down (pending builds cancelled): its processes get :data:`CLOSE_GRACE_S` to exit, then
    those still alive are killed with what they started; returns once the pool's processes and threads are
    gone."""
    grace_s = CLOSE_GRACE_S  # read at the call: a test shortens it
    processes = list(getattr(pool, "_processes", {}).values())
    # the thread that joins the processes; shutdown(wait=False) forgets it, so a later shutdown(wait=True)
    # would not wait for it
    manager = getattr(pool, "_executor_manager_thread", None)
    pool.shutdown(wait=False, cancel_futures=True)
    deadline = time.monotonic() + grace_s
    for process in processes:
        process.join(max(0.0, deadline - time.monotonic()))
    stuck = [p for p in processes if p.is_alive()]
    if stuck:
        log.warning("%d compile process(es) had not exited %g s after the pool was shut down: killed",
                    len(stuck), grace_s)
        _kill(stuck)
    if manager is not None:
        manager.join(10.0)  # it reaps the processes: none is left a zombie


def _kill_processes(pool: cf.ProcessPoolExecutor) -> None:
    """Kill the pool's processes and whatever they started (a compiler they wait on): each worker leads a
    process group of its own (:func:`_init_worker`). ProcessPoolExecutor has no public way to stop a
    running task."""
    _kill(list(getattr(pool, "_processes", {}).values()))


def _kill(processes: list[Any]) -> None:
    for process in processes:
        pid = process.pid
        if pid is None:
            continue
        try:
            os.killpg(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            with contextlib.suppress(Exception):
                process.kill()


_POLL_S = 0.25  # how often a batch with a timeout looks at its builds' start times


def _submit_all(
    pool: cf.ProcessPoolExecutor, ref: str, configs: list[Config], shape: Shape, workers: int = 1,
    timeout_s: float | None = None, interrupted: threading.Event | None = None,
) -> tuple[dict[Config, str | None], list[Config], list[tuple[Config, bool]]]:
    """Build ``configs`` in ``pool`` (of ``workers`` processes): (results, crashed, late).

    Without ``timeout_s`` every build is waited for and ``late`` is empty. With it, each build gets
    ``timeout_s`` from the moment its process starts it (after importing the template: a fresh process's
    imports are not the build's); the batch ends once every unfinished build is over its time, or waits
    behind builds that are (``late``: (config, True) for those, (config, False) for configs still queued
    then), and the pool's processes are killed then (the pool is broken: shut it down). A batch also ends
    after ``timeout_s`` times (its rounds of ``workers`` builds + 1) in all, the time its builds could take
    one round after another plus one for the processes' imports: a process that never starts its build
    (an import that hangs) holds its config as queued, and the configs neither started nor over their time
    then are late as (config, False). A crash fails every build still pending in the pool (``crashed``):
    the caller retries each alone. Once ``interrupted`` is set it raises MeasureInterrupted. Interrupted
    that way or otherwise (KeyboardInterrupt, the CLI's stop signal), it kills the
    pool's processes and their compilers before re-raising: closing the pool would otherwise wait on a
    build that hangs, and the builds (each in a session of its own) would outlive the program."""
    results: dict[Config, str | None] = {}
    crashed: list[Config] = []
    late: list[tuple[Config, bool]] = []
    with tempfile.TemporaryDirectory(prefix="tuner-builds-", ignore_cleanup_errors=True) as marks:
        paths = [os.path.join(marks, f"{i}.start") for i in range(len(configs))]
        futures = {pool.submit(_worker_build, ref, c.to_json(), shape.to_json(), path): c
                   for c, path in zip(configs, paths, strict=True)}
        started = dict(zip(futures, paths, strict=True))
        # the pool's processes, started by the submits; a broken pool may drop them from its own table
        processes = list(getattr(pool, "_processes", {}).values())
        _watch_every_process(pool)
        pending: set[cf.Future[str | None]] = set(futures)
        rounds = -(-len(configs) // max(1, workers))
        batch_ends = None if timeout_s is None else time.monotonic() + timeout_s * (rounds + 1)
        try:
            while pending:
                if interrupted is not None and interrupted.is_set():
                    raise MeasureInterrupted("the build was ended from outside (the worker is stopping)")
                polled = timeout_s is not None or interrupted is not None
                done, pending = cf.wait(pending, timeout=_POLL_S if polled else None,
                                        return_when=cf.FIRST_COMPLETED)
                for future in done:
                    try:
                        results[futures[future]] = future.result()
                    except cf.process.BrokenProcessPool:
                        crashed.append(futures[future])
                if crashed and processes:
                    # The broken pool sent SIGTERM to its processes, not to their process groups: a compiler
                    # another build of the pool had started (and hangs in) would outlive them.
                    _kill(processes)
                    processes = []
                if timeout_s is None or not pending:
                    continue
                now = time.monotonic()
                since = {f: _start_time(started[f]) for f in pending}
                overdue = {f for f, t in since.items() if t is not None and now - t > timeout_s}
                in_time = [f for f, t in since.items() if t is not None and f not in overdue]
                queued = [f for f, t in since.items() if t is None]
                stuck = not in_time and (not queued or len(overdue) >= workers)
                if stuck or (batch_ends is not None and now > batch_ends):
                    late = [(futures[f], f in overdue) for f in pending]
                    _kill_processes(pool)  # before the marks' folder goes: no build starts in between
                    break
        except BaseException:  # interrupted (Ctrl-C, a stop signal): no build outlives its caller
            _kill_processes(pool)
            raise
    return results, crashed, late


def _watch_every_process(pool: cf.ProcessPoolExecutor) -> None:
    """Make the pool's manager thread watch every process the submits started. A submit wakes that thread
    before it starts its process (CPython 3.11/3.12), so the thread can be waiting on the earlier processes
    only: a crash of the newest one then went unnoticed until another build ended (a batch of two, one
    hanging, waited for its whole timeout; seen on a loaded host). One more wake-up once every process runs
    makes it look again."""
    wakeup = getattr(pool, "_executor_manager_thread_wakeup", None)
    if wakeup is not None:
        with contextlib.suppress(Exception):
            wakeup.wakeup()


def _mark_start(path: str) -> None:
    """Write the start time of a build to ``path`` (whole or not at all; nothing when the batch that wanted
    it is over and its folder gone). ``time.monotonic`` is one clock for every process of a Linux host."""
    with contextlib.suppress(OSError):
        with open(path + ".tmp", "w") as f:
            f.write(repr(time.monotonic()))
        os.replace(path + ".tmp", path)


def _start_time(path: str) -> float | None:
    """When a build's process started it (its mark file), or None while it waits in the queue."""
    try:
        with open(path) as f:
            return float(f.read())
    except (OSError, ValueError):
        return None


@dataclass(frozen=True)
class CompileBatch:
    """What :meth:`CompilePool.compile` did with a batch. Immutable.

    ``errors``: config → None when it built (or was left unbuilt, see ``unbuilt``), else the error
    (``Type: message``). ``timed_out``: configs whose build was still running when its time ran out (its
    process was killed; measuring it would build it again, for as long). ``unbuilt``: configs the batch's
    end caught in the queue, not started here (their measurement builds them)."""

    errors: Mapping[Config, str | None]
    timed_out: frozenset[Config] = frozenset()
    unbuilt: frozenset[Config] = frozenset()


class CompilePool:
    """A pool of compile processes kept warm across batches (their torch/TileLang imports cost seconds).

    ``compile(template, configs, shape)`` behaves as :func:`precompile` with this pool's workers; a batch
    in which a compiler crashed a worker restarts the pool and isolates the culprit (each crashed config
    alone in a fresh process, under the same timeout). With ``timeout_s`` each build gets that long from its
    start: a build still running then (a compiler that hangs) is reported as timed out, and the pool's
    processes — with the compilers they started — are killed (the next batch starts fresh ones) once nothing
    else in the batch can finish; without it a hung compiler blocks the batch for good (seen on the H200: a
    Triton build of a 3-stage P = 128 MIMO config, 8 minutes without an answer). A pool one of whose idle
    processes died meanwhile is replaced when the next batch is submitted. Not thread-safe; use as a
    context manager or call :meth:`close`.
    """

    def __init__(self, workers: int, cache: CompileCache | None = None) -> None:
        self.workers = max(1, workers)
        self.cache = cache if cache is not None else default_cache()
        self._pool: cf.ProcessPoolExecutor | None = None
        self._interrupted = threading.Event()

    def interrupt(self) -> None:
        """End the batch building now (from any thread: a worker stopping): its processes and their
        compilers are killed and :meth:`compile` raises MeasureInterrupted, now and at every later call."""
        self._interrupted.set()

    def compile(
        self, template: KernelTemplate, configs: Iterable[Config], shape: Shape, *, timeout_s: float | None = None,
    ) -> CompileBatch:
        configs = list(dict.fromkeys(configs))
        if not configs:
            return CompileBatch({})
        ref = f"{type(template).__module__}:{type(template).__qualname__}"
        for fresh in (False, True):  # a process that died while the pool sat idle (the OOM killer) broke it
            if self._pool is None:
                self._pool = _executor(self.workers, self.cache.root)
            try:
                results, crashed, late = _submit_all(self._pool, ref, configs, shape, self.workers, timeout_s,
                                                     self._interrupted)
                break
            except cf.process.BrokenProcessPool:
                self.close()
                if fresh:
                    raise
            except MeasureInterrupted:
                self.close()  # its processes are killed: shut it down
                raise
        if late or crashed:
            self.close()  # killed or broken: a pool in either state cannot be reused
        retried, retry_late = _retry_alone(ref, crashed, shape, self.cache.root, timeout_s, self._interrupted)
        results.update(retried)
        late.extend(retry_late)
        timed_out = {config for config, started in late if started}
        unbuilt = {config for config, started in late if not started}
        for config, started in late:
            results[config] = f"TimeoutError: compile timed out after {timeout_s:g} s" if started else None
        return CompileBatch({c: results[c] for c in configs}, frozenset(timed_out), frozenset(unbuilt))

    def close(self) -> None:
        """Shut the pool down; a process that has not exited :data:`CLOSE_GRACE_S` later is killed (with
        the compilers it started). Idempotent; a later :meth:`compile` starts fresh processes."""
        if self._pool is not None:
            pool, self._pool = self._pool, None
            _shutdown(pool)

    def __enter__(self) -> CompilePool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _init_worker(root: str) -> None:
    # A process group of its own: killing the pool kills the compilers (nvcc, ptxas) a build started too.
    with contextlib.suppress(OSError):
        os.setsid()
    set_default_cache(CompileCache(root))


def _worker_build(ref: str, config_json: str, shape_json: str, mark: str | None = None) -> str | None:
    from tuner import registry

    template = registry.load(ref)
    if mark is not None:  # the build starts now: its timeout counts from here
        _mark_start(mark)
    return _build_one(template, Config.from_json(config_json), Shape.from_json(shape_json))


def _build_one(template: KernelTemplate, config: Config, shape: Shape) -> str | None:
    """Precompile one config, or one comparator when ``config`` is a comparator's result config
    (``{"comparator": name}``, :meth:`tuner.measure.protocol.Candidate.result_config`); its error as a value."""
    try:
        name = comparator_of(config)
        if name is not None:
            template.precompile_comparator(name, shape)
        else:
            template.precompile(config, shape)
    except Exception as exc:  # every failure of a candidate is a value here
        return describe(exc)
    return None
