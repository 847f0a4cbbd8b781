#!/usr/bin/env bash
# How long `cubed serve` takes to become ready after a kill -9 left N tenants open: it recovers
# every such tenant before it serves (docs/operations.md, "Startup"; docs/durability.md,
# "Catalog durability"). Creates N tenants, writes one cell in each (which opens it), kills the
# server with SIGKILL, restarts it on the same data directory and prints the recovery log line and
# the time from start to the ready line; fails unless all N were recovered before the ready line
# (`.ci/run` runs it with a debug build and N = 20). Loopback only; removes its data directory.
#
#   bash loadtest/recovery-at-start.sh [N] [CUBED]     # N = 200, CUBED = target/release/cubed
set -euo pipefail
cd "$(dirname "$0")/.."

N=${1:-200}
CUBED=${2:-target/release/cubed}
CUBEC=${CUBEC:-$(dirname "$CUBED")/cubec}
for b in "$CUBED" "$CUBEC"; do
    [ -x "$b" ] || { echo "no $b: cargo build --release -p cubed -p cubec" >&2; exit 1; }
done
# Logs and credentials beside the data directory, not in it: cubed refuses a directory that
# holds files of someone else's and no catalog.
WORK=$(mktemp -d /tmp/cube-recovery.XXXXXX)
DATA=$WORK/data
PID=
cleanup() {
    if [ -n "$PID" ]; then kill -9 "$PID" 2>/dev/null || true; wait "$PID" 2>/dev/null || true; fi
    rm -rf "$WORK"
}
trap cleanup EXIT

serve() { # $1: log file; sets PID and waits for the ready line
    "$CUBED" serve --data-dir "$DATA" --listen 127.0.0.1:0 --admin-listen 127.0.0.1:0 >"$1" 2>&1 &
    PID=$!
    for _ in $(seq 1200); do grep -q 'cubed ready' "$1" && return 0; sleep 0.05; done
    echo "cubed did not become ready; log:" >&2; cat "$1" >&2; exit 1
}

serve "$WORK/first.log"
ENDPOINT=http://$(grep -o 'grpc=127.0.0.1:[0-9]*' "$WORK/first.log" | head -1 | cut -d= -f2)
for i in $(seq "$N"); do
    "$CUBED" tenant create "t$i" --data-dir "$DATA" >"$WORK/t$i.json"
    "$CUBEC" --endpoint "$ENDPOINT" --credentials "$WORK/t$i.json" write 1 2 3 "v$i" >/dev/null
done
kill -9 "$PID"; wait "$PID" 2>/dev/null || true

start=$(date +%s%N)
serve "$WORK/second.log"
end=$(date +%s%N)
line=$(sed 's/\x1b\[[0-9;]*m//g' "$WORK/second.log" | grep -o 'tenants left open.*' || true)
echo "${line:-(no recovery line in the log)}"
echo "$N tenants open at kill -9: start to ready in $(((end - start) / 1000000)) ms"
# Fails unless every tenant was recovered before the server said it was ready.
[[ "$line" == *"recovered=$N failed=0"* ]] || { echo "expected recovered=$N failed=0" >&2; exit 1; }
