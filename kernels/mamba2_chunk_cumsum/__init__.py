"""Mamba2 chunk cumulative sum, forward: the operator (``op``), its Triton template (``triton_template``,
``triton_launch``, ``triton_kernel``), its TileLang template (``tilelang_template``, ``tilelang_program``) and
mamba_ssm's kernel as comparators (``comparator_mamba_ssm``)."""
