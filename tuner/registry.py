"""The explicit registry of kernel templates: name → ``module:Class`` import path.

Templates are imported lazily, because importing a kernel module imports its backend (Triton, TileLang),
and the CPU backend must set ``TRITON_INTERPRET=1`` before Triton is first imported. Measurement
subprocesses receive the import path, so templates registered at run time (tests, plugins) work there too.

Templates of your own, outside this repository: ``TUNER_TEMPLATES="name=pkg.module:Class,other=…"`` adds
them to the registry of every tuner process (CLI, server, workers) that sees the variable.
"""

from __future__ import annotations

import importlib
import os
import threading
from functools import cache

from tuner.errors import UnknownTemplateError
from tuner.template import KernelTemplate

BUILTIN_TEMPLATES: dict[str, str] = {
    "mamba2_chunk_cumsum": "tuner.kernels.mamba2_chunk_cumsum.triton_template:Mamba2ChunkCumsum",
    "mamba2_chunk_cumsum_tilelang": "tuner.kernels.mamba2_chunk_cumsum.tilelang_template:Mamba2ChunkCumsumTileLang",
    "mamba3_mimo_bwd": "tuner.kernels.mamba3_mimo.bwd_template:Mamba3MimoBwd",
}

_lock = threading.Lock()


def _from_environment(text: str) -> dict[str, str]:
    entries: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, sep, ref = item.partition("=")
        if not sep or ":" not in ref:
            raise UnknownTemplateError(f"TUNER_TEMPLATES: expected name=package.module:Class, got {item!r}")
        entries[name.strip()] = ref.strip()
    return entries


_registry: dict[str, str] = {**BUILTIN_TEMPLATES, **_from_environment(os.environ.get("TUNER_TEMPLATES", ""))}


def register(name: str, ref: str) -> None:
    """Add (or replace) a template under ``name``; ``ref`` is ``package.module:ClassName``."""
    with _lock:
        _registry[name] = ref


def names() -> list[str]:
    with _lock:
        return sorted(_registry)


def ref_of(name: str) -> str:
    """The import path of a registered template; UnknownTemplateError if none."""
    with _lock:
        ref = _registry.get(name)
    if ref is None:
        raise UnknownTemplateError(f"unknown template {name!r}; known: {', '.join(names()) or 'none'}")
    return ref


def get(name: str) -> KernelTemplate:
    """The template registered under ``name`` (one shared instance per import path).

    Raises UnknownTemplateError when the name is not registered or names a template of another name
    (registry names and ``KernelTemplate.name`` are one and the same: the store keys studies by it).
    """
    template = load(ref_of(name))
    if template.name != name:
        raise UnknownTemplateError(
            f"template {name!r} is registered to {ref_of(name)}, whose name is {template.name!r}"
        )
    return template


@cache
def load(ref: str) -> KernelTemplate:
    """Import ``module:Class`` and instantiate it; raises ImportError/AttributeError/TypeError as Python does."""
    module_name, _, class_name = ref.partition(":")
    cls = getattr(importlib.import_module(module_name), class_name)
    if not (isinstance(cls, type) and issubclass(cls, KernelTemplate)):
        raise TypeError(f"{ref} is not a KernelTemplate subclass")
    return cls()
