#!/usr/bin/env bash
# The embedded-mode webhook benchmark (issue 3), end to end, over loopback.
#
# For each run (RUNS, default 2) and each scenario, starts bench/seeded_server.py (the app of
# `tradecore serve`, seeded) in its own process, runs bench/webhook_load.py against it (WARMUP
# unmeasured seconds, then DURATION measured ones: about 30 s a scenario), and stops it:
#
#   latency     open loop, 200 webhooks/s, 400 users
#   throughput  closed loop, CONCURRENCY workers, 2000 users
#   wrk         the same closed loop driven by wrk (C client, bench/webhook.lua); installs
#               wrk with apt-get when it is missing
#   logins      open loop, 200 webhooks/s, 400 users, while 20 logins run concurrently
#   floor       open loop, 200 GET /health/s: the client + loopback + aiohttp floor
#
# Results: one JSON file per scenario and run under bench/results/, and a summary table at
# the end. Other processes on a 2-core machine distort every number, so before each scenario
# it waits (up to QUIET_WAIT s) for QUIET_SECONDS idle seconds in a row, and a run during which
# other processes used more than MAX_OTHER_CPU % of a core (webhooks.other_cpu_percent) is set
# aside as *.json.disturbed and run again, up to ATTEMPTS times in all.
#
# Usage (from anywhere): bench/run_http_bench.sh            # all scenarios, twice
#                        SCENARIOS="latency logins" RUNS=1 bench/run_http_bench.sh
set -euo pipefail

cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
PORT=${PORT:-8099}
RUNS=${RUNS:-2}
FIRST_RUN=${FIRST_RUN:-1}  # runs are numbered FIRST_RUN .. FIRST_RUN + RUNS - 1
WARMUP=${WARMUP:-5}
DURATION=${DURATION:-20}
CONCURRENCY=${CONCURRENCY:-16}
QUIET_WAIT=${QUIET_WAIT:-300}
QUIET_SECONDS=${QUIET_SECONDS:-3}
MAX_OTHER_CPU=${MAX_OTHER_CPU:-10}
ATTEMPTS=${ATTEMPTS:-3}
SCENARIOS=${SCENARIOS:-"latency throughput wrk logins floor"}
RESULTS=bench/results
ACCOUNTS=$RESULTS/accounts.json
SERVER_PID=""
STARTED=$(date -u +%Y%m%dT%H%M%SZ)

mkdir -p "$RESULTS"

stop_server() {
    if [[ -n "$SERVER_PID" ]] && kill -0 "$SERVER_PID" 2>/dev/null; then
        kill -TERM "$SERVER_PID"
        wait "$SERVER_PID" 2>/dev/null || true
    fi
    SERVER_PID=""
}
trap stop_server EXIT

start_server() {  # users login_users
    rm -f "$ACCOUNTS"
    "$PY" bench/seeded_server.py --host 127.0.0.1 --port "$PORT" \
        --users "$1" --login-users "$2" --out "$ACCOUNTS" &
    SERVER_PID=$!
    for _ in $(seq 1 120); do
        [[ -f "$ACCOUNTS" ]] && return 0
        kill -0 "$SERVER_PID" 2>/dev/null || { echo "the server exited" >&2; exit 1; }
        sleep 0.5
    done
    echo "the server did not come up within 60 s" >&2
    exit 1
}

busy_percent() {  # machine-wide CPU busy over one second, percent of all cores
    local _c a b c d e f g h t1 i1 t2 i2
    read -r _c a b c d e f g h _ </proc/stat
    t1=$((a + b + c + d + e + f + g + h)); i1=$((d + e))
    sleep 1
    read -r _c a b c d e f g h _ </proc/stat
    t2=$((a + b + c + d + e + f + g + h)); i2=$((d + e))
    echo $((100 * ((t2 - t1) - (i2 - i1)) / (t2 - t1 > 0 ? t2 - t1 : 1)))
}

