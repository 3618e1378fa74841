"""Per process of each latest `tuner verify` of the chunk-cumsum TileLang bests (version 6) in the committed
store: the strongest mamba_ssm line as users call it (its wrapper, its kernel at each fixed BLOCK_SIZE_H on
fp32 outputs) over the best, both measured in that process, and the best's share of the elementwise kernel.
Then the geometric mean over the five workloads of each workload's median, and of each workload's weakest process.

usage: python benchmarks/h200/chunk_cumsum_2026-12-04b/verified_ratios.py [STORE]
"""

from __future__ import annotations

import json
import math
import sqlite3
import statistics
import sys

USERS = ("comparator:mamba_ssm-wrapper", "comparator:mamba_ssm-fp32-bh")


def main() -> None:
    con = sqlite3.connect(sys.argv[1] if len(sys.argv) > 1 else "benchmarks/h200/chunk_cumsum.db")
    latest: dict[str, tuple[int, list[dict]]] = {}
    for vid, key, figures in con.execute(
        "select v.id, s.shape_key, v.figures_json from tuner_verifications v join tuner_studies s"
        " on s.id = v.study_id where s.template = 'mamba2_chunk_cumsum_tilelang' and s.template_version = '6'"
        " order by v.id"
    ):
        latest[key] = (vid, json.loads(figures))
    medians, weakest = [], []
    print("| verification | shape | strongest as users call it / best, per process | median |"
          " % of elementwise kernel |")
    print("|---|---|---|---|---|")
    for key, (vid, figures) in latest.items():
        ratios, ceilings = [], []
        for process in figures:  # one entry per fresh process
            us = {c["label"]: c["median_us"] for c in process["candidates"] if c["status"] == "OK"}
            users = [v for n, v in us.items() if n.startswith(USERS)]
            ratios.append(min(users) / us["best"])
            ceilings.append(100 * min(v for n, v in us.items() if "ceiling" in n) / us["best"])
        medians.append(statistics.median(ratios))
        weakest.append(min(ratios))
        print(f"| {vid} | {key} | {' / '.join(f'{r:.3f}x' for r in ratios)} | {medians[-1]:.3f}x | "
              f"{' / '.join(f'{c:.1f}' for c in ceilings)} |")

    def geomean(xs: list[float]) -> float:
        return math.exp(sum(map(math.log, xs)) / len(xs))

    print(f"\ngeometric mean of the medians: {geomean(medians):.4f}x; of each workload's weakest process: "
          f"{geomean(weakest):.4f}x ({len(medians)} workloads)")


if __name__ == "__main__":
    main()
