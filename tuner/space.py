"""Search spaces: typed parameters, constraints over parameters and shape, and a default config.

A space is loaded from ``search_spaces/<template>.yaml``::

    template: mamba2_chunk_cumsum
    parameters:
      BLOCK_H:   {type: pow2, low: 1, high: 64}
      num_warps: {type: pow2, low: 1, high: 16}
      layout:    {type: categorical, choices: [heads, rows]}
      ROWS:      {type: int, low: 1, high: 8}
      persistent: {type: bool}
    constraints:
      - expr: BLOCK_H <= H
        reason: a program may not cover more heads than there are
      - S % (ROWS * Q) == 0          # a bare string is a constraint without a reason
    default: {BLOCK_H: 4, num_warps: 4, layout: heads, ROWS: 1, persistent: false}
    seeds:                           # optional: more configs every new study measures early
      - {BLOCK_H: 32, num_warps: 8, layout: rows, ROWS: 1, persistent: false}

Constraint expressions see every parameter and every shape dim (:mod:`tuner.expr` lists what they may use).
Loading validates the whole file and names the offending key on error (:class:`SearchSpaceError`).
A :class:`SearchSpace` is immutable and thread-safe.
"""

from __future__ import annotations

import functools
import itertools
import random
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from tuner.errors import ConfigError, SearchSpaceError
from tuner.expr import Expression, ExpressionError
from tuner.frozen import Config, Scalar, Shape
from tuner.lookup import ConstraintCheck, Domain
from tuner.results import COMPARATOR_KEY

if TYPE_CHECKING:
    import optuna

ParamValue = int | str | bool | float


# -- file schema (pydantic: precise, located error messages) -------------------------------------------
class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class _Categorical(_Strict):
    type: Literal["categorical"]
    choices: list[int | float | str | bool] = Field(min_length=1)
    doc: str = ""


class _Int(_Strict):
    type: Literal["int"]
    low: int
    high: int
    step: int = Field(default=1, ge=1)
    doc: str = ""

    @model_validator(mode="after")
    def _range(self) -> _Int:
        if self.high < self.low:
            raise ValueError(f"high ({self.high}) < low ({self.low})")
        return self


class _Pow2(_Strict):
    type: Literal["pow2"]
    low: int = Field(ge=1)
    high: int = Field(ge=1)
    doc: str = ""

    @model_validator(mode="after")
    def _range(self) -> _Pow2:
        for name, v in (("low", self.low), ("high", self.high)):
            if v & (v - 1):
                raise ValueError(f"{name} ({v}) is not a power of two")
        if self.high < self.low:
            raise ValueError(f"high ({self.high}) < low ({self.low})")
        return self


class _Bool(_Strict):
    type: Literal["bool"]
    doc: str = ""


_ParamModel = Annotated[_Categorical | _Int | _Pow2 | _Bool, Field(discriminator="type")]


class _Constraint(_Strict):
    expr: str
    reason: str = ""


class _SpaceFile(_Strict):
    template: str
    doc: str = ""
    parameters: dict[str, _ParamModel] = Field(min_length=1)
    constraints: list[_Constraint | str] = Field(default_factory=list)
    default: dict[str, int | float | str | bool]
    seeds: list[dict[str, int | float | str | bool]] = Field(default_factory=list)


# -- runtime objects ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Param:
    """One tunable parameter with its finite (or stepped integer) domain."""

    name: str
    kind: Literal["categorical", "int", "pow2", "bool"]
    choices: tuple[ParamValue, ...]  # every allowed value, in order (ints expanded from low..high/step)
    doc: str = ""

    def contains(self, value: object) -> bool:
        if self.kind in ("int", "pow2") and isinstance(value, bool):
            return False
        return any(value == c and type(value) is type(c) for c in self.choices) or (
            self.kind in ("int", "pow2") and isinstance(value, int) and value in self.choices
        )

    def suggest(self, trial: optuna.Trial) -> ParamValue:
        if self.kind == "int":
            lo, hi = int(self.choices[0]), int(self.choices[-1])
            step = int(self.choices[1]) - lo if len(self.choices) > 1 else 1
            return trial.suggest_int(self.name, lo, hi, step=step)
        value = trial.suggest_categorical(self.name, list(self.choices))
        assert value is not None  # choices hold no None
        return value


@dataclass(frozen=True)
class Constraint:
    expression: Expression
    reason: str

    def describe(self) -> str:
        return f"{self.expression.source} ({self.reason})" if self.reason else self.expression.source


