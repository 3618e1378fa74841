"""The kernel template contract: what tuner needs to know about a parameterised kernel.

A template knows its math (inputs, a PyTorch reference, outputs and their error bounds), how to build a
runnable kernel from a config and a shape, its named workloads and its roofline figures. It knows nothing
of Optuna, the store or HTTP. Templates are stateless and thread-safe; ``build`` may compile.

Kernel calling convention: a built kernel is ``fn(inputs, outputs) -> None``; it reads the input tensors
and writes *every* output tensor in place (outputs are allocated by :meth:`KernelTemplate.allocate_outputs`
and poisoned with NaN by the measurer before a checked run, so an output left unwritten is caught).
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar, Literal

from tuner.errors import ShapeError, UnknownWorkloadError
from tuner.frozen import Config, Scalar, Shape

if TYPE_CHECKING:
    import torch

    from tuner.space import SearchSpace

Backend = Literal["triton", "tilelang"]
Tensors = Mapping[str, "torch.Tensor"]
Kernel = Callable[[Tensors, Tensors], None]

SEARCH_SPACES_DIR = Path(__file__).resolve().parent / "search_spaces"  # package data (the repository's search_spaces/)

DIM_TYPES: dict[str, type] = {"int": int, "bool": bool, "str": str}


@dataclass(frozen=True)
class Dim:
    """One entry of a template's shape: a dimension, dtype or flag.

    ``kind`` is ``int``, ``bool`` or ``str`` (dtypes are str, e.g. ``bfloat16``); ``default`` of None means
    the dim is required; ``choices`` restricts str dims; ``minimum`` restricts int dims.
    """

    name: str
    kind: Literal["int", "bool", "str"] = "int"
    default: Scalar | None = None
    choices: tuple[str, ...] | None = None
    minimum: int = 1
    doc: str = ""

    def coerce(self, raw: object) -> Scalar:
        """Turn a raw value (from a CLI string, JSON or Python) into this dim's type; ShapeError if not."""
        if self.kind == "int":
            if isinstance(raw, bool):
                raise ShapeError(f"shape dim {self.name}: expected an integer, got {raw!r}")
            try:
                value = int(str(raw), 0) if isinstance(raw, str) else int(raw)  # type: ignore[call-overload]
            except (TypeError, ValueError):
                raise ShapeError(f"shape dim {self.name}: expected an integer, got {raw!r}") from None
            if isinstance(raw, float) and raw != value:
                raise ShapeError(f"shape dim {self.name}: expected an integer, got {raw!r}")
            if value < self.minimum:
                raise ShapeError(f"shape dim {self.name}: must be >= {self.minimum}, got {value}")
            return value
        if self.kind == "bool":
            if isinstance(raw, bool):
                return raw
            text = str(raw).strip().lower()
            if text in {"1", "true", "yes", "on"}:
                return True
            if text in {"0", "false", "no", "off"}:
                return False
            raise ShapeError(f"shape dim {self.name}: expected true/false, got {raw!r}")
        value_s = str(raw)
        if self.choices is not None and value_s not in self.choices:
            raise ShapeError(f"shape dim {self.name}: expected one of {', '.join(self.choices)}, got {raw!r}")
        return value_s


@dataclass(frozen=True)
class OutputSpec:
    """One output of the kernel and its correctness bound: relative L2 error ``‖out−ref‖/‖ref‖ ≤ rtol``."""

    name: str
    rtol: float = 1e-3


@dataclass(frozen=True)
class Workload:
    """A named shape users tune for (e.g. a model's layer at a batch and sequence length)."""

    name: str
    shape: Mapping[str, Scalar]
    doc: str = ""


@dataclass(frozen=True)
class Comparator:
    """Another implementation of the same operator, measured under the same contract (e.g. mamba_ssm).

    ``build(shape)`` returns a kernel with the template's calling convention; ``unavailable()`` returns
    a reason string when it cannot run here (library not importable, shape unsupported), else None.
    Comparators of one ``group`` are alternatives of one line in reports (e.g. a library's fixed configs:
    the report shows the best of the group); a comparator without a group is a line of its own.
    ``gated`` False times the comparator even when its outputs miss the template's error bounds (its errors
    are stored with its measurement): for a baseline whose own accuracy is part of the comparison.
    """

    name: str
    doc: str
    build: Callable[[Shape], Kernel]
    unavailable: Callable[[Shape], str | None] = field(default=lambda shape: None)
    group: str | None = None
    gated: bool = True

    @property
    def line(self) -> str:
        return self.group or self.name


