"""Client-side deadlines for PostgreSQL connections: a database that stops answering fails fast.

The server's ``statement_timeout`` cancels slow statements, but a partitioned database (packets held or
dropped on the way) answers nothing at all, and a blocking read on a pooled connection waits for TCP to
give up, which takes minutes. So every statement, every COMMIT and ROLLBACK (SQLAlchemy sends them through
the driver's own calls, which no cursor event sees) and the liveness check of every connection taken from
the pool run under a deadline kept by one watchdog thread: past it, the watchdog shuts the connection's socket
down, the driver's read fails at once with a disconnect error, SQLAlchemy discards the connection, and the
caller gets it as :class:`tuner.errors.StoreError` from :meth:`tuner.db.Store.session`.

:func:`guard` installs this on an engine (the store's own, and Optuna's storage engine on the same database).
"""

from __future__ import annotations

import itertools
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from sqlalchemy import Engine, event, exc

from tuner.db.settings import StoreSettings

log = logging.getLogger(__name__)
_TOKEN = "tuner_deadline"
DEADLINE_OPTION = "tuner_deadline_s"  # execution option: this connection's statements get this deadline instead


class Watchdog:
    """Runs an action when its deadline passes unless disarmed first; after :meth:`disarm` returns, the
    action has run or never will. Thread-safe; one daemon thread, started on first use (and again in a
    forked child, where the parent's thread does not exist)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._due: dict[int, tuple[float, Callable[[], None]]] = {}
        self._ids = itertools.count()
        self._thread: threading.Thread | None = None
        self._pid = os.getpid()

    def arm(self, seconds: float, action: Callable[[], None]) -> int:
        with self._cond:
            if self._thread is None or self._pid != os.getpid():
                self._pid = os.getpid()
                self._due.clear()
                self._thread = threading.Thread(target=self._run, name="tuner-db-deadline", daemon=True)
                self._thread.start()
            token = next(self._ids)
            self._due[token] = (time.monotonic() + seconds, action)
            self._cond.notify()
            return token

    def disarm(self, token: int) -> None:
        with self._cond:
            self._due.pop(token, None)

    def _run(self) -> None:
        # Actions run holding the lock (cutting a socket takes microseconds): once disarm() has returned, its
        # action has run or never will, so a connection disarmed as it went back to the pool is not cut later,
        # under the next thread that checks it out.
        while True:
            with self._cond:
                now = time.monotonic()
                expired = [t for t, (due, _) in self._due.items() if due <= now]
                actions = [self._due.pop(t)[1] for t in expired]
                if not actions:
                    wait = min((due for due, _ in self._due.values()), default=now + 60.0) - now
                    self._cond.wait(timeout=max(wait, 0.001))
                    continue
                for action in actions:
                    try:
                        action()
                    except Exception:  # a socket already closed: nothing left to cut
                        log.debug("deadline action failed", exc_info=True)


WATCHDOG = Watchdog()


def cut(dbapi_connection: Any) -> None:
    """Shut down the socket of a libpq connection: its pending read returns and raises a disconnect error."""
    fd = dbapi_connection.fileno()
    dup = socket.socket(fileno=os.dup(fd))
    try:
        dup.shutdown(socket.SHUT_RDWR)
    finally:
        dup.close()
    log.warning("a database connection did not answer within its deadline; cut")


def guard(engine: Engine, settings: StoreSettings) -> None:
    """Put the engine's PostgreSQL statements and pool liveness checks under deadlines (libpq drivers).

    Use instead of ``pool_pre_ping``: the check here runs under a deadline, and a failed check makes the
    pool open a new connection (SQLAlchemy's pessimistic disconnect handling through the checkout event)."""
    if engine.dialect.name != "postgresql" or engine.dialect.driver not in ("psycopg", "psycopg2"):
        return

    @event.listens_for(engine, "before_cursor_execute")
    def _arm(conn: Any, cursor: Any, statement: Any, params: Any, context: Any, executemany: bool) -> None:
        dbapi_connection = conn.connection.dbapi_connection
        seconds = conn.get_execution_options().get(DEADLINE_OPTION, settings.statement_deadline_s)
        conn.info[_TOKEN] = WATCHDOG.arm(seconds, lambda: cut(dbapi_connection))

    def _disarm(conn: Any) -> None:
        token = conn.info.pop(_TOKEN, None)
        if token is not None:
            WATCHDOG.disarm(token)

    @event.listens_for(engine, "after_cursor_execute")
    def _after(conn: Any, cursor: Any, statement: Any, params: Any, context: Any, executemany: bool) -> None:
        _disarm(conn)

    @event.listens_for(engine, "handle_error")
    def _error(context: Any) -> None:
        if context.connection is not None:
            _disarm(context.connection)

    _bound_transaction_ends(engine, settings.statement_deadline_s)

    @event.listens_for(engine.pool, "checkout")
    def _ping(dbapi_connection: Any, record: Any, proxy: Any) -> None:
        token = WATCHDOG.arm(settings.connect_timeout_s, lambda: cut(dbapi_connection))
        try:
            with dbapi_connection.cursor() as cursor:
                cursor.execute("SELECT 1")
            dbapi_connection.rollback()  # SELECT opened a transaction: leave the connection as the pool had it
        except Exception as error:
            raise exc.DisconnectionError(f"pooled connection is dead: {type(error).__name__}") from error
        finally:
            WATCHDOG.disarm(token)


def _bound_transaction_ends(engine: Engine, seconds: float) -> None:
    """Run the engine's COMMITs and ROLLBACKs under the deadline: its dialect's ``do_commit`` and
    ``do_rollback`` (every engine has a dialect of its own) wrapped so that the watchdog cuts a connection
    whose COMMIT or ROLLBACK gets no answer. A COMMIT cut this way may have committed: the caller gets a
    StoreError and a retry must be idempotent (:mod:`tuner.db.retry`)."""
    dialect = engine.dialect
    for name in ("do_commit", "do_rollback"):
        original = getattr(dialect, name)

        def bounded(dbapi_connection: Any, original: Callable[[Any], None] = original) -> None:
            token = WATCHDOG.arm(seconds, lambda: cut(dbapi_connection))
            try:
                original(dbapi_connection)
            finally:
                WATCHDOG.disarm(token)

        setattr(dialect, name, bounded)
