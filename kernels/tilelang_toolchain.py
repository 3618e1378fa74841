"""Which TileLang target a template compiles for, with which options, and the toolchain's fingerprint.

The target comes from ``TUNER_TILELANG_TARGET``: ``auto`` (default: CUDA for the current device when torch
sees one, else TileLang's C target on the CPU), ``c``, ``cuda`` (the current device's arch) or ``cuda:sm_90``
(an explicit arch: compiling for a GPU on a host without one, e.g. to fill the kernel cache). The C target
runs the same tile-level programs on the CPU for tests; it has no bfloat16 and its C codegen cannot print
some vector types, so programs are lowered there with vectorisation off.

The fingerprint names everything that changes a compiled artifact besides the program itself: TileLang's
version, the device compiler (nvcc or the host C++ compiler) and its version, the target, Python and the
machine. It keys the compile cache (tuner/measure/compile_cache.py). Instances are immutable.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from tuner.errors import ConfigError

TARGET_ENV = "TUNER_TILELANG_TARGET"


@dataclass(frozen=True)
class TileLangToolchain:
    """A resolved target: ``kind`` is ``cuda`` or ``c``; ``arch`` (``sm_90``) is set for CUDA only."""

    kind: str
    arch: str | None = None

    @property
    def execution_backend(self) -> str:
        # tvm_ffi launches on torch's current stream; the C target only has a working cython path here
        return "tvm_ffi" if self.kind == "cuda" else "cython"

    def target(self) -> str | dict[str, str]:
        """The ``target`` argument of ``tilelang.compile``."""
        return {"kind": "cuda", "arch": str(self.arch)} if self.kind == "cuda" else "c"

    def pass_configs(self, *, fast_math: bool = False) -> dict[str, Any]:
        configs: dict[str, Any] = {}
        if self.kind == "c":
            configs["tirx.disable_vectorize"] = True  # C codegen lacks vector min/max/casts
        if fast_math:
            configs["tl.enable_fast_math"] = True
        return configs

    @property
    def device_type(self) -> str:
        """The torch device type whose tensors the compiled kernels accept."""
        return "cuda" if self.kind == "cuda" else "cpu"

    def fingerprint(self) -> dict[str, str]:
        """Everything besides the program that changes what a compile produces (JSON-serialisable)."""
        return {
            "tilelang": _tilelang_version(),
            "target": json.dumps(self.target(), sort_keys=True),
            "execution_backend": self.execution_backend,
            "compiler": _compiler_version(self.kind),
            "python": f"{sys.version_info.major}.{sys.version_info.minor}",
            "machine": f"{sys.platform}-{platform.machine()}",
        }

    def digest(self) -> str:
        """A 16-hex-digit digest of :meth:`fingerprint`."""
        text = json.dumps(self.fingerprint(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()[:16]


def resolve_toolchain(spec: str | None = None) -> TileLangToolchain:
    """The toolchain for ``spec`` (default ``$TUNER_TILELANG_TARGET``, else auto); ConfigError if bad."""
    text = (spec if spec is not None else os.environ.get(TARGET_ENV, "auto")).strip().lower()
    if text == "c":
        return TileLangToolchain("c")
    if text in ("auto", "cuda"):
        arch = _current_cuda_arch()
        if arch is not None:
            return TileLangToolchain("cuda", arch)
        if text == "cuda":
            raise ConfigError(f"{TARGET_ENV}=cuda but no CUDA device is visible; name an arch (cuda:sm_90)")
        return TileLangToolchain("c")
    kind, _, arch = text.partition(":")
    if kind == "cuda" and arch.startswith("sm_") and arch[3:].rstrip("af").isdigit():
        return TileLangToolchain("cuda", arch)
    raise ConfigError(f"{TARGET_ENV}={text!r}: expected auto, c, cuda or cuda:sm_XX")


def _current_cuda_arch() -> str | None:
    import torch

    if not torch.cuda.is_available():
        return None
    major, minor = torch.cuda.get_device_capability()
    return f"sm_{major}{minor}"


@functools.cache
def _tilelang_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("tilelang")
    except PackageNotFoundError:
        return "unknown"


@functools.cache
def _compiler_version(kind: str) -> str:
    """nvcc's release line (CUDA) or the C++ compiler's first line (C); ``missing`` if absent."""
    tool = _find_nvcc() if kind == "cuda" else (shutil.which("g++") or shutil.which("c++"))
    if tool is None:
        return "missing"
    try:
        out = subprocess.run([tool, "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        return f"unavailable: {exc}"
    lines = [line.strip() for line in out.splitlines() if line.strip()]
    if kind == "cuda":
        lines = [line for line in lines if "release" in line or line.startswith("Build")] or lines
        return f"{tool}: {' '.join(lines[-2:])}"
    return f"{tool}: {lines[0] if lines else 'unknown'}"


def _find_nvcc() -> str | None:
    """nvcc as TileLang finds it: on PATH, else under CUDA_HOME."""
    found = shutil.which("nvcc")
    if found:
        return found
    cuda_home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH") or "/usr/local/cuda"
    candidate = os.path.join(cuda_home, "bin", "nvcc")
    return candidate if os.path.exists(candidate) else None


_CACHE_POINTING = threading.RLock()  # TileLang's cache folder is process-wide state


@contextlib.contextmanager
def tilelang_cache_at(directory: os.PathLike[str] | str) -> Iterator[None]:
    """Make TileLang keep the kernels it compiles meanwhile under ``directory`` (this process and the
    children it starts meanwhile); then point it back where it was, so that nothing compiled later in this
    process (a library's own TileLang kernels, a comparator) lands in a folder its other processes do not
    read. Thread-safe: a process-wide lock is held meanwhile (another thread's TileLang compile pointed
    elsewhere waits; nested use in one thread restores in order).

    TileLang creates its cache folders once, at import; when the directory changes they are created here,
    or its saves would fail (it logs them and goes on without caching).
    """
    import tilelang

    with _CACHE_POINTING:
        before_env = os.environ.get("TILELANG_CACHE_DIR")
        before = str(tilelang.env.TILELANG_CACHE_DIR)
        try:
            _point(str(directory))
            yield
        finally:
            if before_env is None:
                os.environ.pop("TILELANG_CACHE_DIR", None)
            else:
                os.environ["TILELANG_CACHE_DIR"] = before_env
            _point(before, environ=False)


def _point(path: str, *, environ: bool = True) -> None:
    import tilelang
    from tilelang.cache.kernel_cache import KernelCache

    if environ:
        os.environ["TILELANG_CACHE_DIR"] = path
    if str(tilelang.env.TILELANG_CACHE_DIR) != path:
        tilelang.env.TILELANG_CACHE_DIR = path  # a forced value: TileLang reads it at every use
    KernelCache._create_dirs()
