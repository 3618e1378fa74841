"""Template specs: what is known of a kernel template without importing its implementation.

A :class:`TemplateSpec` holds a template's name, version, backend, shape dims, named workloads, its shape
rules and its search-space file; it imports neither torch nor Triton nor TileLang, so the API process,
the registry and the CLI's catalog commands read it for free. The implementation (a
:class:`tuner.template.KernelTemplate`, named by ``implementation``) is imported only where kernels are
built: workers and measurement processes. Specs are immutable and thread-safe.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from tuner.dims import MAX_ELEMENTS, Dim, ShapeRule, validate_shape
from tuner.errors import SearchSpaceError, UnknownWorkloadError
from tuner.frozen import Scalar, Shape

if TYPE_CHECKING:
    from tuner.space import SearchSpace

Backend = Literal["triton", "tilelang"]
SEARCH_SPACES_DIR = Path(__file__).resolve().parent / "search_spaces"  # package data (the repository's search_spaces/)


@dataclass(frozen=True)
class Workload:
    """A named shape users tune for (e.g. a model's layer at a batch and sequence length)."""

    name: str
    shape: Mapping[str, Scalar]
    doc: str = ""



@dataclass(frozen=True)
class CarriedVersion:
    """An earlier version of a template whose published configs the current version serves for the shapes it
    has no best of its own for (``GET /v1/best``, the export file): a new version would otherwise serve its
    default everywhere until every shape is tuned again.

    ``added`` sets the parameters the current version introduced to the values under which its kernels run
    an earlier config as that version did (e.g. MIMO version 3's ``state_pass`` = scan); the served entry
    keeps its own ``template_version`` and figures, measured under the earlier version. Immutable.
    """

    version: str
    added: tuple[tuple[str, Scalar], ...] = ()

    def config(self, earlier: Mapping[str, Scalar]) -> dict[str, Scalar]:
        """An earlier version's config as a config of the current version."""
        return {**earlier, **dict(self.added)}


def default_space_path(template: str) -> Path:
    """``search_spaces/<template>.yaml`` among the package data."""
    return SEARCH_SPACES_DIR / f"{template}.yaml"


@dataclass(frozen=True)
class TemplateSpec:
    """A template as the registry, the API and the client see it.

    ``shape_rules`` are the conditions between dims (expressions: the export file carries them, so the
    runtime client checks shapes offline as the server does); ``implementation`` is the
    ``package.module:Class`` of the KernelTemplate. Raises ShapeError / UnknownWorkloadError from the shape
    methods, SearchSpaceError from :meth:`space`.
    """

    name: str
    version: str
    backend: Backend
    dims: tuple[Dim, ...]
    implementation: str
    workloads: tuple[Workload, ...] = ()
    doc: str = ""
    shape_rules: tuple[ShapeRule, ...] = ()
    space_file: Path | None = None  # default: search_spaces/<name>.yaml (package data)
    max_elements: int = MAX_ELEMENTS  # the largest shape accepted (product of its int dims)
    # earlier versions whose bests are served where this version has none yet, first preferred
    carries: tuple[CarriedVersion, ...] = ()

    def make_shape(self, raw: Mapping[str, object]) -> Shape:
        """Validate and complete a raw shape: coerce types, fill defaults, reject unknown dims, bound its
        size, check the shape rules (:func:`tuner.dims.validate_shape`, which the runtime client runs
        offline too)."""
        return Shape(validate_shape(self.name, self.dims, self.shape_rules, raw, self.max_elements))

    def check_shape(self, shape: Shape) -> None:
        """Raise ShapeError when ``shape`` breaks one of the shape rules."""
        for rule in self.shape_rules:
            rule.check(shape)

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

    @property
    def space_path(self) -> Path:
        return self.space_file or default_space_path(self.name)

    def space(self) -> SearchSpace:
        """The template's search space, loaded and validated from ``search_spaces/<name>.yaml``."""
        from tuner.space import load_space

        space = load_space(self.space_path, shape_dims=tuple(d.name for d in self.dims))
        if space.template != self.name:
            raise SearchSpaceError(f"{self.space_path}: template: {space.template!r} is not {self.name!r}")
        return space
