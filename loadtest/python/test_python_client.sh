#!/usr/bin/env bash
# End-to-end test of the Python client (loadtest/python/cube_client.py) against a real cubed:
# shows that docs/protocol.md is enough to implement both auth models in another language.
#
#   bash loadtest/python/test_python_client.sh        (from the repository root)
#
# Environment:
#   CUBED        server binary (default: target/debug/cubed; build it first, this script does not)
#   PYTHON       interpreter used to create the venv (default: python3)
#   CUBE_PY_VENV venv holding grpcio and grpcio-tools (default: target/py-venv, reused if ready)
#
# Prints one line per check and ends with "N passed, M failed"; exits non-zero on any failure.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
# shellcheck source=../lib/cubed.sh
source "$ROOT/loadtest/lib/cubed.sh"
resolve_cubed
cd "$ROOT"
CLIENT="$ROOT/loadtest/python/cube_client.py"
export PYTHONDONTWRITEBYTECODE=1 # no __pycache__ in the repository

if [[ ! -x "$CUBED" ]]; then
  echo "test_python_client: no server binary at $CUBED (build it: cargo build --workspace --bins)" >&2
  exit 1
fi

# --- Python with grpcio + grpcio-tools -------------------------------------------------------
VENV="${CUBE_PY_VENV:-$ROOT/target/py-venv}"
has_grpc() { "$1" -c 'import grpc, grpc_tools.protoc' >/dev/null 2>&1; }
if has_grpc "$VENV/bin/python"; then
  PY="$VENV/bin/python"
elif "${PYTHON:-python3}" -m venv "$VENV" >/dev/null 2>&1; then
  PY="$VENV/bin/python"
  "$PY" -m pip install -q --disable-pip-version-check -c "$ROOT/loadtest/python/constraints.txt" grpcio grpcio-tools
else
  # No venv module (e.g. Debian without python3-venv): user site-packages instead.
  PY="$(command -v "${PYTHON:-python3}")"
  has_grpc "$PY" || "$PY" -m pip install -q --user --disable-pip-version-check -c "$ROOT/loadtest/python/constraints.txt" grpcio grpcio-tools
fi

# --- server ----------------------------------------------------------------------------------
start_cubed pyclient
# The caller's own credentials must not stand in for the ones each check passes (the client
# refuses CUBE_TENANT & co. beside --credentials, and reads CUBE_CREDENTIALS for it), nor its
# other cubec variables for the options a check leaves out.
unset CUBE_TENANT CUBE_KEY_ID CUBE_SECRET CUBE_CREDENTIALS CUBE_PROTO_DIR \
  CUBE_ENDPOINT CUBE_CA CUBE_AUTH CUBE_TIMEOUT_SECS
ENDPOINT="http://$ADDR"
DEMO="$DATA/dev-credentials.json"
echo "cubed ready on $ENDPOINT (pid $SERVER_PID)"

# --- checks ----------------------------------------------------------------------------------
PASSED=0
FAILED=0
OUT=""
ERR=""
RC=0
ok() { PASSED=$((PASSED + 1)); echo "ok   $1"; }
bad() { FAILED=$((FAILED + 1)); echo "FAIL $1"; shift; for l in "$@"; do echo "     $l"; done; }

# client ARGS...: runs the Python client; sets OUT, ERR, RC (never aborts the script).
client() {
  RC=0
  OUT="$("$PY" "$CLIENT" --endpoint "$ENDPOINT" "$@" 2>"$TMP/client.err")" || RC=$?
  ERR="$(cat "$TMP/client.err")"
}

# expect_out NAME WANT ARGS...: the client succeeds and prints exactly WANT.
expect_out() {
  local name="$1" want="$2"
  shift 2
  client "$@"
  if [[ $RC -eq 0 && "$OUT" == "$want" ]]; then ok "$name"; else bad "$name" "rc=$RC" "stdout: $OUT" "want:   $want" "stderr: $ERR"; fi
}

# expect_err NAME CODE MESSAGE_PART ARGS...: the client fails with that gRPC code and message.
expect_err() {
  local name="$1" code="$2" part="$3"
  shift 3
  client "$@"
  if [[ $RC -ne 0 && "$ERR" == *"error: $code: "*"$part"* ]]; then ok "$name"; else bad "$name" "rc=$RC" "stdout: $OUT" "stderr: $ERR" "want:   $code ... $part"; fi
}

# expect_ok_json NAME ARGS...: the client exits 0 and prints JSON with "ok":true.
expect_ok_json() {
  local name="$1"
  shift
  client "$@"
  if [[ $RC -eq 0 && "$OUT" == *'"ok":true'* ]]; then ok "$name"; else bad "$name" "rc=$RC" "stdout: $OUT" "stderr: $ERR"; fi
}

