"""The compile cache: keys, memory and disk layers, negative entries, concurrent writers."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tuner.frozen import Config, Shape
from tuner.measure.compile_cache import CacheKey, CompileCache, CompileFailed, kernel_cache_dir
from tuner.settings import data_home

KEY = CacheKey(
    "tmpl", "1", Config(a=1, b="x"), Shape(S=64, dtype="float16"), "tilelang", {"compiler": "nvcc 13"}
)


class _Broken(Exception):
    """What a compiler raises in these tests."""


def _is_broken(exc: BaseException) -> bool:
    return isinstance(exc, _Broken)


class _Compiler:
    """A compile function that counts its calls and records the artifact directory it was given."""

    def __init__(self, result: object = "kernel", error: Exception | None = None, delay: float = 0.0) -> None:
        self.calls = 0
        self.dirs: list[Path] = []
        self.result, self.error, self.delay = result, error, delay

    def __call__(self, artifact_dir: Path) -> object:
        self.calls += 1
        self.dirs.append(artifact_dir)
        time.sleep(self.delay)
        if self.error is not None:
            raise self.error
        return self.result


def test_home_and_key_digest(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("TUNER_HOME", raising=False)
    monkeypatch.delenv("XDG_DATA_HOME", raising=False)
    assert data_home() == Path("~/.local/share/tuner").expanduser()
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))  # the same home as the default store's
    assert kernel_cache_dir() == tmp_path / "xdg" / "tuner" / "kernel-cache"
    monkeypatch.setenv("TUNER_HOME", str(tmp_path))
    assert kernel_cache_dir() == tmp_path / "kernel-cache"
    assert CompileCache().root == tmp_path / "kernel-cache"
    same = CacheKey(
        "tmpl", "1", Config(b="x", a=1), Shape(dtype="float16", S=64), "tilelang", {"compiler": "nvcc 13"}
    )
    assert same.digest() == KEY.digest()
    variants = [
        CacheKey("other", "1", KEY.config, KEY.shape, "tilelang", KEY.toolchain),
        CacheKey("tmpl", "2", KEY.config, KEY.shape, "tilelang", KEY.toolchain),
        CacheKey("tmpl", "1", KEY.config.replace(a=2), KEY.shape, "tilelang", KEY.toolchain),
        CacheKey("tmpl", "1", KEY.config, KEY.shape.replace(S=128), "tilelang", KEY.toolchain),
        CacheKey("tmpl", "1", KEY.config, KEY.shape, "triton", KEY.toolchain),
        CacheKey("tmpl", "1", KEY.config, KEY.shape, "tilelang", {"compiler": "nvcc 12"}),
    ]
    digests = {k.digest() for k in variants} | {KEY.digest()}
    assert len(digests) == len(variants) + 1
    assert variants[-1].toolchain_digest() != KEY.toolchain_digest()


def test_miss_then_memory_hit_then_disk_record(tmp_path: Path) -> None:
    cache = CompileCache(tmp_path)
    compiler = _Compiler()
    assert cache.entry(KEY) is None
    assert cache.get_or_compile(KEY, compiler, is_compile_error=_is_broken) == "kernel"
    assert cache.get_or_compile(KEY, compiler, is_compile_error=_is_broken) == "kernel"
    assert compiler.calls == 1 and cache.stats == {"memory_hits": 1, "failed_hits": 0, "compiles": 1}
    assert compiler.dirs[0] == tmp_path / "tilelang" / KEY.toolchain_digest() and compiler.dirs[0].is_dir()
    entry = cache.entry(KEY)
    assert entry is not None and entry.status == "ok" and entry.error is None
    assert entry.key == KEY.to_dict()
    # another process (a new cache on the same root) compiles again: the backend's own cache has the artifact
    other = CompileCache(tmp_path)
    assert other.get_or_compile(KEY, compiler, is_compile_error=_is_broken) == "kernel"
    assert compiler.calls == 2
    cache.forget_memory()
    cache.get_or_compile(KEY, compiler, is_compile_error=_is_broken)
    assert compiler.calls == 3


def test_compile_errors_are_recorded_and_answered_without_compiling(tmp_path: Path) -> None:
    cache = CompileCache(tmp_path)
    failing = _Compiler(error=_Broken("layout inference failed " + "x" * 20000))
    with pytest.raises(CompileFailed) as first:
        cache.get_or_compile(KEY, failing, is_compile_error=_is_broken)
    assert not first.value.cached and "layout inference failed" in first.value.error
    assert len(first.value.error) < 9000  # long compiler output is cut
    entry = cache.entry(KEY)
    assert entry is not None and entry.status == "compile_error"
    for c in (cache, CompileCache(tmp_path)):  # same process, and a new one
        with pytest.raises(CompileFailed) as again:
            c.get_or_compile(KEY, failing, is_compile_error=_is_broken)
        assert again.value.cached and again.value.error == first.value.error
    assert failing.calls == 1 and cache.stats["failed_hits"] == 1


@pytest.mark.parametrize("error", [ValueError("not a compile error"), _Broken("nvcc timed out after 600 s")])
def test_other_and_transient_errors_propagate_unrecorded(tmp_path: Path, error: Exception) -> None:
    cache = CompileCache(tmp_path)
    with pytest.raises(type(error)):
        cache.get_or_compile(KEY, _Compiler(error=error), is_compile_error=_is_broken)
    assert cache.entry(KEY) is None
    assert cache.get_or_compile(KEY, _Compiler(), is_compile_error=_is_broken) == "kernel"


def test_threads_compile_one_key_once(tmp_path: Path) -> None:
    cache = CompileCache(tmp_path)
    compiler = _Compiler(result=object(), delay=0.2)
    results: list[object] = []
    threads = [
        threading.Thread(
            target=lambda: results.append(cache.get_or_compile(KEY, compiler, is_compile_error=_is_broken))
        )
        for _ in range(8)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert compiler.calls == 1 and len(results) == 8 and all(r is compiler.result for r in results)


_WRITER = """
import sys
from tuner.measure.compile_cache import CacheKey, CompileCache
from tuner.frozen import Config, Shape
key = CacheKey(
    "tmpl", "1", Config(a=1, b="x"), Shape(S=64, dtype="float16"), "tilelang", {"compiler": "nvcc 13"}
)
cache = CompileCache(sys.argv[1])
for i in range(150):
    cache._record(key, "ok", None, float(sys.argv[2]) + i)
"""


def test_concurrent_writers_never_expose_a_partial_entry(tmp_path: Path) -> None:
    """Four processes rewrite one entry while this one reads it: every read is a whole record."""
    cache = CompileCache(tmp_path)
    path = cache.entry_path(KEY)
    writers = [
        subprocess.Popen([sys.executable, "-c", _WRITER, str(tmp_path), str(1000 * w)], cwd=Path.cwd())
        for w in range(4)
    ]
    reads = 0
    while any(w.poll() is None for w in writers):
        if path.exists():
            try:
                text = path.read_text()
            except FileNotFoundError:
                continue
            record = json.loads(text)  # a partial file would not parse
            assert record["status"] == "ok" and record["key"] == KEY.to_dict()
            reads += 1
    assert all(w.wait() == 0 for w in writers)
    assert reads > 0
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name]  # no temporary files left behind
    entry = cache.entry(KEY)
    assert entry is not None and entry.compile_s % 1000 == 149  # some writer's last record
