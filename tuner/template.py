"""The kernel template contract: what tuner needs to know about a parameterised kernel.

A template knows its math (inputs, a PyTorch reference, outputs and their error bounds), how to build a
runnable kernel from a config and a shape, its named workloads and its roofline figures. It knows nothing
of Optuna, the store or HTTP. Templates are stateless and thread-safe; ``build`` may compile.

Kernel calling convention: a built kernel is ``fn(inputs, outputs) -> None``; it reads the input tensors
and writes *every* output tensor in place (outputs are allocated by :meth:`KernelTemplate.allocate_outputs`
and poisoned with NaN by the measurer before a checked run, so an output left unwritten is caught). A
comparator that calls a library as its users do (a wrapper that allocates its own outputs) may instead
return its outputs as a mapping of the same names: the measurer then checks the returned tensors.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from tuner.dims import Dim, ShapeRule
from tuner.frozen import Config, Scalar, Shape
from tuner.spec import Backend, TemplateSpec, Workload, default_space_path

if TYPE_CHECKING:
    import torch

    from tuner.space import SearchSpace

__all__ = [
    "Backend",
    "Comparator",
    "Dim",
    "Kernel",
    "KernelTemplate",
    "OutputSpec",
    "TemplateSpec",
    "Tensors",
    "Workload",
]

Tensors = Mapping[str, "torch.Tensor"]
Kernel = Callable[[Tensors, Tensors], "Tensors | None"]



@dataclass(frozen=True)
class OutputSpec:
    """One output of the kernel and its correctness bound: relative L2 error ``‖out−ref‖/‖ref‖ ≤ rtol``."""

    name: str
    rtol: float = 1e-3


@dataclass(frozen=True)
class Comparator:
    """Another implementation of the same operator, measured under the same contract (e.g. mamba_ssm).

    ``build(shape)`` returns a kernel with the template's calling convention; ``unavailable()`` returns
    a reason string when it cannot run here (library not importable, shape unsupported), else None.
    Comparators of one ``group`` are alternatives of one line in reports (e.g. a library's fixed configs:
    the report shows the best of the group); a comparator without a group is a line of its own.
    ``gated`` False times the comparator even when its outputs miss the template's error bounds (its errors
    are stored with its measurement): for a baseline whose own accuracy is part of the comparison.
    ``prebuild`` marks a library that compiles for minutes at its first call (mamba_ssm's TileLang MIMO
    backward): a final round with a compile pool builds it there first, beside the configs
    (:meth:`KernelTemplate.precompile_comparator`), not inside its measurement's timeout. Off by default:
    a pool process that runs a comparator holds a device context for the pool's life.

    A line is the library *as its users call it* unless ``variant`` says how it departs from that (e.g. the
    library's kernel launched on the template's output buffers): reports label such lines as contract
    variants. ``contract`` holds the shape dims the comparator's own contract sets differently from the
    template's (e.g. ``{"dtype": "float32"}`` for a library whose outputs are fp32): it is built, checked
    and timed on ``shape.replace(**contract)`` (inputs, reference, outputs and bounds of that shape), and its
    bytes are the template's :meth:`~KernelTemplate.bytes_moved` of that shape. ``ceiling`` marks a kernel
    that only moves the template's minimum bytes (no math): reports use it as the measured memory ceiling,
    never as a competitor.
    """

    name: str
    doc: str
    build: Callable[[Shape], Kernel]
    unavailable: Callable[[Shape], str | None] = field(default=lambda shape: None)
    group: str | None = None
    gated: bool = True
    contract: Mapping[str, Scalar] = field(default_factory=dict)
    variant: str | None = None
    ceiling: bool = False
    prebuild: bool = False

    @property
    def line(self) -> str:
        return self.group or self.name

    def contract_shape(self, shape: Shape) -> Shape:
        """The shape this comparator runs on for a template shape: ``shape`` with :attr:`contract` applied."""
        return shape.replace(**self.contract) if self.contract else shape


class KernelTemplate(abc.ABC):
    """Base class of every kernel template. Subclasses set the class attributes and implement the methods.

    Raises: :class:`ShapeError` from :meth:`make_shape` / :meth:`check_shape` for bad shapes; ``build`` may
    raise anything (the measurer turns it into COMPILE_ERROR); kernels may raise or crash (RUNTIME_ERROR).
    """

    name: ClassVar[str]
    version: ClassVar[str]
    backend: ClassVar[Backend]
    dims: ClassVar[tuple[Dim, ...]]
    # Conditions across dims (S % Q == 0…), as expressions: the export file carries them, so the client
    # rejects offline exactly the shapes the server rejects. Declare them here rather than in Python code.
    shape_rules: ClassVar[tuple[ShapeRule, ...]] = ()
    outputs: ClassVar[tuple[OutputSpec, ...]]
    workloads: ClassVar[tuple[Workload, ...]] = ()
    doc: ClassVar[str] = ""
    # Builds are slow and land in a cross-process cache (tuner.measure.compile_cache, or the backend's own): the
    # driver then asks trials in batches and precompiles each batch in parallel across the host's cores
    # (:meth:`precompile`) before measuring.
    compile_in_parallel: ClassVar[bool] = False
    # The spec of a built-in template (tuner.spec): name, version, backend, dims, workloads and doc come from it.
    SPEC: ClassVar[TemplateSpec | None] = None

    # -- spec and shapes (one implementation: tuner.spec.TemplateSpec) ---------------------------------
    def __init_subclass__(cls, **kwargs: object) -> None:
        """A subclass declaring ``SPEC`` takes its name, version, backend, dims, workloads, shape rules and doc
        from it."""
        super().__init_subclass__(**kwargs)
        spec = cls.__dict__.get("SPEC")
        if spec is not None:
            cls.name, cls.version, cls.backend = spec.name, spec.version, spec.backend
            cls.dims, cls.workloads, cls.shape_rules = spec.dims, spec.workloads, spec.shape_rules
            cls.doc = spec.doc or cls.__dict__.get("doc", "")

    @property
    def spec(self) -> TemplateSpec:
        """The template's spec: its declared ``SPEC``, else one made of its class attributes."""
        if self.SPEC is not None:
            return self.SPEC
        return TemplateSpec(
            name=self.name, version=self.version, backend=self.backend, dims=self.dims,
            implementation=f"{type(self).__module__}:{type(self).__qualname__}", workloads=self.workloads,
            doc=self.doc, shape_rules=self.shape_rules, space_file=self.space_path,
        )

    def make_shape(self, raw: Mapping[str, object]) -> Shape:
        """Validate and complete a raw shape (:meth:`tuner.spec.TemplateSpec.make_shape`: the dims and the
        :attr:`shape_rules`, as the runtime client checks them offline). Raises ShapeError."""
        return self.spec.make_shape(raw)

    def check_shape(self, shape: Shape) -> None:
        """Raise ShapeError when ``shape`` breaks one of :attr:`shape_rules`."""
        self.spec.check_shape(shape)

    def workload(self, name: str) -> Shape:
        return self.spec.workload(name)

    def workload_name(self, shape: Shape) -> str | None:
        """The name of the workload whose shape this is, if any."""
        return self.spec.workload_name(shape)

    def reduced(self, shape: Shape) -> Shape:
        """A smaller shape of the same kind, for tests on the CPU (interpreter). Default: the shape itself."""
        return shape

    # -- search space ------------------------------------------------------------------------------
    @property
    def space_path(self) -> Path:
        return self.SPEC.space_path if self.SPEC is not None else default_space_path(self.name)

    def space(self) -> SearchSpace:
        """The template's search space, loaded and validated from ``search_spaces/<name>.yaml``."""
        return self.spec.space()

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

    def error_bounds(self, shape: Shape) -> dict[str, float]:
        """Each output's error bound (``rtol``) for ``shape``, in :meth:`output_specs` order: what the near-bound
        checks compare a candidate's errors with."""
        return {spec.name: spec.rtol for spec in self.output_specs(shape)}

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

    def precompile_comparator(self, name: str, shape: Shape) -> None:
        """Compile comparator ``name`` (one marked ``prebuild``) for ``shape`` into the on-disk caches its
        library keeps (TileLang's, Triton's), so that its measurement in another process loads it instead of
        building (mamba_ssm's TileLang MIMO backward: minutes per shape). On a CUDA device with Triton
        compiled (not interpreted): build it at its contract shape (:meth:`Comparator.contract_shape`) and run
        it once on inputs of seed 0, since libraries compile at their first launch, then give back the
        device memory it cached; elsewhere only build it. Nothing for a comparator unavailable here (its
        measurement says why). Raises KeyError for a name the template has no comparator of, and what the
        comparator's build or run raises."""
        import torch

        from tuner.settings import triton_interpreted

        comparator = {c.name: c for c in self.comparators()}[name]
        at = comparator.contract_shape(shape)
        if comparator.unavailable(at) is not None:
            return
        kernel = comparator.build(at)
        if not torch.cuda.is_available() or triton_interpreted():
            return
        inputs = self.make_inputs(at, "cuda", 0)
        outputs = self.allocate_outputs(at, inputs)
        kernel(inputs, outputs)
        torch.cuda.synchronize()
        del inputs, outputs, kernel  # the pool's process lives on: give back what this run cached
        torch.cuda.empty_cache()

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

    def tensor_flops(self, shape: Shape) -> int:
        """The part of :meth:`flops` that is matrix multiplication (tensor-core work on a GPU; 0: none). The
        report's "% tensor peak" is it over the best time, against the device's dense 16-bit peak."""
        return 0
