"""The TileLang program of the Mamba2 chunk cumsum: a launch plan from (config, shape), and the kernel.

One CTA owns a tile of ``rows`` consecutive chunks × ``block_h`` heads of one batch. It runs four phases,
each a ``T.Parallel`` loop nest (TileLang maps iterations to threads and inserts the barriers between them):

A. load ``dt`` rows (contiguous along H), add the bias, softplus, clamp, and stage the fp32 values in shared
   memory ``st[0]``; ``layout`` says how the stage is laid out: ``qh`` = [rows·Q][block_h + pad] (as in global
   memory: the loads can be vectorised by ``vec``), ``hq`` = [block_h][rows·Q + pad] (transposed on the way
   in: the stores of phase D can be vectorised by ``vec``). ``pad`` skews rows against bank conflicts.
B. scan along Q. ``serial``: one thread per (chunk, head) scans the Q values; ``twolevel``: each (chunk,
   head) row is cut into ``segments`` = threads / (rows·block_h) pieces, one per thread, each scanned
   serially in a register; the partial sums go to ``st[1]``, the segment totals to ``aux[0]``.
C. (two-level only) the exclusive offsets of the segments, summed serially by each thread or in
   log2(segments) Hillis-Steele rounds (``prefix``).
D. write ``dt_out`` (rounded to the output dtype) and ``dA_cumsum`` = partial + offset. ``store`` =
   ``staged``: the partial sums were staged in ``st[1]`` and all threads store along Q from shared memory;
   ``direct``: each thread kept its segment (values, partial sums) in registers and stores it itself.

``scan`` = warp (CUDA) replaces B-D by one register-and-shuffle pass (``_warp_macro``): a row's segments are
consecutive lanes of one warp, each lane owns 4 contiguous values of every piece of 4·segments values, the
lanes' totals are scanned with ``__shfl_up_sync`` and each lane stores its own values (coalesced across the
warp). The stage's barrier is the tile's only one. On the C target the same config runs B-D as the two-level
scan with tree offsets and direct stores (the same sums, associated by segment instead of by piece).

With ``persist`` > 1 a CTA loops over that many consecutive tiles (in ``sweep`` order, over a 1-D grid of
ceil(tiles / persist) CTAs): phase A then reads a raw dt tile that a two-stage ``T.Pipelined`` loop copies
into shared memory with cp.async while the previous tile is scanned and stored (whole tiles only:
``block_h`` divides H). ``persist`` need not divide the tiles: the last CTA's surplus iterations redo its
last tile (the same values to the same addresses, by the same CTA), which lets the grid fit the device in
one wave (2p7b: 2560 tiles, persist 5 = 512 CTAs).

``min_blocks`` > 0 asks ptxas to fit that many CTAs on one SM (``__launch_bounds__``), capping the registers
per thread: more warps in flight for a latency-bound kernel, or spills. ``load_cache`` = streaming reads dt
with ``__ldcs`` (lines that L2 evicts first; CUDA only, plain loads on the C target).
The plan's ``load`` (``regs`` or ``copy``; a probe's variant, not a search-space parameter) makes phase A of
the one-tile kernel copy the raw tile with vector loads first, as the looping kernel does (_raw_tile_macro).

Heads are the fastest thread index in phases B and C (the rows of different heads are ``pad``-skewed, those
of one head are not), the sequence position in phase D (coalesced stores). When ``block_h`` does not divide
H, the last head block is masked. Everything is written with tile-level operators only, so the same program
also lowers for TileLang's C target (CPU), where thread-indexed code is rejected.
"""

# mypy: disable-error-code="valid-type"
# (the T.Tensor(...) parameter annotations below are TileLang's buffer declarations, not Python types)
# No ``from __future__ import annotations`` here: TileLang reads the T.Tensor annotations of the prim_funcs
# below at run time, and string annotations would have to name closure variables it cannot see.
import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tuner.errors import ConfigError
from tuner.frozen import Config, Shape
from tuner.space import SearchSpace


