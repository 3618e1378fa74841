"""Measurement: build, poison, run, verify and time candidates in isolated subprocesses.

``measurer`` (the parent side: :class:`~tuner.measure.measurer.Measurer`), ``child`` (the measurement
subprocess), ``protocol`` (the frames between them), ``pool`` (subprocess plumbing), ``compile_cache``
(parallel builds and their cache), ``verify`` (poison and compare) and ``devices`` (device backends: timer,
L2 flush, fingerprint). Nothing here knows the store.
"""
