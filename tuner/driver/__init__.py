"""The Optuna driver: a study per key, the trial loop, trial budgets, samplers, the final round.

``study`` (open a study, warm starts, finalize and publish), ``trials`` (the trial loop), ``tuning`` (the
local ``tuner tune`` sweep over shapes), ``budget`` (trial counts and shared slots), ``samplers``.
"""
