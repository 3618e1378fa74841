"""Kernel templates, one module (or a few small ones) per operator family."""
