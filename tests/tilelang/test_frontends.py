"""is_compile_error('tilelang', …) on real TileLang failures: lowering, codegen, C++ compile, launch."""

from __future__ import annotations

import pytest
import torch

from tuner.frontends import is_compile_error
from tuner.kernels.mamba2_chunk_cumsum.tilelang_program import CumsumPlan, make_program
from tuner.measure.compile_cache import CompileFailed

BASE = dict(
    B=1, S=128, H=8, Q=64, has_bias=False, softplus=True, dtype="float16",
    block_h=8, rows=1, threads=128, scan="twolevel", pad=1, vec=1, layout="qh",
)  # fmt: skip
NO_VECTORS = {"tirx.disable_vectorize": True}


def _compile(plan: CumsumPlan, pass_configs: dict | None = NO_VECTORS):  # type: ignore[no-untyped-def]
    import tilelang

    return tilelang.compile(
        make_program(plan, cuda=False), target="c", execution_backend="cython", pass_configs=pass_configs
    )


def _raised(fn) -> BaseException:  # type: ignore[no-untyped-def]
    with pytest.raises(Exception) as info:
        fn()
    return info.value


@pytest.fixture(autouse=True)
def _no_tilelang_disk_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TILELANG_DISABLE_CACHE", "1")  # these compiles go straight to TileLang


def test_lowering_and_codegen_errors_are_compile_errors() -> None:
    import tilelang.language as T

    @T.prim_func
    def thread_indexed(x: T.Tensor((64,), "float32")):
        with T.Kernel(1, threads=64):
            tx = T.get_thread_binding()
            x[tx] = 1.0

    import tilelang

    lowering = _raised(lambda: tilelang.compile(thread_indexed, target="c", execution_backend="cython"))
    assert "threads" in str(lowering) or "thread" in str(lowering)
    assert is_compile_error("tilelang", lowering)
    codegen = _raised(lambda: _compile(CumsumPlan(**{**BASE, "dtype": "bfloat16"})))
    assert "bfloat16" in str(codegen) and is_compile_error("tilelang", codegen)


def test_host_compiler_failure_is_a_compile_error() -> None:
    """The C codegen prints a half4-from-float4 conversion g++ rejects, once vectorisation is on."""
    failure = _raised(lambda: _compile(CumsumPlan(**{**BASE, "layout": "hq", "vec": 4, "pad": 4}), None))
    assert type(failure) is RuntimeError and "Compilation Failed" in str(failure)
    assert is_compile_error("tilelang", failure)


def test_launch_errors_and_foreign_errors_are_not_compile_errors() -> None:
    kernel = _compile(CumsumPlan(**BASE))
    good = [torch.zeros(1, 128, 8), torch.zeros(8), torch.zeros(2)]
    outs = [torch.zeros(1, 8, 2, 64, dtype=torch.float16), torch.zeros(1, 8, 2, 64)]
    kernel(*good, *outs)
    wrong_shape = _raised(lambda: kernel(torch.zeros(1, 128, 4), *good[1:], *outs))
    wrong_dtype = _raised(lambda: kernel(*good, outs[1], outs[1]))
    for launch_error in (wrong_shape, wrong_dtype):
        assert not is_compile_error("tilelang", launch_error), launch_error
    assert not is_compile_error("tilelang", ValueError("unrelated"))
    assert is_compile_error("tilelang", CompileFailed("recorded earlier", cached=True))
    assert is_compile_error("tilelang", RuntimeError("CUDA error: too many resources requested for launch"))