# 1. published test vectors (no server involved)
expect_out "test vectors (call sig, hello mac, server_mac)" \
  '{"call_sig":"a5befc7529906f3b79aec5655c8d4ab40a30a1d6a13db8bf42672603dfa873d3","hello_mac":"4e59e4f5651ca616f5fadb65366b4417ed8befee0abbc9aa9dbcac7a1f39919f","server_mac":"9bdd978c20c9c34e1f430029653caa565806164a01e6446b0e679e2c4e1153be","test_vectors":"ok"}' \
  selfcheck

# 2. dev-credentials.json has the documented shape and the ready line's endpoint
if "$PY" - "$DEMO" "$ENDPOINT" <<'EOF'
import json, os, re, stat, sys
path, endpoint = sys.argv[1], sys.argv[2]
d = json.load(open(path))
assert d["tenant"] == "demo", d["tenant"]
assert re.fullmatch(r"k-[0-9a-f]{12}", d["key_id"]), d["key_id"]
assert re.fullmatch(r"[0-9a-f]{64}", d["secret"]), "secret is not 64 lowercase hex"
assert d["endpoint"] == endpoint, (d["endpoint"], endpoint)
assert stat.S_IMODE(os.stat(path).st_mode) == 0o600, oct(os.stat(path).st_mode)
EOF
then ok "dev-credentials.json: shape, mode 0600, endpoint of the ready line"; else bad "dev-credentials.json: shape, mode 0600, endpoint of the ready line"; fi

# 2b. credentials from the environment: all three or none, never beside --credentials
CUBE_TENANT=demo expect_err "credentials: CUBE_TENANT alone is refused" ValueError \
  "CUBE_TENANT set without CUBE_KEY_ID, CUBE_SECRET" read 1 1 1
CUBE_TENANT= CUBE_KEY_ID= CUBE_SECRET= expect_err "credentials: empty variables are refused" ValueError \
  "CUBE_TENANT, CUBE_KEY_ID, CUBE_SECRET set but empty" read 1 1 1
CUBE_TENANT=demo CUBE_KEY_ID=k-000000000000 CUBE_SECRET=00 expect_err \
  "credentials: the environment beside --credentials is refused" ValueError \
  "--credentials (or CUBE_CREDENTIALS) and CUBE_TENANT, CUBE_KEY_ID, CUBE_SECRET both given" --credentials "$DEMO" read 1 1 1
# CUBE_CREDENTIALS stands for --credentials (it was ignored, and ./cube-data's file read instead)
CUBE_CREDENTIALS="$TMP/no-such-credentials.json" expect_err "credentials: CUBE_CREDENTIALS is read" \
  FileNotFoundError "no-such-credentials.json" read 1 1 1

# 2c. no silent plaintext: an endpoint without a scheme, and --ca beside an http:// endpoint
expect_err "an endpoint without a scheme is refused" ValueError "must start with http:// (plaintext) or https://" \
  --credentials "$DEMO" --endpoint 127.0.0.1:1 read 1 1 1
expect_err "--ca beside a plaintext endpoint is refused" ValueError "but '$ENDPOINT' is plaintext" \
  --credentials "$DEMO" --ca "$DEMO" read 1 1 1

# 2d. cubec's variables for the other options: the command line, then the variable, then (the
#     endpoint) the credentials file
CUBE_AUTH=bogus expect_err "options: CUBE_AUTH is read" ValueError "CUBE_AUTH must be call or connection" \
  --credentials "$DEMO" read 1 1 1
CUBE_AUTH=bogus expect_err "options: --auth comes before CUBE_AUTH" FileNotFoundError "no-such-credentials.json" \
  --credentials "$TMP/no-such-credentials.json" --auth call read 1 1 1
CUBE_TIMEOUT_SECS=1.5 expect_err "options: CUBE_TIMEOUT_SECS is read (whole seconds)" ValueError \
  "CUBE_TIMEOUT_SECS must be a whole number of seconds" --credentials "$DEMO" read 1 1 1
# Not through client(), which passes --endpoint.
RC=0
ERR="$(CUBE_ENDPOINT=127.0.0.1:1 "$PY" "$CLIENT" --credentials "$DEMO" read 1 1 1 2>&1 >/dev/null)" || RC=$?
if [[ $RC -ne 0 && "$ERR" == *"got '127.0.0.1:1'"* ]]; then
  ok "options: CUBE_ENDPOINT comes before the credentials file's endpoint"
else
  bad "options: CUBE_ENDPOINT comes before the credentials file's endpoint" "rc=$RC" "stderr: $ERR"
fi
CUBE_ENDPOINT=127.0.0.1:1 CUBE_CA="$DEMO" expect_out \
  "options: --endpoint comes before CUBE_ENDPOINT; CUBE_CA beside an http:// endpoint is not used" \
  '{"found":false,"sealed":false,"value":"","version":0}' --credentials "$DEMO" read 9 9 9

# 3-4. per-call signing
# seq 2: demo's log starts with its tenant.create event.
expect_out "per-call: write (1,-2,3)" '{"seq":2,"version":1}' \
  --credentials "$DEMO" --auth call write 1 -2 3 hello-call