@dataclass(frozen=True)
class SearchSpace:
    """A validated search space. ``check`` needs the shape, since constraints may read its dims."""

    template: str
    params: tuple[Param, ...]
    constraints: tuple[Constraint, ...]
    default: Config
    doc: str = ""
    source: str = ""
    seeds: tuple[Config, ...] = ()  # expert configs measured early in every new study (after the default)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.params)

    @functools.cached_property
    def domains(self) -> tuple[Domain, ...]:
        """The parameters' domains as the lookup takes them (to repair a config invalid for a shape)."""
        return tuple(Domain(p.name, p.kind, p.choices) for p in self.params)

    @functools.cached_property
    def constraint_check(self) -> ConstraintCheck:
        """The constraints as the lookup checks them, over plain mappings (as :meth:`is_valid`, faster)."""
        return ConstraintCheck(tuple(c.expression for c in self.constraints))

    def param(self, name: str) -> Param:
        for p in self.params:
            if p.name == name:
                return p
        raise KeyError(name)

    def size(self) -> int:
        """Number of points, before constraints."""
        n = 1
        for p in self.params:
            n *= len(p.choices)
        return n

    def suggest(self, trial: optuna.Trial) -> Config:
        """Ask the trial for a value of every parameter (define-by-run, all parameters always present)."""
        return Config({p.name: p.suggest(trial) for p in self.params})

    def grid(self) -> dict[str, list[Any]]:
        """Every value of every parameter, as Optuna's GridSampler wants them."""
        return {p.name: list(p.choices) for p in self.params}

    def in_domain(self, config: Mapping[str, object]) -> bool:
        """Whether ``config`` sets exactly this space's parameters, each to a value of its domain."""
        return set(config) == set(self.names) and all(self.param(n).contains(v) for n, v in config.items())

    def validate_config(self, raw: Mapping[str, object]) -> Config:
        """A Config from user input: every parameter present, no unknown ones, each value in its domain."""
        unknown = sorted(set(raw) - set(self.names))
        if unknown:
            raise ConfigError(f"unknown parameter(s) {', '.join(unknown)}; known: {', '.join(self.names)}")
        missing = [n for n in self.names if n not in raw]
        if missing:
            raise ConfigError(f"missing parameter(s) {', '.join(missing)}")
        for p in self.params:
            if not p.contains(raw[p.name]):
                shown = ", ".join(map(str, p.choices[:12])) + (" …" if len(p.choices) > 12 else "")
                raise ConfigError(f"parameter {p.name}: {raw[p.name]!r} is not one of {shown}")
        return Config({n: raw[n] for n in self.names})  # type: ignore[misc]

    def check(self, config: Config, shape: Shape) -> str | None:
        """None when ``config`` satisfies every constraint for ``shape``, else the first violation."""
        env: dict[str, Scalar] = {**shape.to_dict(), **config.to_dict()}
        for c in self.constraints:
            try:
                ok = c.expression.evaluate(env)
            except ExpressionError as exc:
                return f"constraint error: {exc}"
            if not ok:
                return f"violates {c.describe()}"
        return None

    def is_valid(self, config: Config, shape: Shape) -> bool:
        return self.check(config, shape) is None

    def iter_configs(self) -> Iterator[Config]:
        """Every point of the space in a fixed order (constraints not applied)."""
        for values in itertools.product(*(p.choices for p in self.params)):
            yield Config(dict(zip(self.names, values, strict=True)))

    def restrict(self, only: Mapping[str, Sequence[object]]) -> dict[str, tuple[ParamValue, ...]]:
        """The domain of every parameter with ``only``'s parameters narrowed to the values it lists (in the
        parameter's own order). Raises ConfigError for an unknown parameter, a value outside its domain, or
        an empty list. Pure: the space is unchanged (its trials keep suggesting over the whole domain)."""
        domains = {p.name: p.choices for p in self.params}
        for name, values in only.items():
            if name not in domains:
                raise ConfigError(f"unknown parameter {name!r}; known: {', '.join(self.names)}")
            param = self.param(name)
            bad = [v for v in values if not param.contains(v)]
            if bad or not values:
                shown = ", ".join(map(str, param.choices[:12])) + (" …" if len(param.choices) > 12 else "")
                what = f"{bad[0]!r} is not" if bad else "no value given; expected"
                raise ConfigError(f"parameter {name}: {what} one of {shown}")
            domains[name] = tuple(c for c in param.choices if any(c == v and type(c) is type(v) for v in values)
                                  or (param.kind in ("int", "pow2") and c in values))
        return domains

    def subspace(self, only: Mapping[str, Sequence[object]]) -> SearchSpace:
        """This space with parameters narrowed to :meth:`restrict` ``(only)``: its trials suggest within the
        subspace (a replayed record of a subspace, ``benchmarks/search.py``). Constraints are kept, seeds
        outside the subspace dropped; the default is kept even if it lies outside (callers that enqueue it
        check the domain). An integer range narrowed to values that are not evenly spaced becomes
        categorical. Same errors as :meth:`restrict`. Never mix it with the full space in one Optuna study:
        Optuna rejects categorical distributions that change within a study."""
        domains = self.restrict(only)
        params = []
        for p in self.params:
            choices = domains[p.name]
            kind = p.kind
            if kind == "int" and len({int(b) - int(a) for a, b in itertools.pairwise(choices)}) > 1:
                kind = "categorical"
            params.append(Param(p.name, kind, choices, p.doc))
        narrowed = SearchSpace(self.template, tuple(params), self.constraints, self.default, self.doc, self.source)
        seeds = tuple(c for c in self.seeds if all(narrowed.param(n).contains(v) for n, v in c.items()))
        return SearchSpace(self.template, tuple(params), self.constraints, self.default, self.doc, self.source, seeds)

    def valid_configs(self, shape: Shape, only: Mapping[str, Sequence[object]] | None = None) -> Iterator[Config]:
        """Every config valid for ``shape`` (within :meth:`restrict` ``(only)``), in :meth:`iter_configs`
        order. Depth-first over the parameters: a constraint is checked as soon as every parameter it reads
        has a value, so that whole branches are cut at once (the TileLang space has ~10^7 points and a few
        thousand valid ones per shape). Same errors as :meth:`restrict`."""
        domains = self.restrict(only or {})
        names = self.names
        base: dict[str, Scalar] = dict(shape.to_dict())
        # constraints by the depth at which the last parameter they read is assigned
        checks: list[list[Constraint]] = [[] for _ in names]
        for c in self.constraints:
            depth = max((names.index(n) for n in c.expression.names if n in names), default=0)
            checks[depth].append(c)

        def passes(depth: int, env: dict[str, Scalar]) -> bool:
            for c in checks[depth]:
                try:
                    if not c.expression.evaluate(env):
                        return False
                except ExpressionError:
                    return False
            return True

        def walk(depth: int, env: dict[str, Scalar]) -> Iterator[Config]:
            name = names[depth]
            for value in domains[name]:
                env[name] = value
                if passes(depth, env):
                    if depth + 1 == len(names):
                        yield Config({n: env[n] for n in names})
                    else:
                        yield from walk(depth + 1, env)
            del env[name]

        yield from walk(0, base)

    def sample(self, rng: random.Random, shape: Shape, attempts: int = 10_000) -> Config:
        """A uniformly drawn valid config for ``shape``; ConfigError if none found in ``attempts`` draws."""
        for _ in range(attempts):
            config = Config({p.name: rng.choice(p.choices) for p in self.params})
            if self.is_valid(config, shape):
                return config
        raise ConfigError(f"no valid config for {shape.key()} in {attempts} random draws")


