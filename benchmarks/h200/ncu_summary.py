"""One markdown row per kernel from Nsight Compute's details page (`ncu --import X.ncu-rep --page details`).

Reads what each kernel's sections state: duration, DRAM throughput, compute (SM) throughput, registers,
theoretical and achieved occupancy, eligible warps per scheduler, cycles between two issued instructions,
local-memory spilling requests, and the warp stall that ncu names first in its Warp State Statistics (with its
share of the cycles between issues). Kernels shorter than ``--min-us`` (torch's copies) are left out.

usage: python benchmarks/h200/ncu_summary.py DETAILS.txt [...] [--min-us 50]
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

_KERNEL = re.compile(r"^  (\S.*?) \((\d+), (\d+), (\d+)\)x\((\d+), (\d+), (\d+)\), Context")
_METRICS = {
    "Duration": "duration",
    "DRAM Throughput": "dram",
    "Compute (SM) Throughput": "sm",
    "Registers Per Thread": "regs",
    "Theoretical Occupancy": "occ_theory",
    "Achieved Occupancy": "occ",
    "Eligible Warps Per Scheduler": "eligible",
    "Warp Cycles Per Issued Instruction": "cpi",
    "Local Memory Spilling Requests": "spills",
}
_STALL = re.compile(r"spends ([\d.]+) cycles being stalled (.+?)\. .*?represents about ([\d.]+)% of the total", re.S)


def parse(text: str) -> list[dict[str, str]]:
    """Per kernel launch, in order: its name, grid, block and the metrics above (as ncu prints them)."""
    kernels: list[dict[str, str]] = []
    lines = text.splitlines()
    starts = [i for i, line in enumerate(lines) if _KERNEL.match(line)]
    for n, start in enumerate(starts):
        block = lines[start: starts[n + 1] if n + 1 < len(starts) else len(lines)]
        m = _KERNEL.match(block[0])
        assert m is not None
        name = re.sub(r"^void |<.*$|\(.*$", "", m.group(1)).split("::")[-1]
        row = {"kernel": name, "grid": "x".join(m.group(i) for i in (2, 3, 4)), "block": m.group(5)}
        for line in block:
            parts = line.split()
            for label, key in _METRICS.items():
                if line.strip().startswith(label + " ") and key not in row:
                    row[key] = parts[-1]
                    row[key + "_unit"] = parts[-2] if len(parts) > len(label.split()) + 1 else ""
        joined = " ".join(line.strip() for line in block)
        stall = _STALL.search(joined)
        if stall:
            row["stall"] = f"{stall.group(2)} ({stall.group(3)}%)"
        kernels.append(row)
    return kernels


def _us(row: dict[str, str]) -> float:
    value = float(row.get("duration", "0").replace(",", ""))
    scale = {"s": 1e6, "second": 1e6, "ms": 1e3, "msecond": 1e3, "us": 1.0, "usecond": 1.0, "ns": 1e-3,
             "nsecond": 1e-3}  # newer ncu prints ms/us/ns, older msecond/usecond/nsecond
    unit = row.get("duration_unit", "")
    if unit not in scale:  # no unit printed, or one not known here: left out of the table, and said so
        print(f"warning: kernel {row['kernel']}: duration {value} in unknown unit {unit!r}; left out", file=sys.stderr)
        return -1.0
    return value * scale[unit]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("details", nargs="+", type=Path)
    ap.add_argument("--min-us", type=float, default=50.0)
    args = ap.parse_args()
    print("| profile | kernel | grid × block | µs | DRAM % | SM % | regs | occupancy % (theory) | eligible warps "
          "/ scheduler | cycles / issue | spill requests | first stall named (share of cycles) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for path in args.details:
        for r in parse(path.read_text()):
            if _us(r) < args.min_us:
                continue
            print(f"| {path.stem} | {r['kernel']} | {r['grid']} × {r['block']} | {_us(r):.0f} | {r.get('dram', '–')} "
                  f"| {r.get('sm', '–')} | {r.get('regs', '–')} | {r.get('occ', '–')} ({r.get('occ_theory', '–')}) "
                  f"| {r.get('eligible', '–')} | {r.get('cpi', '–')} | {r.get('spills', '0')} "
                  f"| {r.get('stall', '–')} |")


if __name__ == "__main__":
    main()
