"""Mamba2 chunk cumsum forward as a TileLang template (``mamba2_chunk_cumsum_tilelang``).

Same operator and contract as the Triton template ``mamba2_chunk_cumsum`` (see
kernels/mamba2_chunk_cumsum/op.py); the kernel family is described in
kernels/mamba2_chunk_cumsum/tilelang_program.py and its search space in
search_spaces/mamba2_chunk_cumsum_tilelang.yaml.

``build`` compiles (through tuner/measure/compile_cache.py) for the target of kernels/tilelang_toolchain.py: CUDA for
the visible GPU, or TileLang's C target on a CPU-only host (bfloat16 outputs do not compile there). The
returned kernel launches the compiled program on the given tensors on torch's current stream: no
allocation, copy or host synchronisation per call.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from tuner.frozen import Config, Shape
from tuner.kernels.mamba2_chunk_cumsum import spec
from tuner.kernels.mamba2_chunk_cumsum.op import Mamba2ChunkCumsumOp
from tuner.measure.compile_cache import CacheKey, default_cache
from tuner.template import Kernel, KernelTemplate, Tensors

if TYPE_CHECKING:
    from pathlib import Path

    from tuner.kernels.mamba2_chunk_cumsum.tilelang_program import CumsumPlan
    from tuner.kernels.tilelang_toolchain import TileLangToolchain


class Mamba2ChunkCumsumTileLang(Mamba2ChunkCumsumOp, KernelTemplate):
    """TileLang kernels for the Mamba2 chunk cumsum: one CTA per (batch, chunk group, head block)."""

    SPEC = spec.TILELANG
    compile_in_parallel: ClassVar[bool] = True

    def build(self, config: Config, shape: Shape) -> Kernel:
        """Compile (or load) the kernel of (config, shape) and wrap it as ``fn(inputs, outputs)``.

        Raises ShapeError/ConfigError for a bad shape or a config outside the family's rules (before any
        compile), :class:`tuner.measure.compile_cache.CompileFailed` when the program does not compile.
        """
        from tuner.kernels.tilelang_toolchain import resolve_toolchain

        compiled, plan = self.compile(config, shape)
        return _launcher(compiled, plan, resolve_toolchain().device_type)

    def compile(self, config: Config, shape: Shape) -> tuple[Any, CumsumPlan]:
        """The compiled TileLang kernel (``tilelang.JITKernel``: ``get_kernel_source()`` shows the code) and
        its plan, through the process's compile cache. Raises as :meth:`build`."""
        from tuner.kernels.mamba2_chunk_cumsum.tilelang_program import plan_for
        from tuner.kernels.tilelang_toolchain import resolve_toolchain

        self.check_shape(shape)
        plan = plan_for(config, shape)
        toolchain = resolve_toolchain()
        key = CacheKey(self.name, self.version, config, shape, self.backend, toolchain.fingerprint())
        compiled = default_cache().get_or_compile(
            key,
            lambda artifact_dir: _compile(plan, toolchain, artifact_dir),
            is_compile_error=self.is_compile_error,
        )
        return compiled, plan


def _compile(plan: CumsumPlan, toolchain: TileLangToolchain, artifact_dir: Path) -> Any:
    import tilelang

    from tuner.kernels.mamba2_chunk_cumsum.tilelang_program import make_program
    from tuner.kernels.tilelang_toolchain import tilelang_cache_at

    with tilelang_cache_at(artifact_dir):
        return tilelang.compile(
            make_program(plan, cuda=toolchain.kind == "cuda"),
            target=toolchain.target(),
            execution_backend=toolchain.execution_backend,
            pass_configs={**toolchain.pass_configs(fast_math=plan.fast_math), **_loop_pass_configs(plan)},
        )


def _launcher(compiled: Any, plan: CumsumPlan, device_type: str) -> Kernel:
    """``fn(inputs, outputs)``: the compiled kernel on the caller's tensors, in the program's order."""
    names = ("dt", "A", "dt_bias", "dt_limit") if plan.has_bias else ("dt", "A", "dt_limit")

    def launch(inputs: Tensors, outputs: Tensors) -> None:
        dt = inputs["dt"]
        if dt.device.type != device_type:  # a CPU-compiled kernel must never see device pointers
            raise RuntimeError(f"kernel compiled for {device_type} tensors, got {dt.device.type} tensors")
        compiled(*[inputs[n] for n in names], outputs["dt_out"], outputs["dA_cumsum"])

    return launch


def _loop_pass_configs(plan: CumsumPlan) -> dict[str, bool]:
    """The looping kernel (persist > 1) pipelines its raw-tile copies with cp.async (its copy is marked
    ``disable_tma``): TileLang would otherwise warp-specialise the loop (a producer warp group and
    setmaxnreg, which need sm_90a)."""
    if plan.persist == 1:
        return {}
    return {"tl.disable_warp_specialized": True}