def _param(name: str, model: _Categorical | _Int | _Pow2 | _Bool) -> Param:
    if isinstance(model, _Categorical):
        return Param(name, "categorical", tuple(model.choices), model.doc)
    if isinstance(model, _Int):
        return Param(name, "int", tuple(range(model.low, model.high + 1, model.step)), model.doc)
    if isinstance(model, _Pow2):
        values = []
        v = model.low
        while v <= model.high:
            values.append(v)
            v *= 2
        return Param(name, "pow2", tuple(values), model.doc)
    return Param(name, "bool", (False, True), model.doc)


def parse_space(data: object, *, source: str, shape_dims: tuple[str, ...] = ()) -> SearchSpace:
    """Build a SearchSpace from parsed YAML/JSON data; SearchSpaceError names ``source`` and the key."""
    try:
        model = _SpaceFile.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(p) for p in err["loc"]) or "(top level)"
        raise SearchSpaceError(f"{source}: {loc}: {err['msg']}") from None
    params = tuple(_param(n, m) for n, m in model.parameters.items())
    clash = sorted(set(model.parameters) & set(shape_dims))
    if clash:
        raise SearchSpaceError(f"{source}: parameters: {', '.join(clash)} is also a shape dim")
    if COMPARATOR_KEY in model.parameters:  # {"comparator": name} is a comparator's config (stores, pool)
        raise SearchSpaceError(f"{source}: parameters: {COMPARATOR_KEY!r} is reserved for comparators")
    known = frozenset(model.parameters) | frozenset(shape_dims)
    constraints = []
    for i, item in enumerate(model.constraints):
        expr, reason = (item, "") if isinstance(item, str) else (item.expr, item.reason)
        try:
            parsed = Expression.parse(expr, known if shape_dims else None)
        except ExpressionError as exc:
            raise SearchSpaceError(f"{source}: constraints.{i}: {exc}") from None
        constraints.append(Constraint(parsed, reason))
    space = SearchSpace(model.template, params, tuple(constraints), Config({}), model.doc, source)
    try:
        default = space.validate_config(model.default)
    except ConfigError as exc:
        raise SearchSpaceError(f"{source}: default: {exc}") from None
    seeds = []
    for i, raw in enumerate(model.seeds):
        try:
            seeds.append(space.validate_config(raw))
        except ConfigError as exc:
            raise SearchSpaceError(f"{source}: seeds.{i}: {exc}") from None
    return SearchSpace(model.template, params, tuple(constraints), default, model.doc, source, tuple(seeds))


def load_space(path: Path, *, shape_dims: tuple[str, ...] = ()) -> SearchSpace:
    """Load and validate a YAML search-space file."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise SearchSpaceError(f"{path}: cannot read: {exc.strerror}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise SearchSpaceError(f"{path}: invalid YAML: {exc}") from None
    return parse_space(data, source=str(path), shape_dims=shape_dims)
