#!/usr/bin/env bash
# How long `make test` takes, from fresh clones, commits alternating (docs/development.md's table):
#   bash scripts/time_suite.sh ROUNDS COMMIT...      e.g.  bash scripts/time_suite.sh 2 HEAD~50 HEAD
# Each round clones every commit into a temporary folder (the first round runs them in the order given, the
# next in reverse, and so on), installs it (not timed) and times `make test` there with a cold torch.compile
# cache; each time is written to results/suite/COMMIT-rROUND.json (or RESULTS=DIR) with the machine and the
# command. ARGS="..." adds pytest arguments (a test runs it on one test file). TARGETS="..." times those
# make targets one after the other in each clone (default: test), each in the record; with test-cluster,
# the one-node SLURM cluster of scripts/slurm/local_cluster.sh is started first (root), as .ci/run does
# (test-lowest's time includes making its venv, as on CI). The record says how many test processes ran
# (test_processes: TEST_PROCESSES, default auto; 1 for a commit whose Makefile runs them in one):
#   TARGETS="test test-long test-lowest test-cluster" bash scripts/time_suite.sh 1 HEAD     .ci/run, per target
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
    # (with the test tools: a Makefile with extras installs them in `make test`, which would time the install)
    extras=""; if grep -q '^EXTRA_NAMES' "$clone/Makefile"; then extras="EXTRAS=dev"; fi
    make -C "$clone" install $extras >"$work/install.log" 2>&1 || { cat "$work/install.log" >&2; exit 1; }
    times="$work/times.tsv"; : > "$times"
    processes=1; if grep -q '^TEST_PROCESSES' "$clone/Makefile"; then processes="${TEST_PROCESSES-auto}"; fi
    for target in ${TARGETS:-test}; do
      if [[ "$target" == test-cluster ]]; then
        start=$(date +%s.%N); status=0
        bash "$clone/scripts/slurm/local_cluster.sh" >"$clone/local_cluster.log" 2>&1 || status=$?
        printf 'local_cluster.sh\tbash scripts/slurm/local_cluster.sh\t%s\t%s\t%s\t\n' "$start" "$(date +%s.%N)" "$status" >> "$times"
      fi
      start=$(date +%s.%N); status=0
      TORCHINDUCTOR_CACHE_DIR="$clone.inductor" make -C "$clone" "$target" ARGS="$args" >"$clone/$target.log" 2>&1 || status=$?
      end=$(date +%s.%N)
      if (( status )); then echo "make $target in $clone ended with exit $status:" >&2; tail -n 30 "$clone/$target.log" >&2; fi
      summary="$({ grep -E '[0-9]+ (passed|failed|deselected)' "$clone/$target.log" || true; } | tail -n 1 | tr -d '=' | sed 's/^ *//; s/ *$//')"
      printf "%s\tmake %s ARGS=%s\t%s\t%s\t%s\t%s\n" "$target" "$target" "$(python3 -c 'import shlex, sys; print(shlex.quote(sys.argv[1]))' "$args")" \
        "$start" "$end" "$status" "$summary" >> "$times"
    done
    python3 - "$results/$c-r$round.json" "$c" "$round" "$times" "$processes" <<'EOF'
import json, os, platform, sys
from datetime import datetime, timezone
out, commit, rnd, times, processes = sys.argv[1:]
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), platform.machine())
targets = []
for line in open(times).read().splitlines():
    target, command, start, end, status, summary = line.split("\t")
    targets.append({"target": target, "command": command, "seconds": round(float(end) - float(start), 1),
                    "exit_status": int(status), "summary": summary})
made = [t for t in targets if t["target"] != "local_cluster.sh"]
record = {"row": f"make {' '.join(t['target'] for t in made)} at {commit}, repeat {rnd}",
          "command": " && ".join(t["command"] for t in targets), "commit": commit,
          "date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "device": cpu, "cpu": cpu,
          "cpu_cores": len(os.sched_getaffinity(0)), "test_processes": processes,
          "exit_status": max(t["exit_status"] for t in targets),
          "wall_seconds": round(sum(t["seconds"] for t in targets), 1), "summary": made[0]["summary"]}
if len(targets) > 1:  # each target's own time, command and summary
    record["targets"] = targets
json.dump(record, open(out, "w"), indent=2)
print(json.dumps(record))
EOF
    rm -rf "$clone" "$clone.inductor"
  done
done
