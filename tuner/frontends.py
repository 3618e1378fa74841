"""Backend-specific knowledge shared by templates: which exceptions are compile errors.

Triton and TileLang compile at the first launch (or at build), and report compile errors with their own
exception types; under the Triton interpreter a frontend rejection surfaces as an ``InterpreterError``
whose cause was raised by ``triton.language``. Anything else at launch is a runtime error.

TileLang compiles in ``build``. Its compile errors come from TVM passes (``tvm.error.InternalError``
raised under tilelang/transform or tilelang/engine), from its tracer (tilelang/language), and from the
device compiler: nvcc or the host C++ compiler failing is a plain ``RuntimeError`` raised in
tilelang/contrib/nvcc.py or tilelang/jit/adapter/libgen.py. They are recognised by where they were raised,
not by type: at launch TileLang raises TVM-FFI errors too (argument checks, CUDA faults), and those are
runtime errors, except a launch refused for resources (shared memory, registers), which the config asked.
A compile error recorded by the compile cache is re-raised as ``CompileFailed``.
"""

from __future__ import annotations

import traceback


def is_compile_error(backend: str, exc: BaseException) -> bool:
    """True when ``exc`` means the config cannot be compiled (as opposed to a failure while running)."""
    names = {cls.__name__ for cls in type(exc).__mro__}
    if backend == "triton":
        if "CompilationError" in names or "OutOfResources" in names:
            return True
        if "InterpreterError" in names:
            cause = exc.__cause__ or exc.__context__ or exc
            return _raised_in(cause, ("triton/language/", "triton/compiler/"))
        return False
    if backend == "tilelang":
        if "CompileFailed" in names:
            return True
        if _raised_in(exc, _TILELANG_COMPILE_PATHS):
            return True
        text = str(exc).lower()
        return any(marker in text for marker in _LAUNCH_RESOURCE_MARKERS)
    return False


# Where TileLang traces, lowers and compiles (never on the launch path of a built kernel).
_TILELANG_COMPILE_PATHS = (
    "tilelang/language/",
    "tilelang/engine/",
    "tilelang/transform/",
    "tilelang/backend/",
    "tilelang/contrib/",
    "tilelang/cuda/",
    "tilelang/cpu/",
    "tilelang/cache/",
    "tilelang/jit/adapter/libgen.py",
)
_LAUNCH_RESOURCE_MARKERS = (
    "too many resources requested",
    "out of resources",
    "dynamic shared memory",
    "cudafuncattributemaxdynamicsharedmemorysize",
)


def _raised_in(exc: BaseException, fragments: tuple[str, ...]) -> bool:
    frames = traceback.extract_tb(exc.__traceback__)
    return any(any(f in frame.filename.replace("\\", "/") for f in fragments) for frame in frames)
