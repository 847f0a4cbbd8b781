# Sourced by the scripts that test against a real cubed (loadtest/k6/run.sh,
# loadtest/python/test_python_client.sh): one server on loopback, on a fresh temporary data
# directory, stopped when the script exits.
#
# start_cubed NAME [FLAGS...]
#   Needs CUBED (the server binary). Starts `cubed serve` on 127.0.0.1 port 0 with FLAGS and
#   without any CUBE_* variable of the caller's environment, waits up to 30 s for its ready line,
#   and sets:
#     TMP         the script's temporary directory (removed on exit)
#     DATA        the server's data directory ($TMP/data)
#     SERVER_PID  the server's pid (set it to "" once the script has stopped the server itself)
#     READY       the ready line; ADDR and ADMIN: its gRPC and admin addresses (host:port)
#   On exit: SIGTERM, then KILL after 5 s; on failure, the tail of the server's stderr.

# resolve_cubed: CUBED (default: $ROOT/target/debug/cubed) as an absolute path, so the script may
# change directory afterwards.
resolve_cubed() {
  CUBED="${CUBED:-$ROOT/target/debug/cubed}"
  case "$CUBED" in
    /*) ;;
    */*) CUBED="$(cd "$(dirname "$CUBED")" 2>/dev/null && pwd)/$(basename "$CUBED")" || true ;;
    *) CUBED="$(command -v "$CUBED" || echo "$CUBED")" ;;
  esac
}

start_cubed() {
  local name="$1"
  shift
  TMP="$(mktemp -d "${TMPDIR:-/tmp}/cube-$name.XXXXXX")"
  DATA="$TMP/data"
  SERVER_PID=""
  trap _stop_cubed EXIT
  # cubed reads every CUBE_* variable as a flag: one left in the caller's shell (CUBE_NO_DEMO=1,
  # CUBE_AUTH_MODE=call, ...) would reconfigure the test server under the scripts, which pass
  # their settings as FLAGS. env execs cubed, so $! is still the server's pid.
  local unset_cube=() var
  for var in $(compgen -e); do
    if [[ "$var" == CUBE_* ]]; then unset_cube+=(-u "$var"); fi
  done
  env ${unset_cube[@]+"${unset_cube[@]}"} \
    "$CUBED" serve --data-dir "$DATA" --listen 127.0.0.1:0 --admin-listen 127.0.0.1:0 "$@" \
    >"$TMP/server.out" 2>"$TMP/server.err" &
  SERVER_PID=$!
  READY=""
  for _ in $(seq 300); do # up to 30 s
    READY="$(grep -m 1 '^cubed ready: ' "$TMP/server.out" 2>/dev/null || true)"
    [[ -n "$READY" ]] && break
    kill -0 "$SERVER_PID" 2>/dev/null || { echo "$name: cubed exited before it was ready" >&2; exit 1; }
    sleep 0.1
  done
  [[ -n "$READY" ]] || { echo "$name: no ready line from cubed within 30 s" >&2; exit 1; }
  ADDR="$(sed -n 's/.* grpc=\(127\.0\.0\.1:[0-9][0-9]*\) .*/\1/p' <<<"$READY")"
  ADMIN="$(sed -n 's/.* admin=\(127\.0\.0\.1:[0-9][0-9]*\) .*/\1/p' <<<"$READY")"
  [[ -n "$ADDR" && -n "$ADMIN" ]] || { echo "$name: cannot parse the ready line: $READY" >&2; exit 1; }
}

_stop_cubed() {
  local rc=$?
  if [[ -n "$SERVER_PID" ]] && kill -0 "$SERVER_PID" 2>/dev/null; then
    kill -TERM "$SERVER_PID" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$SERVER_PID" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$SERVER_PID" 2>/dev/null || true
    wait "$SERVER_PID" 2>/dev/null || true
  fi
  if [[ $rc -ne 0 && -f "$TMP/server.err" ]]; then
    echo "--- server stderr (last 20 lines)" >&2
    tail -n 20 "$TMP/server.err" >&2 || true
  fi
  rm -rf "$TMP"
}