class KernelTemplate(abc.ABC):
    """Base class of every kernel template. Subclasses set the class attributes and implement the methods.

    Raises: :class:`ShapeError` from :meth:`make_shape` / :meth:`check_shape` for bad shapes; ``build`` may
    raise anything (the measurer turns it into COMPILE_ERROR); kernels may raise or crash (RUNTIME_ERROR).
    """

    name: ClassVar[str]
    version: ClassVar[str]
    backend: ClassVar[Backend]
    dims: ClassVar[tuple[Dim, ...]]
    outputs: ClassVar[tuple[OutputSpec, ...]]
    workloads: ClassVar[tuple[Workload, ...]] = ()
    doc: ClassVar[str] = ""
    # Builds are slow and land in a cross-process cache (tuner.measure.compile_cache, or the backend's own): the
    # driver then asks trials in batches and precompiles each batch in parallel across the host's cores
    # (:meth:`precompile`) before measuring.
    compile_in_parallel: ClassVar[bool] = False

    # -- shapes ------------------------------------------------------------------------------------
    def make_shape(self, raw: Mapping[str, object]) -> Shape:
        """Validate and complete a raw shape: coerce types, fill defaults, reject unknown dims."""
        known = {d.name: d for d in self.dims}
        unknown = sorted(set(raw) - set(known))
        if unknown:
            raise ShapeError(
                f"unknown shape dim(s) {', '.join(unknown)} for {self.name}; known: {', '.join(known)}"
            )
        values: dict[str, Scalar] = {}
        for dim in self.dims:
            if dim.name in raw:
                values[dim.name] = dim.coerce(raw[dim.name])
            elif dim.default is not None:
                values[dim.name] = dim.default
            else:
                raise ShapeError(f"shape dim {dim.name} is required for {self.name}")
        shape = Shape(values)
        self.check_shape(shape)
        return shape

    def check_shape(self, shape: Shape) -> None:
        """Raise ShapeError when dims are individually valid but inconsistent. Default: accept."""
        return None

    def workload(self, name: str) -> Shape:
        for w in self.workloads:
            if w.name == name:
                return self.make_shape(w.shape)
        known = ", ".join(w.name for w in self.workloads) or "none"
        raise UnknownWorkloadError(f"unknown workload {name!r} for {self.name}; known: {known}")

    def workload_name(self, shape: Shape) -> str | None:
        """The name of the workload whose shape this is, if any."""
        for w in self.workloads:
            if self.make_shape(w.shape) == shape:
                return w.name
        return None

    def reduced(self, shape: Shape) -> Shape:
        """A smaller shape of the same kind, for tests on the CPU (interpreter). Default: the shape itself."""
        return shape

    # -- search space ------------------------------------------------------------------------------
    @property
    def space_path(self) -> Path:
        return SEARCH_SPACES_DIR / f"{self.name}.yaml"

    def space(self) -> SearchSpace:
        """The template's search space, loaded and validated from ``search_spaces/<name>.yaml``."""
        from tuner.errors import SearchSpaceError
        from tuner.space import load_space

        space = load_space(self.space_path, shape_dims=tuple(d.name for d in self.dims))
        if space.template != self.name:
            raise SearchSpaceError(f"{self.space_path}: template: {space.template!r} is not {self.name!r}")
        return space

    # -- math --------------------------------------------------------------------------------------
    @abc.abstractmethod
    def make_inputs(self, shape: Shape, device: str, seed: int) -> dict[str, torch.Tensor]:
        """Fresh random inputs (never all zeros) on ``device``, reproducible from ``seed``."""

    @abc.abstractmethod
    def reference(self, shape: Shape, inputs: Tensors) -> dict[str, torch.Tensor]:
        """Expected outputs computed in float32/float64 with plain PyTorch; one entry per output spec."""

    def output_specs(self, shape: Shape) -> tuple[OutputSpec, ...]:
        """The outputs and their error bounds for ``shape`` (bounds may depend on its dtypes).

        Default: the class-level :attr:`outputs`. Checkers should call this rather than read ``outputs``.
        """
        return self.outputs

    @abc.abstractmethod
    def allocate_outputs(self, shape: Shape, inputs: Tensors) -> dict[str, torch.Tensor]:
        """Uninitialised output tensors in the kernel's output dtypes, on the inputs' device."""

    @abc.abstractmethod
    def build(self, config: Config, shape: Shape) -> Kernel:
        """A runnable kernel for (config, shape). May compile; may raise (→ COMPILE_ERROR)."""

    def precompile(self, config: Config, shape: Shape) -> None:
        """Compile (config, shape) into a cache that later builds in other processes load from; raises as
        :meth:`build`. Default: :meth:`build`, for templates whose build compiles. Templates that compile
        lazily on first launch (Triton) override it to launch once."""
        self.build(config, shape)

    def comparators(self) -> tuple[Comparator, ...]:
        """Other implementations to measure beside the template (none by default)."""
        return ()

    def is_compile_error(self, exc: BaseException) -> bool:
        """Whether an exception raised at a kernel's first launch is a compile error of the config.

        Backends compile lazily (Triton compiles at the first launch), so the measurer asks the template.
        """
        from tuner.frontends import is_compile_error

        return is_compile_error(self.backend, exc)

    # -- roofline ----------------------------------------------------------------------------------
    @abc.abstractmethod
    def bytes_moved(self, shape: Shape) -> int:
        """Minimum bytes read + written from device memory by any correct implementation."""

    def flops(self, shape: Shape) -> int:
        """Floating-point operations of the operator (0 where it is memory-bound and not worth counting)."""
        return 0
