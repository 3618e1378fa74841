"""Kernel tests run Triton under its interpreter on the CPU.

TRITON_INTERPRET must be set before Triton is first imported, hence here, at collection. Set
TRITON_INTERPRET=0 in the environment to run the ``gpu``-marked tests on a CUDA device instead.
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")
