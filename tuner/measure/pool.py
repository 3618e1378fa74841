"""A child Python process that answers pickled messages: the isolation unit of the measurer.

The child is started with ``subprocess`` (not ``multiprocessing``): its environment is set before the
interpreter starts, so variables such as ``TRITON_INTERPRET`` are seen before anything imports Triton, and the
parent's ``__main__`` is never re-imported. Requests go to the child's stdin; replies come back on a pipe of
their own (fd passed to the child), so whatever kernels or libraries print cannot corrupt the protocol. The
child's stdout and stderr go to a log file whose tail explains crashes.

Frames are an 8-byte big-endian length followed by a pickle. The parent trusts what its own child sends.
A :class:`WorkerProcess` is not thread-safe; the measurer serialises its use.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import select
import signal
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from typing import IO, Any

from tuner.errors import TunerError

_HEADER = struct.Struct("!Q")


class WorkerError(TunerError):
    """The worker process failed as a process (not a candidate result)."""


class WorkerDied(WorkerError):
    """The worker exited (crash, abort, kill) before answering: ``how`` (e.g. "was killed by SIGSEGV") and
    ``output``, the informative end of what it printed (a fatal-error report first where there is one)."""

    def __init__(self, how: str, output: str = "") -> None:
        super().__init__(f"worker process {how}" + (f"; its last output:\n{output}" if output else ""))
        self.how = how
        self.output = output


class WorkerTimedOut(WorkerError):
    """The worker did not answer before the deadline; it is still running until killed."""


class WorkerProcess:
    """One child process running ``python -m <module> <args…>``, started at construction."""

    def __init__(self, module: str, args: Sequence[str] = (), env: Mapping[str, str] | None = None) -> None:
        # Closed in _release(), when the child is gone (it writes there until then).
        self._log: IO[bytes] = tempfile.TemporaryFile(prefix="tuner-worker-")  # noqa: SIM115
        reply_r, reply_w = os.pipe()
        child_env = dict(os.environ if env is None else env)
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", module, str(reply_w), *args],
                stdin=subprocess.PIPE,
                stdout=self._log,
                stderr=self._log,
                env=child_env,
                pass_fds=(reply_w,),
                start_new_session=True,  # a kill reaches the compilers it spawned, too
            )
        finally:
            os.close(reply_w)
        self._replies = reply_r
        self._buffer = b""

    @property
    def pid(self) -> int:
        return self._proc.pid

    def alive(self) -> bool:
        return self._proc.poll() is None

    def send(self, message: object) -> None:
        """Send one message; WorkerDied if the child is gone."""
        data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        stdin = self._proc.stdin
        try:
            if stdin is None:
                raise BrokenPipeError
            stdin.write(_HEADER.pack(len(data)) + data)
            stdin.flush()
        except (BrokenPipeError, OSError):
            raise self._died() from None

    def receive(self, timeout_s: float) -> Any:
        """The next message; WorkerTimedOut after ``timeout_s`` without one, WorkerDied if the child exits."""
        deadline = time.monotonic() + max(timeout_s, 0.0)
        header = self._read_exact(_HEADER.size, deadline)
        (length,) = _HEADER.unpack(header)
        return pickle.loads(self._read_exact(length, deadline))

    def _read_exact(self, n: int, deadline: float) -> bytes:
        while len(self._buffer) < n:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise WorkerTimedOut(f"no answer from worker {self.pid} in time")
            ready, _, _ = select.select([self._replies], [], [], remaining)
            if not ready:
                continue
            chunk = os.read(self._replies, max(n - len(self._buffer), 1 << 16))
            if not chunk:
                raise self._died()
            self._buffer += chunk
        data, self._buffer = self._buffer[:n], self._buffer[n:]
        return data

    def clear_log(self) -> None:
        """Forget what the child printed so far (the next crash report shows only what follows). Call it
        while the child is idle: parent and child share the log's file offset, which this resets."""
        self._log.truncate(0)
        self._log.seek(0)

    def log_tail(self, max_lines: int = 8, max_chars: int = 1000) -> str:
        """The informative end of what the child printed: from its last fatal-error report (faulthandler's
        "Fatal Python error", most recent call first) if there is one, else its last lines."""
        self._log.flush()
        self._log.seek(0, os.SEEK_END)
        size = self._log.tell()
        self._log.seek(max(0, size - 64 * 1024))
        text = self._log.read().decode("utf-8", errors="replace")
        lines = [line.rstrip() for line in text.splitlines() if line.strip()]
        fatal = [i for i, line in enumerate(lines) if line.startswith("Fatal Python error")]
        if fatal:
            lines = [line for line in lines[fatal[-1] :] if not line.startswith("Extension modules")]
            lines = lines[:max_lines]
        else:
            lines = lines[-max_lines:]
        return "\n".join(lines)[:max_chars]

    def _died(self) -> WorkerDied:
        try:
            code = self._proc.wait(timeout=5.0)
        except subprocess.TimeoutExpired:
            return WorkerDied("closed its reply pipe but did not exit", self.log_tail())
        if code < 0:
            try:
                how = f"was killed by {signal.Signals(-code).name}"
            except ValueError:
                how = f"was killed by signal {-code}"
        else:
            how = f"exited with code {code}"
        return WorkerDied(how, self.log_tail())

    def terminate_group(self) -> None:
        """SIGKILL the child and its session without waiting (safe from another thread than the reader's:
        the reader then sees the child die)."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self._proc.pid, signal.SIGKILL)

    def kill(self) -> None:
        """Kill the child and everything in its session now, and release the pipes."""
        if self.alive():
            try:
                os.killpg(self._proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                self._proc.kill()
        self._proc.wait()
        self._release()

    def close(self, grace_s: float = 5.0) -> None:
        """Ask the child to exit (end of its stdin); kill it if it has not exited after ``grace_s``."""
        if self._proc.stdin is not None and not self._proc.stdin.closed:
            with contextlib.suppress(OSError):
                self._proc.stdin.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._proc.wait(timeout=grace_s)
        self.kill()

    def _release(self) -> None:
        if self._replies >= 0:
            os.close(self._replies)
            self._replies = -1
        if self._proc.stdin is not None and not self._proc.stdin.closed:
            with contextlib.suppress(OSError):
                self._proc.stdin.close()
        self._log.close()


def read_frame(stream: IO[bytes]) -> Any:
    """Child side: the next message from ``stream``, or None at end of input."""
    header = stream.read(_HEADER.size)
    if len(header) < _HEADER.size:
        return None
    (length,) = _HEADER.unpack(header)
    data = stream.read(length)
    if len(data) < length:
        return None
    return pickle.loads(data)


def write_frame(fd: int, message: object) -> None:
    """Child side: send one message on the reply pipe."""
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    view = memoryview(_HEADER.pack(len(data)) + data)
    while view:
        written = os.write(fd, view)
        view = view[written:]
