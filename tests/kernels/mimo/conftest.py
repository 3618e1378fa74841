"""Mamba3 MIMO kernel tests: Triton runs under its interpreter unless a CUDA device is present.

TRITON_INTERPRET must be set before triton is first imported, hence here, at collection time; an explicit
setting in the environment wins.
"""

from __future__ import annotations

import os

import pytest
import torch

if "TRITON_INTERPRET" not in os.environ and not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"


@pytest.fixture(scope="session")
def device() -> str:
    """Where Triton kernels run: the CPU under the interpreter, else the GPU."""
    return "cpu" if os.environ.get("TRITON_INTERPRET") == "1" else "cuda"
