#!/usr/bin/env bash
# How long `make test` takes, from fresh clones, commits alternating (docs/development.md's table):
#   bash scripts/time_suite.sh ROUNDS COMMIT...      e.g.  bash scripts/time_suite.sh 2 HEAD~50 HEAD
# Each round clones every commit into a temporary folder (the first round runs them in the order given, the
# next in reverse, and so on), installs it (not timed) and times `make test` there with a cold torch.compile
# cache; each time is written to results/suite/COMMIT-rROUND.json (or RESULTS=DIR) with the machine and the
# command. ARGS="..." adds pytest arguments (a test runs it on one test file).
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
results="${RESULTS:-$repo/results/suite}"
args="-p no:cacheprovider${ARGS:+ $ARGS}"
if [[ $# -lt 2 || ! "$1" =~ ^[1-9][0-9]*$ ]]; then echo "usage: bash scripts/time_suite.sh ROUNDS COMMIT..." >&2; exit 2; fi
rounds="$1"; shift
commits=(); for c in "$@"; do commits+=("$(git -C "$repo" rev-parse --short "$c")"); done
work="$(mktemp -d)"; trap 'rm -rf "$work"' EXIT
mkdir -p "$results"
for round in $(seq 1 "$rounds"); do
  order=("${commits[@]}"); if (( round % 2 == 0 )); then order=(); for ((i=${#commits[@]}-1; i>=0; i--)); do order+=("${commits[i]}"); done; fi
  for c in "${order[@]}"; do
    clone="$work/$c-r$round"
    git clone -q "$repo" "$clone" && git -C "$clone" checkout -q "$c"
    make -C "$clone" install >"$work/install.log" 2>&1 || { cat "$work/install.log" >&2; exit 1; }
    start=$(date +%s.%N)
    status=0
    TORCHINDUCTOR_CACHE_DIR="$clone/.inductor" make -C "$clone" test ARGS="$args" >"$clone/test.log" 2>&1 || status=$?
    end=$(date +%s.%N)
    summary="$(grep -E '[0-9]+ (passed|failed)' "$clone/test.log" | tail -n 1 | tr -d '=' | sed 's/^ *//; s/ *$//')"
    python3 - "$results/$c-r$round.json" "$c" "$round" "$start" "$end" "$status" "$summary" "$args" <<'EOF'
import json, os, platform, sys
from datetime import datetime, timezone
out, commit, rnd, start, end, status, summary, args = sys.argv[1:]
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), platform.machine())
record = {"row": f"make test at {commit}, repeat {rnd}", "command": f"make test ARGS='{args}'",
          "commit": commit, "date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "device": cpu, "cpu": cpu,
          "cpu_cores": len(os.sched_getaffinity(0)), "exit_status": int(status),
          "wall_seconds": round(float(end) - float(start), 1), "summary": summary}
json.dump(record, open(out, "w"), indent=2)
print(json.dumps(record))
EOF
    rm -rf "$clone"
  done
done