wait_quiet() {  # until QUIET_SECONDS in a row under 10% busy, or QUIET_WAIT s have passed
    local waited=0 quiet=0 busy
    while ((quiet < QUIET_SECONDS)); do
        busy=$(busy_percent)
        if ((busy <= 10)); then quiet=$((quiet + 1)); continue; fi
        quiet=0
        if ((waited == 0)); then echo "waiting for an idle machine (busy ${busy}%)..."; fi
        waited=$((waited + 1))
        if ((waited >= QUIET_WAIT)); then
            echo "WARNING: machine still ${busy}% busy after ${QUIET_WAIT}s; measuring anyway"
            return 0
        fi
    done
}

load() {  # label, then webhook_load.py arguments; sets RESULT to the file written
    local label=$1
    shift
    RESULT=$("$PY" bench/webhook_load.py "$@" --accounts-file "$ACCOUNTS" \
        --warmup "$WARMUP" --duration "$DURATION" --label "$label-$STARTED" |
        sed -n 's/^written to //p')
}

other_cpu() {  # the CPU other processes used during RESULT's window, percent of one core
    "$PY" -c 'import json, sys; print(round(json.load(open(sys.argv[1]))["webhooks"].get("other_cpu_percent") or 0))' "$RESULT"
}

run_once() {  # name run
    local name=$1 run=$2
    case $name in
    latency)
        start_server 400 0
        load "latency-run$run" open --rate 200
        ;;
    throughput)
        start_server 2000 0
        load "throughput-run$run" closed --concurrency "$CONCURRENCY"
        ;;
    logins)
        start_server 400 20
        load "logins-run$run" open --rate 200 --logins 20
        ;;
    wrk)
        command -v wrk >/dev/null || apt-get install -y wrk >/dev/null
        start_server 2000 0
        load "wrk-run$run" wrk --concurrency "$CONCURRENCY" --threads 1
        ;;
    floor)
        start_server 400 0
        load "floor-run$run" open --rate 200 --health
        ;;
    *)
        echo "unknown scenario $name" >&2
        exit 2
        ;;
    esac
    stop_server
}

scenario() {  # name run: retried (up to ATTEMPTS) while other processes disturbed it
    local name=$1 run=$2 attempt other
    for attempt in $(seq 1 "$ATTEMPTS"); do
        wait_quiet
        echo "== $name (run $run, attempt $attempt)"
        run_once "$name" "$run"
        other=$(other_cpu)
        if ((other <= MAX_OTHER_CPU)) || ((attempt == ATTEMPTS)); then
            ((other <= MAX_OTHER_CPU)) || echo "WARNING: kept a disturbed run (others: ${other}%)"
            return 0
        fi
        echo "disturbed: other processes used ${other}% of a core; set aside as .disturbed"
        mv "$RESULT" "$RESULT.disturbed"
    done
}

for run in $(seq "$FIRST_RUN" $((FIRST_RUN + RUNS - 1))); do
    for name in $SCENARIOS; do
        scenario "$name" "$run"
    done
done

"$PY" - "$RESULTS" "$STARTED" <<'EOF'
import json
import sys
from pathlib import Path

results, started = Path(sys.argv[1]), sys.argv[2]


def cell(value: object, width: int) -> str:
    return f"{'-' if value is None else value:>{width}}"


print(f"\n{'scenario':<16}{'rate/s':>8}{'errors':>7}{'p50':>9}{'p90':>9}{'p99':>9}{'max':>9}"
      f"{'srv%':>7}{'cli%':>7}{'other%':>7}{'logins/s':>9}{'login err':>10}{'login p50':>11}")
for path in sorted(results.glob(f"*-{started}-*.json")):
    report = json.loads(path.read_text())
    w = report["webhooks"]
    lat = w["latency_ms"]
    logins = w.get("logins") or {}
    print(f"{report['label'].rsplit('-', 1)[0]:<16}" + cell(w["achieved_rate_per_s"], 8)
          + cell(w["errors"], 7) + "".join(cell(lat[k], 9) for k in ("p50", "p90", "p99", "max"))
          + "".join(cell(w.get(k), 7) for k in ("server_cpu_percent", "client_cpu_percent",
                                                  "other_cpu_percent"))
          + cell(logins.get("achieved_rate_per_s"), 9) + cell(logins.get("errors"), 10)
          + cell((logins.get("latency_ms") or {}).get("p50"), 11))
print("(latencies in ms; open-loop latencies count from the scheduled send time)")
EOF
