"""Registers, stack and shared memory of TileLang chunk-cumsum configs on sm_90, and the occupancy and waves
they imply on an H200, compiled without a GPU.

TileLang compiles for ``cuda:sm_90`` on a host with nvcc and no device (the compile test does the same).
This reads what ptxas decided from the cubin itself (the ``.nv.info`` attributes REGCOUNT and FRAME_SIZE,
the size of the kernel's ``.nv.shared`` section), adds the dynamic shared memory of the launch plan, and
works out how many CTAs of the config fit on one SM (registers, shared memory, threads) and how many waves
its grid takes. The same numbers come out of Nsight Compute on the H200: the looping kernel at persist 4
read 58 registers and 4 CTAs per SM here and in ``chunk_cumsum_2026-11-29b/profile_persist4.txt``.

usage: python benchmarks/sm90_tilelang_resources.py --workload NAME --config JSON [--config JSON ...]
       (a config is a JSON object of overrides of the template's default)
"""

from __future__ import annotations

import argparse
import json
import os
import struct
import tempfile
from dataclasses import dataclass
from pathlib import Path

# sm_90 (H100/H200) limits per SM and per CTA; the H200 has 132 SMs.
SMS = 132
REGS_PER_SM = 65536
REG_UNIT = 256  # registers are allocated per warp in units of 256
SMEM_PER_SM = 228 * 1024
SMEM_RESERVED_PER_CTA = 1024  # the driver reserves 1 KB of shared memory per CTA
THREADS_PER_SM = 2048
CTAS_PER_SM = 32

EIATTR_REGCOUNT = 0x2F
EIATTR_FRAME_SIZE = 0x12
EIFMT_SVAL = 0x04


@dataclass(frozen=True)
class CubinResources:
    registers: int
    frame_bytes: int
    static_smem: int


def cubin_resources(data: bytes) -> CubinResources:
    """Registers per thread, stack frame and static shared memory of the (single) kernel in an ELF cubin."""
    if data[:4] != b"\x7fELF" or data[4] != 2:
        raise ValueError("not a 64-bit ELF cubin")
    (shoff,) = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    strtab = sections[shstrndx][4]

    def name(offset: int) -> str:
        start = strtab + offset
        return data[start : data.index(b"\0", start)].decode()

    registers = frame = smem = 0
    for sec_name, _type, _flags, _addr, offset, size, *_ in sections:
        label = name(sec_name)
        if label.startswith(".nv.shared.") and not label.startswith(".nv.shared.reserved"):
            smem += size
        if not label.startswith(".nv.info"):
            continue
        pos = offset
        while pos < offset + size:
            fmt, attr = data[pos], data[pos + 1]
            if fmt == EIFMT_SVAL:
                (length,) = struct.unpack_from("<H", data, pos + 2)
                if attr in (EIATTR_REGCOUNT, EIATTR_FRAME_SIZE):
                    _symbol, value = struct.unpack_from("<II", data, pos + 4)
                    if attr == EIATTR_REGCOUNT:
                        registers = max(registers, value)
                    else:
                        frame = max(frame, value)
                pos += 4 + length
            elif fmt in (0x02, 0x03):  # byte or half-word value
                pos += 4
            else:  # no value
                pos += 2
    return CubinResources(registers, frame, smem)


def ctas_per_sm(threads: int, registers: int, smem_bytes: int) -> dict[str, int]:
    """CTAs of one SM by each limit (registers, shared memory, threads, the hardware cap)."""
    warps = -(-threads // 32)
    per_warp = -(-registers * 32 // REG_UNIT) * REG_UNIT
    return {
        "registers": REGS_PER_SM // (warps * per_warp) if registers else CTAS_PER_SM,
        "shared": SMEM_PER_SM // (smem_bytes + SMEM_RESERVED_PER_CTA),
        "threads": THREADS_PER_SM // threads,
        "cap": CTAS_PER_SM,
    }


def analyse(workload: str, overrides: dict) -> dict:
    from tuner.kernels.mamba2_chunk_cumsum.tilelang_template import Mamba2ChunkCumsumTileLang
    from tuner.measure.compile_cache import CompileCache, set_default_cache

    template = Mamba2ChunkCumsumTileLang()
    shape = template.workload(workload)
    config = template.space().default.replace(**overrides)
    reason = template.space().check(config, shape)
    if reason:
        return {"config": overrides, "invalid": reason}
    with tempfile.TemporaryDirectory() as home:
        set_default_cache(CompileCache(Path(home)))
        try:
            _kernel, plan = template.compile(config, shape)
            (cubin,) = Path(home).rglob("kernel.cubin")
            res = cubin_resources(cubin.read_bytes())
        finally:
            set_default_cache(None)
    dynamic = plan.stage_bytes  # the segment totals (aux) are static: in the cubin's figure
    smem = res.static_smem + dynamic
    limits = ctas_per_sm(plan.threads, res.registers, smem)
    fit = min(limits.values())
    grid = plan.grid[0] * plan.grid[1] * plan.grid[2]
    return {
        "config": overrides, "threads": plan.threads, "registers": res.registers, "frame": res.frame_bytes,
        "smem_static": res.static_smem, "smem_dynamic": dynamic, "ctas_per_sm": fit,
        "limited_by": [k for k, v in limits.items() if v == fit], "grid": grid,
        "waves": round(grid / (fit * SMS), 2), "occupancy": round(fit * plan.threads / THREADS_PER_SM, 2),
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workload", required=True)
    parser.add_argument("--config", action="append", default=[], help="JSON overrides of the default")
    parser.add_argument("--json", help="write the rows here as well")
    args = parser.parse_args()
    os.environ["TUNER_TILELANG_TARGET"] = "cuda:sm_90"
    rows = [analyse(args.workload, json.loads(c)) for c in (args.config or ["{}"])]
    columns = ("config", "threads", "regs", "stack B", "smem static + dynamic B", "CTAs/SM (limit)", "occupancy",
               "grid", "waves")
    print("| " + " | ".join(columns) + " |")
    print("|" + "---|" * len(columns))
    for r in rows:
        if "invalid" in r:
            print(f"| `{json.dumps(r['config'])}` | invalid: {r['invalid']} |||||||")
            continue
        print(f"| `{json.dumps(r['config'])}` | {r['threads']} | {r['registers']} | {r['frame']} | "
              f"{r['smem_static']} + {r['smem_dynamic']} | {r['ctas_per_sm']} ({', '.join(r['limited_by'])}) | "
              f"{r['occupancy']:.0%} | {r['grid']} | {r['waves']} |")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
