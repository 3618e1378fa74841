"""Device backends: synchronisation, a device-time timer, the L2 flush and the device fingerprint.

``cuda`` (CUPTI through torch.profiler), ``npu`` (torch_npu), ``cpu`` (Triton interpreter / TileLang C
target; wall time, labelled as such). :func:`tuner.measure.devices.kinds.resolve` turns ``auto`` into the best
available kind (cuda > npu > cpu).
"""
