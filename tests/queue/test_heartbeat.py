"""The worker's heartbeat thread outlives an unexpected error in one beat (it ended silently: the lease then
lapsed, the worker was reaped and went on claiming with an expired lease)."""

from __future__ import annotations

import time
from typing import Any

from tests.fixtures.processes import wait_for
from tuner.driver.heartbeat import Heartbeat
from tuner.store.memory import MemoryStore


class _OnceBroken(MemoryStore):
    """The in-memory store whose first heartbeat raises an error that is not the store's (a bug)."""

    def __init__(self) -> None:
        super().__init__()
        self.beats = 0

    def heartbeat(self, **kw: Any) -> bool:
        self.beats += 1
        if self.beats == 1:
            raise RuntimeError("injected: not a store error")
        return bool(super().heartbeat(**kw))


def test_a_beat_that_raises_is_logged_and_the_next_one_renews_the_lease(caplog) -> None:  # type: ignore[no-untyped-def]
    store = _OnceBroken()
    store.register_worker(worker_id="w", host="h", pid=1, device_kind="cpu", device_name="CPU", device_index=0,
                          backends=["triton"], fingerprint_hash="f", fingerprint_json="{}", lease_s=2.0)
    lost: list[bool] = []
    beat = Heartbeat(store, "w", interval_s=0.1, lease_s=2.0, on_lost=lambda: lost.append(True))
    before = store.list_workers()[0].lease_expires_at
    beat.start()
    try:
        wait_for(lambda: store.beats >= 3, 30, "beats after the failing one")
        time.sleep(0.2)
        assert beat._thread.is_alive() and not lost
        assert store.list_workers()[0].lease_expires_at > before
    finally:
        beat.stop()
    assert "heartbeat failed" in caplog.text and "injected: not a store error" in caplog.text
