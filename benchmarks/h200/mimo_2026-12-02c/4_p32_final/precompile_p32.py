"""Run on the H200 on 2026-12-02 before the N128 P32 R4 final round (logged beside it): compile, in parallel,
the two fastest trial configs of that study that no final round disproved, and the default, so that the
final round (`tuner tune ... --time-limit 0.001 --finalists 2 --no-comparators`) loads them from Triton's
cache within the session's last 240 s of device time. usage: python precompile_p32.py STORE.db"""

import sqlite3
import sys

from tuner import registry
from tuner.frozen import Config
from tuner.measure.compile_cache import CompilePool

STUDY = 9  # mimo-n128-p32-r4 in benchmarks/h200/mamba3_mimo_bwd.db

if __name__ == "__main__":
    con = sqlite3.connect(sys.argv[1])
    bad = {r[0] for r in con.execute(
        "select config_json from tuner_measurements where study_id=? and role='final' and status='WRONG_RESULT'",
        (STUDY,))}
    rows = [r[0] for r in con.execute(
        "select config_json from tuner_measurements where study_id=? and role='trial' and status='OK' "
        "order by median_us", (STUDY,))]
    top = [c for c in dict.fromkeys(rows) if c not in bad][:2]
    template = registry.get("mamba3_mimo_bwd")
    shape = template.workload("mimo-n128-p32-r4")
    configs = [Config.from_json(c) for c in top] + [template.space().default]
    with CompilePool(3) as pool:
        print(pool.compile(template, configs, shape, timeout_s=200))
