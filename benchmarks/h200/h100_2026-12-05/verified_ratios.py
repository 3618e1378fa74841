"""Per fresh process of each `tuner verify --json` record in the given logs: the strongest mamba_ssm line as
users call it (its wrapper, or its kernel at a fixed BLOCK_SIZE_H on fp32 outputs; not the TileOPs-contract
variants) over the best, and the best's share of the fastest elementwise-ceiling line.

usage: python benchmarks/h200/h100_2026-12-05/verified_ratios.py verify5.log verify_fp32.log
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path
from typing import Any


def records(text: str) -> list[dict[str, Any]]:
    """The JSON objects of a verify log (one per verified shape, among other output)."""
    decoder, found, at = json.JSONDecoder(), [], 0
    while (start := text.find('{"label"', at)) >= 0:
        doc, at = decoder.raw_decode(text, start)
        found.append(doc)
    return found


def main() -> None:
    for path in sys.argv[1:]:
        for doc in records(Path(path).read_text()):
            ratios, shares = [], []
            for process in doc["processes"]:
                ok = {c["label"]: c["median_us"] for c in process["candidates"] if c["status"] == "OK"}
                users = [v for k, v in ok.items() if k.startswith("comparator:mamba_ssm") and "tileops" not in k]
                ceiling = min(v for k, v in ok.items() if "ceiling" in k)
                ratios.append(min(users) / ok["best"])
                shares.append(ceiling / ok["best"])
            per_process = " / ".join(f"{r:.3f}" for r in ratios)
            print(f"{doc['label']} ({doc['shape']['dtype']}): best {doc['median_us']:.2f} us, drift "
                  f"{doc['drift']:+.1%}; ratio per process {per_process}, median {statistics.median(ratios):.3f}x; "
                  f"{statistics.median(shares):.1%} of the elementwise kernel")


if __name__ == "__main__":
    main()
