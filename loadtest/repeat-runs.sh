#!/usr/bin/env bash
# `cube-load run` several times against ONE long-lived cubed (`--target`), the way an operator
# measures a server that keeps its data: every run must be 100% ok and verified, although the
# tenant already holds the earlier runs' cells. Each run claims a run slot of its own (x
# coordinates no earlier run used; loadtest/src/ab/user.rs, `claim_slot`); without that, the
# second run wrote to cells the first had sealed and read run counts the first had left.
# `.ci/run` runs it with a debug build (an op fails after 10 s, as in its stress gate). Loopback
# only; removes its data directory.
#
#   bash loadtest/repeat-runs.sh [RUNS] [SECONDS] [BIN_DIR]     # 3 runs of 5 s, target/release
set -euo pipefail
cd "$(dirname "$0")/.."

RUNS=${1:-3}
SECS=${2:-5}
BIN=${3:-target/release}
for b in cubed cube-load; do
    [ -x "$BIN/$b" ] || { echo "no $BIN/$b: cargo build --release -p cubed -p cube-load" >&2; exit 1; }
done
DATA=$(mktemp -d /tmp/cube-repeat.XXXXXX)
PID=
cleanup() {
    if [ -n "$PID" ]; then kill "$PID" 2>/dev/null || true; wait "$PID" 2>/dev/null || true; fi
    rm -rf "$DATA"
}
trap cleanup EXIT

"$BIN/cubed" serve --data-dir "$DATA/data" --listen 127.0.0.1:0 --admin-listen 127.0.0.1:0 >"$DATA/log" 2>&1 &
PID=$!
for _ in $(seq 1200); do grep -q 'cubed ready' "$DATA/log" && break; sleep 0.05; done
grep -q 'cubed ready' "$DATA/log" || { echo "cubed did not become ready; log:" >&2; cat "$DATA/log" >&2; exit 1; }
GRPC=$(grep -o 'grpc=127.0.0.1:[0-9]*' "$DATA/log" | head -1 | cut -d= -f2)
ADMIN=$(grep -o 'admin=127.0.0.1:[0-9]*' "$DATA/log" | head -1 | cut -d= -f2)
GRANT_KEY=$("$BIN/cubed" key create demo --data-dir "$DATA/data" | sed -n 's/.*"key_id": *"\([^"]*\)".*/\1/p')
[ -n "$GRANT_KEY" ] || { echo "could not create the grant key" >&2; exit 1; }

for i in $(seq "$RUNS"); do
    model=$([ $((i % 2)) -eq 1 ] && echo connection || echo call)
    "$BIN/cube-load" run --model "$model" --mix audit --duration "$SECS" --users 4 --timeout-ms 10000 \
        --target "$GRPC" --creds "$DATA/data/dev-credentials.json" --grant-key "$GRANT_KEY" \
        --admin "$ADMIN" --json "$DATA/run$i.json" >"$DATA/run$i.out" 2>&1 ||
        { cat "$DATA/run$i.out" >&2; exit 1; }
    python3 - "$DATA/run$i.json" "$i" "$model" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
v = r.get("verified") or {}
problems = v["problems"] if v else ["not verified"]
print(f"run {sys.argv[2]} ({sys.argv[3]}): x_base {r['x_base']}, {r['ops']} ops, ok {r['ok_pct']:.3f}%, "
      f"read back {v.get('writes', 0)} writes, {v.get('sealed', 0)} sealed cells, {v.get('runs', 0)} runs")
bad = []
if r["ops"] == 0:
    bad.append("no ops")
if r["ok"] != r["ops"]:
    bad.append(f"failed ops: {r['failures']}; examples: {r['mismatch_examples'][:3]}")
if problems:
    bad.append(f"verification: {problems[:3]}")
if bad:
    sys.exit("FAIL: " + "; ".join(bad))
EOF
done
echo "$RUNS runs against one server: all ok and verified"