@dataclass(frozen=True)
class CumsumPlan:
    """Everything the program depends on, derived from (config, shape) and validated. Immutable."""

    B: int
    S: int
    H: int
    Q: int
    has_bias: bool
    softplus: bool
    dtype: str
    block_h: int
    rows: int
    threads: int
    scan: str
    pad: int
    vec: int
    layout: str
    prefix: str = "serial"  # how the two-level scan's segment offsets are summed (see _offsets_macro)
    store: str = "staged"  # staged: stores along Q from shared memory; direct: from registers (_direct_macro)
    sweep: str = "heads"  # which tile index is blockIdx.x (varies fastest across CTAs)
    fast_math: bool = False  # softplus as log(1 + exp(x)) and nvcc --use_fast_math (see _softplus)
    persist: int = 1  # tiles per CTA; above 1 the CTA loops over them, loading the next while it scans
    min_blocks: int = 0  # CTAs per SM that ptxas must leave registers for (__launch_bounds__); 0: its choice
    load_cache: str = "default"  # streaming: dt loaded with ld.global.cs (evict-first lines in L1 and L2)
    # how the one-tile kernel brings dt in: fused = each thread loads, activates and stages its values one at
    # a time (the search space's kernels); regs / copy = the raw tile is first copied whole with vector loads
    # into registers / shared memory, then activated into the stage. Not a search-space parameter: a
    # plan-level variant for probes (benchmarks/h200/cumsum_load_probe.py; on an H100 neither was faster)
    load: str = "fused"

    @property
    def groups(self) -> int:
        """Chunk groups (``rows`` consecutive chunks) per sequence."""
        return self.S // self.Q // self.rows

    @property
    def tiles(self) -> int:
        """(batch, chunk group, head block) tiles of the whole problem."""
        return self.B * self.groups * self.head_blocks

    @property
    def segments(self) -> int:
        """Pieces each (chunk, head) row is scanned in (1 for the serial scan)."""
        return 1 if self.scan == "serial" else self.threads // (self.rows * self.block_h)

    @property
    def seg_len(self) -> int:
        return self.Q // self.segments

    @property
    def head_blocks(self) -> int:
        return -(-self.H // self.block_h)

    @property
    def masked(self) -> bool:
        """Whether the last head block runs past H (its extra heads are neither read nor written)."""
        return self.H % self.block_h != 0

    @property
    def grid(self) -> tuple[int, int, int]:
        """(head blocks, chunk groups, batch) for ``sweep`` = heads (neighbouring CTAs read the same dt
        rows), (chunk groups, head blocks, batch) for chunks (they write consecutive chunks of a row)."""
        if self.persist > 1:
            return (-(-self.tiles // self.persist), 1, 1)
        if self.sweep == "heads":
            return (self.head_blocks, self.groups, self.B)
        return (self.groups, self.head_blocks, self.B)

    @property
    def stage_shape(self) -> tuple[int, int, int]:
        """[values, partial sums] (staged store) or [values] (direct store), in ``layout`` order."""
        rq, stages = self.rows * self.Q, 2 if self.store == "staged" else 1
        if self.layout == "qh":
            return (stages, rq, self.block_h + self.pad)
        return (stages, self.block_h, rq + self.pad)

    @property
    def stage_bytes(self) -> int:
        """The stage (dynamic shared memory), in bytes."""
        a, b, c = self.stage_shape
        return 4 * a * b * c

    @property
    def smem_bytes(self) -> int:
        """Dynamic stage plus the static segment totals and offsets (aux), in bytes."""
        return self.stage_bytes + 4 * 2 * self.rows * self.segments * self.block_h


def plan_for(config: Config, shape: Shape) -> CumsumPlan:
    """Validate ``config`` for ``shape`` and derive the plan; ConfigError says which rule is broken.

    The rules are the search space's (search_spaces/mamba2_chunk_cumsum_tilelang.yaml: parameter domains and
    constraints, written once there), asked here so that a config given by hand fails before any compile
    with a readable reason.
    """
    space = _space()
    space.validate_config(config)  # every parameter, each value in its domain
    reason = space.check(config, shape)
    if reason:
        raise ConfigError(f"config {config.key()} for shape {shape.key()}: {reason}")
    return CumsumPlan(
        B=int(shape["B"]), S=int(shape["S"]), H=int(shape["H"]), Q=int(shape["Q"]),
        has_bias=bool(shape["has_bias"]), softplus=bool(shape["softplus"]), dtype=str(shape["dtype"]),
        block_h=int(config["block_h"]), rows=int(config["rows"]), threads=int(config["threads"]),
        scan=str(config["scan"]), pad=int(config["pad"]), vec=int(config["vec"]),
        layout=str(config["layout"]), prefix=str(config["prefix"]), store=str(config["store"]),
        sweep=str(config["sweep"]), fast_math=bool(config["fast_math"]), persist=int(config["persist"]),
        min_blocks=int(config["min_blocks"]), load_cache=str(config["load_cache"]),
    )  # fmt: skip


@functools.cache
def _space() -> SearchSpace:
    from tuner.kernels.mamba2_chunk_cumsum.spec import TILELANG

    return TILELANG.space()


def make_program(plan: CumsumPlan, *, cuda: bool = True) -> Any:
    """The TileLang PrimFunc of ``plan``. Parameters: dt, A, [dt_bias,] dt_limit, dt_out, dA_cumsum.

    ``cuda`` False (TileLang's C target) drops what only CUDA has: the streaming loads of ``load_cache``
    (a cache hint, so the results are the same)."""
    import tilelang.language as T

    body = _body_macro(plan, streaming=cuda and plan.load_cache == "streaming", cuda=cuda)
    b, s, h, q = plan.B, plan.S, plan.H, plan.Q
    c = s // q
    if plan.has_bias:

        @T.prim_func
        def chunk_cumsum_bias(
            dt: T.Tensor((b, s, h), "float32"),
            A: T.Tensor((h,), "float32"),
            dt_bias: T.Tensor((h,), "float32"),
            dt_limit: T.Tensor((2,), "float32"),
            dt_out: T.Tensor((b, h, c, q), plan.dtype),
            dA_cumsum: T.Tensor((b, h, c, q), "float32"),
        ):
            body(dt, A, dt_bias, dt_limit, dt_out, dA_cumsum)

        return chunk_cumsum_bias

    @T.prim_func
    def chunk_cumsum(
        dt: T.Tensor((b, s, h), "float32"),
        A: T.Tensor((h,), "float32"),
        dt_limit: T.Tensor((2,), "float32"),
        dt_out: T.Tensor((b, h, c, q), plan.dtype),
        dA_cumsum: T.Tensor((b, h, c, q), "float32"),
    ):
        body(dt, A, None, dt_limit, dt_out, dA_cumsum)

    return chunk_cumsum


def _body_macro(p: CumsumPlan, *, streaming: bool = False, cuda: bool = True) -> Any:
    """The kernel body as a T.macro over the buffers (``dt_bias`` is None without a bias). ``cuda`` False:
    the warp scan becomes the two-level scan with tree offsets and direct stores, which computes the same
    sums with shared memory instead of shuffles, associated by segment instead of by piece (the C target has
    no threads)."""
    import tilelang.language as T

    bh_, r_, nseg, rq = p.block_h, p.rows, p.segments, p.rows * p.Q
    width_a = T.IntImm("int32", p.vec if p.layout == "qh" else 1)  # vectors where dt is contiguous
    at = _stage_index(p)
    if p.scan == "warp":
        scan_and_store = _warp_macro(p, at) if cuda else _direct_macro(p, at)
    else:
        scan_and_store = _staged_macro(p, at) if p.store == "staged" else _direct_macro(p, at)

    if p.persist > 1:
        return _persistent_body_macro(p, at, scan_and_store)
    if p.load != "fused" and (p.H % p.block_h or p.load_cache != "default" or p.load not in ("copy", "regs")):
        raise ConfigError(f"load={p.load}: needs block_h dividing H={p.H} and load_cache default")
    stage_raw = _raw_tile_macro(p, at)

    @T.macro
    def body(dt, A, dt_bias, dt_limit, dt_out, dA_cumsum):
        with T.Kernel(*p.grid, threads=p.threads) as (gx, gy, bb):
            _occupancy_hint(p)
            bh, bc = (gx, gy) if p.sweep == "heads" else (gy, gx)
            st = T.alloc_shared(p.stage_shape, "float32")
            # segment totals and offsets: small and static (the C target allows one dynamic buffer only)
            aux = T.alloc_shared((2, r_, nseg, bh_), "float32", scope="shared")
            acc = T.alloc_fragment((r_, nseg, bh_), "float32")
            lo = dt_limit[0]
            hi = dt_limit[1]
            if p.load == "fused":
                for q, h in T.Parallel(rq, bh_, coalesced_width=width_a):  # A: load, activate, stage
                    x = _load_x(dt, dt_bias, bb, bc * rq + q, bh * bh_ + h, p.H, p.masked, streaming)
                    st[at(0, q, h)] = _activate(x, lo, hi, p)
            else:  # A: the raw tile first (see _raw_tile_macro)
                if p.load == "regs":
                    raw = T.alloc_fragment((rq, bh_), "float32")
                else:
                    raw = T.alloc_shared((rq, bh_), "float32", scope="shared")
                stage_raw(dt, dt_bias, raw, st, lo, hi, bb, bh, bc)
            scan_and_store(st, aux, acc, A, dt_out, dA_cumsum, bb, bh, bc)

    return body


def _persistent_body_macro(p: CumsumPlan, at: Callable[..., Any], scan_and_store: Any) -> Any:
    """``persist`` tiles per CTA (consecutive in ``sweep`` order), in a software-pipelined loop: the raw dt
    tile of the next iteration is copied into shared memory (cp.async on sm_90, two stages) while the CTA
    activates, scans and stores the current one. Phases B-D are those of the one-tile kernel."""
    import tilelang.language as T

    bh_, rq = p.block_h, p.rows * p.Q
    groups, n_hb = p.groups, p.head_blocks
    stage_raw = _raw_tile_macro(p, at)

    def tile_of(t: Any) -> tuple[Any, Any, Any]:  # (head block, chunk group, batch) of tile t
        if p.sweep == "heads":
            return t % n_hb, (t // n_hb) % groups, t // (n_hb * groups)
        return (t // groups) % n_hb, t % groups, t // (n_hb * groups)

    @T.macro
    def body(dt, A, dt_bias, dt_limit, dt_out, dA_cumsum):
        with T.Kernel(p.grid[0], threads=p.threads) as cta:
            _occupancy_hint(p)
            st = T.alloc_shared(p.stage_shape, "float32")
            raw = T.alloc_shared((rq, bh_), "float32", scope="shared")  # static: the C target's rule
            aux = T.alloc_shared((2, p.rows, p.segments, bh_), "float32", scope="shared")
            acc = T.alloc_fragment((p.rows, p.segments, bh_), "float32")
            lo = dt_limit[0]
            hi = dt_limit[1]
            for it in T.Pipelined(p.persist, num_stages=2):
                # past the last tile (persist not dividing the tiles): redo the last one, same values
                bh, bc, bb = tile_of(T.min(cta * p.persist + it, p.tiles - 1))
                stage_raw(dt, dt_bias, raw, st, lo, hi, bb, bh, bc)  # A, from the raw tile
                scan_and_store(st, aux, acc, A, dt_out, dA_cumsum, bb, bh, bc)

    return body


def _raw_tile_macro(p: CumsumPlan, at: Callable[..., Any]) -> Any:
    """Phase A from a raw tile: copy the tile's dt rows whole into ``raw`` (shared memory or a fragment; the
    looping kernel's copy is what its pipeline overlaps), then add the bias, activate and stage each value.

    The one-tile kernel's ``load`` = regs or copy (plan-level variants, not search-space parameters): the
    raw tile is copied with vector loads (float4 where the tile's rows allow: 4 per thread at 8 heads and
    128 threads, against 16 scalar loads each followed by the activation's branch in the fused load) into a
    fragment (``regs``: each thread's values in registers, activated and staged from there) or into shared
    memory (``copy``: one more barrier and shared pass, and the raw tile's shared memory). Whole tiles only
    (``block_h`` divides H); no streaming loads (load_cache applies to the fused load). Measured on an H100
    (2026-12-05, benchmarks/h200/h100_2026-12-05/README.md): regs from 1.3% faster to 3.5% slower than
    fused at the same min_blocks, copy 10-33% slower."""
    import tilelang.language as T

    bh_, rq = p.block_h, p.rows * p.Q

    @T.macro
    def stage_raw(dt, dt_bias, raw, st, lo, hi, bb, bh, bc):
        T.copy(dt[bb, bc * rq : bc * rq + rq, bh * bh_ : bh * bh_ + bh_], raw, disable_tma=True)
        for q, h in T.Parallel(rq, bh_):
            x = raw[q, h] if dt_bias is None else raw[q, h] + dt_bias[bh * bh_ + h]
            st[at(0, q, h)] = _activate(x, lo, hi, p)

    return stage_raw


def _occupancy_hint(p: CumsumPlan) -> Any:
    """With ``min_blocks``, ``__launch_bounds__(threads, min_blocks)``: ptxas caps the registers so that
    that many CTAs fit one SM (65536 / (min_blocks * threads) per thread, spilling if it must). The
    default kernel holds 35 registers at 256 threads, 6 CTAs per SM; at most 32 lets 8 fit. The C target
    ignores the hint. Returns the annotation's frame (the script parser enters a frame that a statement
    evaluates to), or None."""
    import tilelang.language as T

    return T.annotate_min_blocks_per_sm(p.min_blocks) if p.min_blocks else None


def _stage_index(p: CumsumPlan) -> Callable[[int, Any, Any], tuple[Any, Any, Any]]:
    """Index of (stage, sequence position q in the tile, head h) in the shared stage, per ``layout``."""
    if p.layout == "qh":
        return lambda stage, q, h: (stage, q, h)
    return lambda stage, q, h: (stage, h, q)


def _staged_macro(p: CumsumPlan, at: Callable[..., Any]) -> Any:
    """Phases B-D with the partial sums staged in ``st[1]`` and stores along Q from shared memory."""
    import tilelang.language as T

    bh_, r_, nseg, seg, q_ = p.block_h, p.rows, p.segments, p.seg_len, p.Q
    width_d = T.IntImm("int32", 1 if p.layout == "qh" else p.vec)
    offsets, offset_of = _offsets_macro(p)

    @T.macro
    def staged(st, aux, acc, A, dt_out, dA_cumsum, bb, bh, bc):
        for r, sg, h in T.Parallel(r_, nseg, bh_):  # B: serial scan of each segment
            acc[r, sg, h] = 0.0
            for j in T.serial(seg):
                acc[r, sg, h] += st[at(0, r * q_ + sg * seg + j, h)] * _head_value(
                    A, bh * bh_ + h, p.H, p.masked
                )
                st[at(1, r * q_ + sg * seg + j, h)] = acc[r, sg, h]
            aux[0, r, sg, h] = acc[r, sg, h]
        offsets(aux, acc)  # C: exclusive offsets of the segments (nothing for the serial scan)
        for r, h, q in T.Parallel(r_, bh_, q_, coalesced_width=width_d):  # D: coalesced stores along Q
            if not p.masked or bh * bh_ + h < p.H:
                dt_out[bb, bh * bh_ + h, bc * r_ + r, q] = st[at(0, r * q_ + q, h)]
                dA_cumsum[bb, bh * bh_ + h, bc * r_ + r, q] = st[at(1, r * q_ + q, h)] + offset_of(
                    aux, r, q // seg, h
                )

    return staged


def _direct_macro(p: CumsumPlan, at: Callable[..., Any]) -> Any:
    """Phases B-D with each thread's segment kept in registers (values and partial sums) and stored by the
    thread itself, ``seg_len`` contiguous values per row (vector stores): no second stage, no shared reads
    in phase D. The stores of a warp cover half sectors per instruction when seg_len·4 B < 32 B."""
    import tilelang.language as T

    bh_, r_, nseg, seg, q_ = p.block_h, p.rows, p.segments, p.seg_len, p.Q
    offsets, offset_of = _offsets_macro(p)

    @T.macro
    def direct(st, aux, acc, A, dt_out, dA_cumsum, bb, bh, bc):
        vals = T.alloc_fragment((r_, nseg, bh_, seg), "float32")
        part = T.alloc_fragment((r_, nseg, bh_, seg), "float32")
        for r, sg, h in T.Parallel(r_, nseg, bh_):  # B: serial scan of each segment, in registers
            acc[r, sg, h] = 0.0
            for j in T.serial(seg):
                vals[r, sg, h, j] = st[at(0, r * q_ + sg * seg + j, h)]
                acc[r, sg, h] += vals[r, sg, h, j] * _head_value(A, bh * bh_ + h, p.H, p.masked)
                part[r, sg, h, j] = acc[r, sg, h]
            aux[0, r, sg, h] = acc[r, sg, h]
        offsets(aux, acc)  # C
        for r, sg, h in T.Parallel(r_, nseg, bh_):  # D: each thread stores its own segment
            if not p.masked or bh * bh_ + h < p.H:
                for j in T.vectorized(seg):
                    dt_out[bb, bh * bh_ + h, bc * r_ + r, sg * seg + j] = vals[r, sg, h, j]
                    dA_cumsum[bb, bh * bh_ + h, bc * r_ + r, sg * seg + j] = part[r, sg, h, j] + offset_of(
                        aux, r, sg, h
                    )

    return direct


def _warp_macro(p: CumsumPlan, at: Callable[..., Any]) -> Any:
    """Phases B-D of ``scan`` = warp (CUDA only): the ``segments`` threads of a (chunk, head) row are
    consecutive lanes of one warp, and the row is scanned in pieces of ``segments`` x 4 values (``piece``),
    lane l holding values 4l..4l+3 of each piece: every access of a warp is contiguous (coalesced stores of 4
    values per lane; float4 reads of the hq stage where its padded rows keep 16-byte alignment, pad 0, 4 or 8,
    and scalar reads otherwise). Per piece each lane scans its 4 values in registers,
    the lanes' totals are summed by log2(segments) Hillis-Steele rounds of warp shuffles, and the piece's
    total (from the last lane) carries into the next piece. One barrier per tile (after the stage) instead
    of one per phase and per tree round. The sums associate differently from the two-level scan (by piece,
    then by lane), within fp32 rounding of it."""
    import tilelang.language as T

    bh_, nseg, seg, q_ = p.block_h, p.segments, p.seg_len, p.Q
    w = min(4, seg)  # values per lane and piece
    pieces, stride = seg // w, nseg * w
    assert seg % w == 0, f"segments of {seg} values in pieces of {w}"  # Q and segments are powers of two, seg >= 2
    rounds = [1 << k for k in range(max(nseg - 1, 0).bit_length())]
    read = T.vectorized if p.layout == "hq" else T.serial  # hq: the lane's values are contiguous in the stage

    @T.macro
    def warp(st, aux, acc, A, dt_out, dA_cumsum, bb, bh, bc):
        tx = T.get_thread_binding()
        vals = T.alloc_local((seg,), "float32")
        part = T.alloc_local((seg,), "float32")
        # the lane's sum of its piece; the inclusive scan over the lanes; a shuffled value (every lane
        # shuffles, outside any branch: __shfl_*_sync with the full mask); the carry of the pieces before
        run = T.alloc_local((4,), "float32")
        sg = tx % nseg
        h = (tx // nseg) % bh_
        r = tx // (nseg * bh_)
        a = _head_value(A, bh * bh_ + h, p.H, p.masked)
        run[3] = 0.0
        for k in T.unroll(pieces):
            for i in read(w):
                vals[k * w + i] = st[at(0, r * q_ + k * stride + sg * w + i, h)]
            run[0] = 0.0
            for i in T.serial(w):  # B: the lane's 4 values, in registers
                run[0] += vals[k * w + i] * a
                part[k * w + i] = run[0]
            run[1] = run[0]
            for d in rounds:  # C: inclusive scan of the lanes' sums
                run[2] = T.shfl_up(run[1], d, nseg)
                run[1] = run[1] + T.if_then_else(sg >= d, run[2], T.float32(0.0))
            run[2] = T.shfl_up(run[1], 1, nseg)
            run[0] = run[3] + T.if_then_else(sg > 0, run[2], T.float32(0.0))  # the lane's offset
            for i in T.serial(w):
                part[k * w + i] = part[k * w + i] + run[0]
            run[2] = T.shfl_sync(run[1], nseg - 1, nseg)
            run[3] = run[3] + run[2]  # the piece's total carries into the next
        if not p.masked or bh * bh_ + h < p.H:  # D: coalesced stores, 4 values per lane and piece
            for k in T.unroll(pieces):
                for i in T.vectorized(w):
                    dt_out[bb, bh * bh_ + h, bc * p.rows + r, k * stride + sg * w + i] = vals[k * w + i]
                    dA_cumsum[bb, bh * bh_ + h, bc * p.rows + r, k * stride + sg * w + i] = part[k * w + i]

    return warp


def _offsets_macro(p: CumsumPlan) -> tuple[Any, Callable[..., Any]]:
    """Phase C and the offset of a segment in phase D, for ``p.prefix`` (the totals are in ``aux[0]``).

    ``serial``: each thread sums the totals before its segment (segments - 1 shared loads), into aux[1].
    ``tree``: log2(segments) Hillis-Steele rounds over all segments, ping-ponging aux[0] and aux[1]; the
    exclusive offset of segment s is then the inclusive sum of segment s - 1.
    """
    import tilelang.language as T

    r_, nseg, bh_ = p.rows, p.segments, p.block_h
    rounds = [1 << k for k in range(max(nseg - 1, 0).bit_length())]

    if nseg == 1:

        @T.macro
        def no_offsets(aux, acc):
            T.evaluate(0)

        return no_offsets, lambda aux, r, s, h: T.float32(0.0)

    if p.prefix == "serial":

        @T.macro
        def serial_offsets(aux, acc):
            for r, sg, h in T.Parallel(r_, nseg, bh_):
                acc[r, sg, h] = 0.0
                for k in T.serial(nseg):
                    if k < sg:
                        acc[r, sg, h] += aux[0, r, k, h]
                aux[1, r, sg, h] = acc[r, sg, h]

        return serial_offsets, lambda aux, r, s, h: aux[1, r, s, h]

    @T.macro
    def tree_offsets(aux, acc):
        for k, d in enumerate(rounds):  # unrolled when traced: one T.Parallel (and barrier) per round
            for r, sg, h in T.Parallel(r_, nseg, bh_):
                aux[(k + 1) % 2, r, sg, h] = aux[k % 2, r, sg, h] + T.if_then_else(
                    sg >= d, aux[k % 2, r, T.max(sg - d, 0), h], T.float32(0.0)
                )

    last = len(rounds) % 2
    return tree_offsets, lambda aux, r, s, h: T.if_then_else(
        s > 0, aux[last, r, T.max(s - 1, 0), h], T.float32(0.0)
    )


def _load_x(
    dt: Any, dt_bias: Any, b: Any, s: Any, h: Any, n_heads: int, masked: bool, streaming: bool = False
) -> Any:
    """dt[b, s, h] (+ dt_bias[h]); 0 for the masked heads past H (their loads are not issued).

    ``streaming``: dt is read with ``__ldcs`` (ld.global.cs), whose lines L2 evicts first. Each dt value is
    read once; after the contract's L2 flush (zero_() of a buffer twice the L2) every line the kernel
    allocates evicts a dirty line of the flush buffer, which is written back while the kernel runs, unless
    an evict-first line of dt (already consumed, clean) can go instead."""
    import tilelang.language as T

    v = T.call_extern("float32", "__ldcs", T.address_of(dt[b, s, h])) if streaming else dt[b, s, h]
    x = v if dt_bias is None else v + dt_bias[h]
    return T.if_then_else(h < n_heads, x, T.float32(0.0)) if masked else x


def _activate(x: Any, lo: Any, hi: Any, p: CumsumPlan) -> Any:
    """Phase A's value of a (biased) dt: softplus where the shape asks for it (identity above 20), then
    clamped to [lo, hi] (dt_limit)."""
    import tilelang.language as T

    if p.softplus:
        x = T.if_then_else(x <= 20.0, _softplus(x, p.fast_math), x)
    return T.min(T.max(x, lo), hi)


def _softplus(x: Any, fast: bool) -> Any:
    """log1p(exp(x)); ``fast``: log(1 + exp(x)), which --use_fast_math turns into two MUFU ops.

    The fast form loses the relative accuracy of log1p for tiny results (absolute error ~1e-7, so ~1e-4
    relative at 1e-3, the usual dt_min); log1pf is a ~20-instruction polynomial per element, about half of
    the kernel's instructions. The correctness gate decides whether the fast form is good enough.
    """
    import tilelang.language as T

    return T.log(T.float32(1.0) + T.exp(x)) if fast else T.log1p(T.exp(x))


def _head_value(A: Any, h: Any, n_heads: int, masked: bool) -> Any:
    import tilelang.language as T

    return T.if_then_else(h < n_heads, A[h], T.float32(0.0)) if masked else A[h]
