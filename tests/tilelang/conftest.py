"""Fixtures of the TileLang template tests: a private TUNER_HOME and the C target for CPU builds."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tuner.measure.compile_cache import CompileCache, set_default_cache


@pytest.fixture(scope="session")
def session_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """One TUNER_HOME for the session (kernels compiled once are shared by the tests), TileLang's C target."""
    home = tmp_path_factory.mktemp("tuner-home")
    mp = pytest.MonkeyPatch()
    mp.setenv("TUNER_HOME", str(home))
    mp.setenv("TUNER_TILELANG_TARGET", "c")
    set_default_cache(None)
    yield home
    set_default_cache(None)
    mp.undo()


@pytest.fixture
def cpu_template(session_home: Path):  # type: ignore[no-untyped-def]
    from tuner.kernels.mamba2_chunk_cumsum.tilelang_template import Mamba2ChunkCumsumTileLang

    return Mamba2ChunkCumsumTileLang()


@pytest.fixture
def fresh_cache(tmp_path: Path) -> Iterator[CompileCache]:
    """An empty cache installed as the process default for one test."""
    cache = CompileCache(tmp_path / "kernel-cache")
    set_default_cache(cache)
    yield cache
    set_default_cache(None)
