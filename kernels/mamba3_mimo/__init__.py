"""Mamba3 MIMO: the backward template in Triton (``bwd_template``, ``bwd_launch``, ``bwd_kernel``), the
PyTorch reference (``reference``) and mamba_ssm's TileLang backward as comparator (``comparator_mamba_ssm``)."""
