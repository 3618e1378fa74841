#!/usr/bin/env bash
# Regenerate the committed H200 reports from the committed stores (no GPU needed).
# Each report is its .head.md (hand-written: status, commands, analysis) followed by `tuner report` over the
# committed store; a missing store skips its reports with a note.

set -euo pipefail
cd "$(dirname "$0")/../.."
TUNER="${PYTHON:-.venv/bin/python} -m tuner.cli"
H=benchmarks/h200
if [[ -f $H/chunk_cumsum.db ]]; then
  DB=sqlite:///$H/chunk_cumsum.db
  { cat $H/chunk_cumsum_core.head.md; $TUNER report mamba2_chunk_cumsum --device cuda --db "$DB"; } \
    > $H/chunk_cumsum_core.md
  { cat $H/chunk_cumsum.head.md
    $TUNER report mamba2_chunk_cumsum mamba2_chunk_cumsum_tilelang --device cuda --db "$DB" \
      --title "Mamba2 chunk cumsum forward on the H200: Triton and TileLang templates vs mamba_ssm"
  } > $H/chunk_cumsum.md
  { cat $H/verify.head.md
    $TUNER report mamba2_chunk_cumsum_tilelang --verifications --device cuda --db "$DB" \
      --title "Chunk cumsum verifications (latest per workload; store chunk_cumsum.db)"
    echo
    $TUNER report mamba3_mimo_bwd --verifications --device cuda --db "sqlite:///$H/mamba3_mimo_bwd.db" \
      --title "MIMO backward verifications (latest per workload; store mamba3_mimo_bwd.db)"
  } > $H/verify.md
else
  echo "skipped chunk_cumsum reports: $H/chunk_cumsum.db is missing" >&2
fi
{ cat $H/mamba3_mimo_bwd.head.md
  $TUNER report mamba3_mimo_bwd --device cuda --errors --kernels --db "sqlite:///$H/mamba3_mimo_bwd.db"
} > $H/mamba3_mimo_bwd.md
if [[ -f $H/unseen_shapes.json ]]; then
  { cat $H/unseen_shapes.head.md; ${PYTHON:-.venv/bin/python} benchmarks/unseen_shapes.py render $H/unseen_shapes.json
    printf '\n## The same shapes asked of the lookup as it is now\n\n'
    printf '`python benchmarks/unseen_shapes.py answers benchmarks/h200/unseen_shapes.json --db sqlite:///%s` (the\n' "$H/chunk_cumsum.db"
    printf 'export file and the offline client: the same lookup as the server), regenerated with this file:\n\n'
    ${PYTHON:-.venv/bin/python} benchmarks/unseen_shapes.py answers $H/unseen_shapes.json --db "sqlite:///$H/chunk_cumsum.db"
  } > $H/unseen_shapes.md
fi