expect_out "per-call: read (1,-2,3)" '{"found":true,"sealed":false,"value":"hello-call","version":1}' \
  --credentials "$DEMO" --auth call read 1 -2 3

# 5-6. per-connection handshake (Challenge + Hello, server_mac checked, unsigned calls after)
expect_out "per-connection: write (1,-2,3) with expected_version 1" '{"seq":3,"version":2}' \
  --credentials "$DEMO" --auth connection write 1 -2 3 hello-conn --expected-version 1
expect_out "per-connection: read (1,-2,3)" '{"found":true,"sealed":false,"value":"hello-conn","version":2}' \
  --credentials "$DEMO" --auth connection read 1 -2 3

# 7. the session belongs to one channel: 64 concurrent unsigned calls pass on it, a second
#    channel (own subchannel pool) is refused, a challenge cannot be answered on another channel
expect_ok_json "per-connection: session bound to its channel (local subchannel pool)" \
  --credentials "$DEMO" conncheck --concurrency 64

# 8. per-call: a replayed call and a signature for another method are refused
expect_ok_json "per-call: replayed nonce and wrong method path refused" \
  --credentials "$DEMO" replaycheck

# 9-10. a wrong secret gets UNAUTHENTICATED in both models
"$PY" - "$DEMO" "$TMP/bad-secret.json" <<'EOF'
import json, sys
d = json.load(open(sys.argv[1]))
d["secret"] = format(int(d["secret"], 16) ^ 1, "064x")  # one bit off
json.dump(d, open(sys.argv[2], "w"))
EOF
expect_err "per-call: bad secret -> UNAUTHENTICATED" UNAUTHENTICATED "x-cube-sig does not match" \
  --credentials "$TMP/bad-secret.json" --auth call read 1 -2 3
expect_err "per-connection: bad secret -> UNAUTHENTICATED at Hello" UNAUTHENTICATED "mac does not match" \
  --credentials "$TMP/bad-secret.json" --auth connection read 1 -2 3


# 11. a second tenant, created through the running server's admin socket
ACME="$TMP/acme.json"
if "$CUBED" tenant create acme --data-dir "$DATA" >"$ACME" 2>"$TMP/tenant.err" &&
  "$PY" -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["tenant"]=="acme" and len(d["secret"])==64' "$ACME" 2>/dev/null; then
  ok "cubed tenant create acme (server running)"
else
  # Not stdout: it holds the new key's secret.
  bad "cubed tenant create acme (server running)" "stderr: $(cat "$TMP/tenant.err")"
fi

# 12-17. tenant isolation: same coordinate, separate data, keys not interchangeable
expect_out "isolation: acme (per-call) does not see demo's cell" '{"found":false,"sealed":false,"value":"","version":0}' \
  --credentials "$ACME" --auth call read 1 -2 3
expect_out "isolation: acme (per-connection) does not see demo's cell" '{"found":false,"sealed":false,"value":"","version":0}' \
  --credentials "$ACME" --auth connection read 1 -2 3
# seq 2: the audit event of "tenant create" is record 1 of acme's log.
expect_out "isolation: acme writes its own (1,-2,3) as version 1" '{"seq":2,"version":1}' \
  --credentials "$ACME" --auth connection write 1 -2 3 acme-value --expected-version 0
expect_out "isolation: demo's (1,-2,3) is unchanged" '{"found":true,"sealed":false,"value":"hello-conn","version":2}' \
  --credentials "$DEMO" --auth call read 1 -2 3
"$PY" - "$ACME" "$DEMO" "$TMP/cross.json" <<'EOF'
import json, sys
acme, demo = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
acme["tenant"] = demo["tenant"]  # acme's key and secret, claiming tenant demo
json.dump(acme, open(sys.argv[3], "w"))
EOF
expect_err "isolation: acme's key cannot act for tenant demo (per-call)" UNAUTHENTICATED "unknown or revoked key" \
  --credentials "$TMP/cross.json" --auth call read 1 -2 3
expect_err "isolation: acme's key cannot act for tenant demo (per-connection)" UNAUTHENTICATED "unknown or revoked key" \
  --credentials "$TMP/cross.json" --auth connection read 1 -2 3

# 18. SIGTERM: the server drains, syncs and exits 0
kill -TERM "$SERVER_PID"
SERVER_RC=""
for _ in $(seq 300); do # up to 30 s
  if ! kill -0 "$SERVER_PID" 2>/dev/null; then
    SERVER_RC=0
    wait "$SERVER_PID" || SERVER_RC=$?
    break
  fi
  sleep 0.1
done
if [[ "$SERVER_RC" == "0" ]]; then
  ok "SIGTERM: cubed exited 0"
else
  bad "SIGTERM: cubed exited 0" "exit status: ${SERVER_RC:-still running after 30 s}"
fi
if [[ -n "$SERVER_RC" ]]; then SERVER_PID=""; fi

echo "$PASSED passed, $FAILED failed"
[[ $FAILED -eq 0 ]]
