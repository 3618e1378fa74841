"""Mamba2 chunk cumulative sum, forward, as a Triton template (the operator: kernels/mamba2_chunk_cumsum/op.py).

The template is stateless; :meth:`build` returns a closure over one compiled launch (grid fixed at build).
Data paths, tiling and the scan formulation are parameters (search_spaces/mamba2_chunk_cumsum.yaml).
"""

from __future__ import annotations

from tuner.frozen import Config, Shape
from tuner.kernels.mamba2_chunk_cumsum import spec
from tuner.kernels.mamba2_chunk_cumsum.op import Mamba2ChunkCumsumOp
from tuner.settings import triton_interpreted
from tuner.template import Kernel, KernelTemplate

INTERPRETER_SMS = 4  # "SM count" for persistent grids under the Triton interpreter


class Mamba2ChunkCumsum(Mamba2ChunkCumsumOp, KernelTemplate):
    """Mamba2 ``_chunk_cumsum_fwd`` with fp32 dA_cumsum and dt_out in the workload's dtype, in Triton."""

    SPEC = spec.TRITON

    def build(self, config: Config, shape: Shape) -> Kernel:
        """A launch of the Triton kernel for (config, shape); raises ConfigError/ShapeError on bad input."""
        from tuner.kernels.mamba2_chunk_cumsum.triton_launch import make_launch

        self.check_shape(shape)
        return make_launch(config, shape, sm_count=_sm_count())


def _sm_count() -> int:
    """Multiprocessors of the current CUDA device, or a small fixed count under the interpreter / on CPU."""
    if triton_interpreted():
        return INTERPRETER_SMS
    import torch

    if not torch.cuda.is_available():
        return INTERPRETER_SMS
    return int(torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count)
