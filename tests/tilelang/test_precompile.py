"""precompile(): parallel builds in spawned processes fill the cache that later builds load from."""

from __future__ import annotations

from pathlib import Path

import pytest

from tuner.measure.compile_cache import CompileCache, CompileFailed, precompile, set_default_cache


def _tilelang_kernels(cache: CompileCache, template, config, shape) -> set[Path]:  # type: ignore[no-untyped-def]
    """The compiled-kernel directories in TileLang's cache for this (template, toolchain)."""
    from tuner.kernels.tilelang_toolchain import resolve_toolchain
    from tuner.measure.compile_cache import CacheKey

    key = CacheKey(
        template.name, template.version, config, shape, template.backend, resolve_toolchain().fingerprint()
    )
    return set(cache.artifact_dir(key).glob("*/*/kernels/*"))


def test_parallel_precompile_then_builds_load_from_disk(cpu_template, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    shape = cpu_template.reduced(cpu_template.workload("mamba2-780m-b1-s4k-dt-bias"))
    default = cpu_template.space().default
    good = [default, default.replace(layout="hq", pad=4)]
    invalid = default.replace(rows=8)
    cache = CompileCache(tmp_path / "kernel-cache")
    results = precompile(cpu_template, [*good, invalid, good[0]], shape, workers=2, cache=cache)
    assert list(results) == [*good, invalid]  # duplicates built once, order kept
    assert all(results[c] is None for c in good), results
    assert results[invalid] is not None and results[invalid].startswith("ConfigError")
    kernels = _tilelang_kernels(cache, cpu_template, default, shape)
    assert len(kernels) == len(good)
    parent = CompileCache(cache.root)
    set_default_cache(parent)
    try:
        for config in good:
            entry = parent.entry(_key(cpu_template, config, shape))
            assert entry is not None and entry.status == "ok"
            fn = cpu_template.build(config, shape)  # traced here, loaded from TileLang's disk cache
            inputs = cpu_template.make_inputs(shape, "cpu", 0)
            outputs = cpu_template.allocate_outputs(shape, inputs)
            fn(inputs, outputs)
        assert _tilelang_kernels(cache, cpu_template, default, shape) == kernels  # nothing compiled anew
    finally:
        set_default_cache(None)


def test_serial_precompile_records_compile_errors(cpu_template, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    shape = cpu_template.reduced(cpu_template.workload("mamba2-1p3b-b8-s2k"))  # bfloat16: no C type
    config = cpu_template.space().default
    cache = CompileCache(tmp_path / "kernel-cache")
    results = precompile(cpu_template, [config], shape, workers=1, cache=cache)
    assert results[config] is not None and "bfloat16" in results[config]
    later = CompileCache(cache.root)
    set_default_cache(later)
    try:
        with pytest.raises(CompileFailed) as info:
            cpu_template.build(config, shape)
        assert info.value.cached and later.stats["compiles"] == 0
    finally:
        set_default_cache(None)


def _key(template, config, shape):  # type: ignore[no-untyped-def]
    from tuner.kernels.tilelang_toolchain import resolve_toolchain
    from tuner.measure.compile_cache import CacheKey

    return CacheKey(
        template.name, template.version, config, shape, template.backend, resolve_toolchain().fingerprint()
    )


def test_a_template_build_points_tilelang_cache_only_while_it_compiles(cpu_template, tmp_path: Path,
                                                                        monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A TileLang template's build keeps its kernels in its own artifact folder, then points TileLang back: a
    library compiled later in the same process (a comparator built in the compile pool) must land where the
    measurer's processes look for it, not in the last config's folder."""
    import os

    import tilelang

    monkeypatch.setenv("TILELANG_CACHE_DIR", str(tmp_path / "users-cache"))
    before = str(tilelang.env.TILELANG_CACHE_DIR)
    set_default_cache(CompileCache(tmp_path / "kernel-cache"))
    try:
        shape = cpu_template.reduced(cpu_template.workload("mamba2-780m-b1-s4k-dt-bias"))
        cpu_template.build(cpu_template.space().default, shape)
    finally:
        set_default_cache(None)
    assert os.environ["TILELANG_CACHE_DIR"] == str(tmp_path / "users-cache")
    assert str(tilelang.env.TILELANG_CACHE_DIR) == before


def test_tilelang_cache_pointing_is_undone_when_it_fails_and_in_order_when_nested(tmp_path: Path,
                                                                                monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import os

    import tilelang

    from tuner.kernels.tilelang_toolchain import tilelang_cache_at

    monkeypatch.setenv("TILELANG_CACHE_DIR", str(tmp_path / "users-cache"))
    before = str(tilelang.env.TILELANG_CACHE_DIR)
    (tmp_path / "a-file").write_text("")
    with pytest.raises(OSError), tilelang_cache_at(tmp_path / "a-file" / "sub"):  # its folders cannot be made
        pass
    assert os.environ["TILELANG_CACHE_DIR"] == str(tmp_path / "users-cache")
    assert str(tilelang.env.TILELANG_CACHE_DIR) == before
    with tilelang_cache_at(tmp_path / "outer"):
        with tilelang_cache_at(tmp_path / "inner"):
            assert os.environ["TILELANG_CACHE_DIR"] == str(tmp_path / "inner")
        assert str(tilelang.env.TILELANG_CACHE_DIR) == str(tmp_path / "outer")
    assert str(tilelang.env.TILELANG_CACHE_DIR) == before
