"""``tuner serve``: the API under uvicorn, and (unless ``--no-worker``) one local worker as a child process.

The store is opened (and migrated) before anything starts, so that the server and the worker never race a
migration and a bad URL fails at once. The worker child gets the store URL through ``TUNER_DB_URL`` (not its
command line, where a password would be visible to other users) and, on Linux, SIGTERM when this process
dies. On SIGINT/SIGTERM uvicorn shuts down gracefully; then the worker is asked to stop (SIGTERM: it
leaves after its current trial, giving back its reservations) and killed after ``WORKER_GRACE_S``.

The worker child is watched while the server runs: one that exits with the CLI's code for a refused input
(:data:`REFUSED`: ``--device cuda`` on a host without CUDA, say) stops the server, which then raises
UserInputError (``tuner serve`` exits 2 with the worker's error above it): a server whose only worker
never started would queue jobs nobody runs and say nothing. One that exits with another code is
logged as an error and the server goes on serving (its pages, its bests, other hosts' workers).

Without ``TUNER_TOKENS``, a local token with the ``submit`` and ``read`` scopes is read from (or created in)
:func:`tuner.service.remote.local_token_path`, where ``tuner submit`` on this machine finds it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable

from tuner import db
from tuner.errors import UserInputError

log = logging.getLogger("tuner.service.serve")
WORKER_GRACE_S = 10.0  # a worker ends its measurement at once on SIGTERM (tuner.service.worker)
REFUSED = 2  # the exit code of `tuner worker` (any tuner command) whose input was refused: UserInputError


def start_worker(store: db.Store, device: str, extra: tuple[str, ...] = ()) -> subprocess.Popen[bytes]:
    """``python -m tuner.cli worker --device DEVICE`` on the same store (URL passed in the environment), in a
    session of its own: a Ctrl-C at the terminal reaches the server, which stops the worker after its own
    shutdown (:func:`stop_worker`), not both at once."""
    env = {**os.environ, "TUNER_DB_URL": store.unmasked_url()}
    return subprocess.Popen(
        [sys.executable, "-m", "tuner.cli", "worker", "--device", device, *extra],
        env=env, preexec_fn=die_with_parent if sys.platform == "linux" else None, start_new_session=True,
    )


def die_with_parent() -> None:
    # prctl(PR_SET_PDEATHSIG, SIGTERM): the kernel signals the worker if `tuner serve` is killed outright.
    import ctypes

    with contextlib.suppress(OSError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)


def stop_worker(child: subprocess.Popen[bytes], grace_s: float = WORKER_GRACE_S) -> int | None:
    """SIGTERM, wait up to ``grace_s``, then SIGKILL; the child's exit code."""
    if child.poll() is None:
        child.terminate()
        try:
            child.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            log.warning("worker %s did not stop within %.0f s; killing it", child.pid, grace_s)
            child.kill()
            child.wait()
    return child.returncode


def serve(app: object, *, host: str, port: int, log_level: str, access_log: bool,
          worker: Callable[[], subprocess.Popen[bytes]] | None) -> None:
    """Run uvicorn in this (main) thread until SIGINT/SIGTERM; the worker child lives as long as the server."""
    import uvicorn

    config = uvicorn.Config(app, host=host, port=port, log_level=log_level, access_log=access_log,  # type: ignore[arg-type]
                            lifespan="on")
    server = uvicorn.Server(config)
    # uvicorn restores the previous handlers after its graceful shutdown and re-raises the signal it got;
    # these handlers receive it, so the process goes on to stop its worker instead of dying on the spot.
    # (Before uvicorn installs its own, a signal asks the server to exit just the same.)
    previous = {
        sig: signal.signal(sig, lambda *_: setattr(server, "should_exit", True))
        for sig in (signal.SIGINT, signal.SIGTERM)
    }
    child = worker() if worker is not None else None
    stopping = threading.Event()
    refused: list[int] = []

    def watch(child: subprocess.Popen[bytes]) -> None:
        code = child.wait()  # and reaps it: no zombie while the server goes on
        if stopping.is_set() or server.should_exit:  # the server is stopping: so is its worker
            return
        if code == REFUSED:
            log.error("the local worker (pid %s) could not start: its error is above; stopping the server",
                      child.pid)
            refused.append(code)
            server.should_exit = True
        else:
            log.error("the local worker (pid %s) exited with code %s; the server goes on without it: jobs wait "
                      "for another worker (GET /v1/workers lists them)", child.pid, code)

    if child is not None:
        threading.Thread(target=watch, args=(child,), name="tuner-serve-worker", daemon=True).start()
    try:
        server.run()
    finally:
        stopping.set()
        if child is not None:
            stop_worker(child)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if refused:
        raise UserInputError("the local worker could not start (see its error above); run `tuner serve "
                             "--no-worker` and start workers where their device is, or pick --device this host has")
