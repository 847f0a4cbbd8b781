#!/usr/bin/env bash
# Proves that deploy/ is real: the Prometheus config and alert rules pass promtool, a live cubed's
# /metrics passes `promtool check metrics`, and every query of every Grafana dashboard in
# deploy/grafana/dashboards/ and every alert rule's expression (its threshold taken off) returns
# data from a real Prometheus scraping a real cubed under load.
#
#   bash deploy/check-dashboards.sh          # from anywhere; uses target/debug/{cubed,cubec}
#   CUBED=... CUBEC=... bash deploy/check-dashboards.sh
#
# Needs promtool and prometheus (installs Debian's `prometheus` package with apt-get when promtool
# is missing; that needs root), curl and python3. Does not use a prometheus service: it runs its
# own prometheus on a free loopback port, with its data in a temporary directory.
# Ends with "N passed, M failed"; exits non-zero on any failure. Takes about 40 s.
set -euo pipefail
cd "$(dirname "$0")/.."

CUBED=${CUBED:-target/debug/cubed}
CUBEC=${CUBEC:-target/debug/cubec}
LOAD_SECONDS=${LOAD_SECONDS:-25}
# Grafana's $__rate_interval, $__interval, $__range ... are evaluated as this range.
RANGE=1m

passed=0
failed=0
summary_done=0
TMP=""
CUBED_PID=""
PROM_PID=""
LOAD_PIDS=()

ok() { printf 'ok   %s\n' "$*"; passed=$((passed + 1)); }
fail() { printf 'FAIL %s\n' "$*"; failed=$((failed + 1)); }
# A failure that leaves nothing further to check: report it, then exit (the trap cleans up).
die() { fail "$*"; exit 1; }

summary() {
    if [ "$summary_done" = 0 ]; then
        summary_done=1
        echo "$passed passed, $failed failed"
    fi
}

# Stops cubed with SIGTERM and checks that it exits 0 (it drains calls and syncs tenants first).
stop_cubed() {
    [ -n "$CUBED_PID" ] || return 0
    local pid=$CUBED_PID rc=0 i
    CUBED_PID=""
    kill -TERM "$pid" 2>/dev/null || true
    for ((i = 0; i < 300; i++)); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    if kill -0 "$pid" 2>/dev/null; then
        kill -KILL "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
        fail "cubed did not exit within 30 s of SIGTERM (killed)"
        return 1
    fi
    wait "$pid" 2>/dev/null || rc=$?
    if [ "$rc" != 0 ]; then
        fail "cubed exited with status $rc after SIGTERM"
        [ -n "$TMP" ] && tail -n 20 "$TMP/cubed.log" >&2 || true
        return 1
    fi
    return 0
}

stop_prometheus() {
    [ -n "$PROM_PID" ] || return 0
    local pid=$PROM_PID
    PROM_PID=""
    kill -TERM "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
}

cleanup() {
    local rc=$?
    set +e
    local pid
    for pid in "${LOAD_PIDS[@]}"; do
        kill -TERM "$pid" 2>/dev/null
    done
    for pid in "${LOAD_PIDS[@]}"; do
        wait "$pid" 2>/dev/null
    done
    stop_prometheus
    stop_cubed || rc=1
    [ -n "$TMP" ] && rm -rf "$TMP"
    if [ "$rc" != 0 ] && [ "$failed" = 0 ]; then
        fail "aborted (exit status $rc)"
    fi
    summary
    if [ "$failed" != 0 ] && [ "$rc" = 0 ]; then
        rc=1
    fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# --- 1. tools ----------------------------------------------------------------------------------
missing=()
command -v promtool >/dev/null 2>&1 && command -v prometheus >/dev/null 2>&1 || missing+=(prometheus)
command -v curl >/dev/null 2>&1 || missing+=(curl)
command -v python3 >/dev/null 2>&1 || missing+=(python3)
if [ "${#missing[@]}" -gt 0 ]; then
    echo "== installing ${missing[*]} (apt-get)"
    . loadtest/lib/apt.sh
    apt_install_no_services "${missing[@]}" || die "could not install ${missing[*]}"
fi
for tool in promtool prometheus curl python3; do
    command -v "$tool" >/dev/null 2>&1 || die "$tool not found after installing"
done
[ -x "$CUBED" ] || die "cubed not found at $CUBED (build it: cargo build --workspace --bins, or set CUBED)"
[ -x "$CUBEC" ] || die "cubec not found at $CUBEC (build it: cargo build --workspace --bins, or set CUBEC)"
CUBED=$(cd "$(dirname "$CUBED")" && pwd)/$(basename "$CUBED")
CUBEC=$(cd "$(dirname "$CUBEC")" && pwd)/$(basename "$CUBEC")
echo "== $(promtool --version 2>&1 | head -n 1)"

TMP=$(mktemp -d -t cube-dashboards.XXXXXX)

# --- 2. promtool on the shipped config and rules -------------------------------------------------
# promtool resolves rule_files relative to the config file's directory, so alerts.yml is found.
if out=$(promtool check config deploy/prometheus/prometheus.yml 2>&1); then
    ok "promtool check config deploy/prometheus/prometheus.yml"
else
    printf '%s\n' "$out" >&2
    fail "promtool check config deploy/prometheus/prometheus.yml"
fi
if out=$(promtool check rules deploy/prometheus/alerts.yml 2>&1); then
    ok "promtool check rules deploy/prometheus/alerts.yml ($(grep -o '[0-9]* rules found' <<<"$out" | head -n 1))"
else
    printf '%s\n' "$out" >&2
    fail "promtool check rules deploy/prometheus/alerts.yml"
fi

# --- 3. cubed ----------------------------------------------------------------------------------
: >"$TMP/cubed.log"
"$CUBED" serve --data-dir "$TMP/data" --listen 127.0.0.1:0 --admin-listen 127.0.0.1:0 \
    >"$TMP/cubed.log" 2>&1 </dev/null &
CUBED_PID=$!
ready=""
for ((i = 0; i < 300; i++)); do
    ready=$(grep -m 1 '^cubed ready: ' "$TMP/cubed.log" 2>/dev/null || true)
    [ -n "$ready" ] && break
    kill -0 "$CUBED_PID" 2>/dev/null || break
    sleep 0.1
done
if [ -z "$ready" ]; then
    tail -n 20 "$TMP/cubed.log" >&2
    die "cubed did not print its ready line within 30 s"
fi
GRPC=$(sed -n 's/.* grpc=\([^ ]*\).*/\1/p' <<<"$ready")
ADMIN=$(sed -n 's/.* admin=\([^ ]*\).*/\1/p' <<<"$ready")
[ -n "$GRPC" ] && [ -n "$ADMIN" ] || die "cannot parse the ready line: $ready"
CREDS=$TMP/data/dev-credentials.json
[ -s "$CREDS" ] || die "cubed did not write $CREDS"
echo "== cubed: grpc=$GRPC admin=$ADMIN"

# The same credentials with another 64-hex secret: every call with it is refused.
python3 - "$CREDS" "$TMP/bad-credentials.json" <<'EOF'
import json, sys
creds = json.load(open(sys.argv[1]))
bad = "0123456789abcdef" * 4
creds["secret"] = bad if creds["secret"] != bad else "fedcba9876543210" * 4
json.dump(creds, open(sys.argv[2], "w"))
EOF

# --- 5. prometheus -----------------------------------------------------------------------------
# The shipped alert rules are loaded too, so that section 7 can check them against real data.
cp deploy/prometheus/alerts.yml "$TMP/alerts.yml"
cat >"$TMP/prometheus.yml" <<EOF
global:
  scrape_interval: 1s
  scrape_timeout: 1s
  evaluation_interval: 1s
rule_files:
  - alerts.yml
scrape_configs:
  - job_name: cubed
    scrape_interval: 1s
    metrics_path: /metrics
    static_configs:
      - targets: ['$ADMIN']
EOF
free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
PROM=""
for attempt in 1 2 3; do
    port=$(free_port)
    prometheus --config.file="$TMP/prometheus.yml" --storage.tsdb.path="$TMP/prometheus-data" \
        --web.listen-address="127.0.0.1:$port" --log.level=warn \
        >"$TMP/prometheus.log" 2>&1 </dev/null &
    PROM_PID=$!
    for ((i = 0; i < 300; i++)); do
        kill -0 "$PROM_PID" 2>/dev/null || break
        if curl -fsS -o /dev/null "http://127.0.0.1:$port/-/ready" 2>/dev/null; then
            PROM="http://127.0.0.1:$port"
            break
        fi
        sleep 0.1
    done
    [ -n "$PROM" ] && break
    stop_prometheus
    tail -n 5 "$TMP/prometheus.log" >&2
    echo "prometheus did not become ready on port $port (attempt $attempt)" >&2
done
[ -n "$PROM" ] || die "prometheus did not start"
echo "== prometheus: $PROM"

# Instant query: prints the number of series (a scalar counts as one) and how many of them are NaN
# (a histogram_quantile over no observations, which Grafana draws as nothing); exits 1 with the
# error.
query() {
    curl -sS --max-time 10 "$PROM/api/v1/query" --data-urlencode "query${1}" | python3 -c '
import json, sys
try:
    r = json.load(sys.stdin)
except ValueError as e:
    print("bad answer from prometheus: %s" % e); sys.exit(1)
if r.get("status") != "success":
    print("%s: %s" % (r.get("errorType"), r.get("error"))); sys.exit(1)
d = r["data"]
if d["resultType"] == "vector":
    values = [s["value"][1] for s in d["result"]]
elif d["resultType"] == "matrix":
    values = [s["values"][-1][1] for s in d["result"] if s["values"]]
else:
    values = [d["result"][1]]
print(len(values), sum(1 for v in values if v.lower() == "nan"))
'
}

# Wait for the first successful scrape of cubed.
scraped=0
for ((i = 0; i < 100; i++)); do
    if [ "$(query '=up{job="cubed"} == 1' 2>/dev/null || true)" = "1 0" ]; then
        scraped=1
        break
    fi
    sleep 0.1
done
[ "$scraped" = 1 ] || die "prometheus does not scrape cubed at $ADMIN"

# --- 6. load in both auth models -----------------------------------------------------------------
cubec() { # AUTH CREDENTIALS ARGS...
    local auth=$1 creds=$2
    shift 2
    "$CUBEC" --credentials "$creds" --endpoint "http://$GRPC" --auth "$auth" "$@"
}
# Write, read, overwrite, read, delete, read (not found), audit list; counts calls that fail.
load_loop() { # AUTH ID
    local auth=$1 id=$2 n=0 good=0 bad=0 end=$((SECONDS + LOAD_SECONDS)) cmd
    while ((SECONDS < end)); do
        n=$((n + 1))
        for cmd in "write $id $n 7 v$n" "read $id $n 7" "write $id $n 7 w$n" "read $id $n 7" \
            "delete $id $n 7" "read $id $n 7" "audit list --limit 5"; do
            # shellcheck disable=SC2086 # cmd is split into arguments on purpose
            if cubec "$auth" "$CREDS" $cmd >/dev/null 2>>"$TMP/load-$auth-$id.err"; then
                good=$((good + 1))
            else
                bad=$((bad + 1))
            fi
        done
    done
    echo "$auth $good $bad" >"$TMP/load-$auth-$id.count"
}
# Calls with the wrong secret, spread over the whole load: signed calls (counted in
# cube_auth_failures_total{reason="bad_signature"}) and refused handshakes. About 15 per 10 s,
# well under --auth-failure-limit (50 per 10 s per address, which would throttle 127.0.0.1).
bad_loop() {
    local n=0 accepted=0 end=$((SECONDS + LOAD_SECONDS))
    while ((SECONDS < end)); do
        n=$((n + 1))
        if cubec call "$TMP/bad-credentials.json" write 9 9 "$n" nope >/dev/null 2>&1; then
            accepted=$((accepted + 1))
        fi
        if ((n % 2 == 0)) && cubec connection "$TMP/bad-credentials.json" read 9 9 "$n" >/dev/null 2>&1; then
            accepted=$((accepted + 1))
        fi
        sleep 1
    done
    echo "wrong-secret $n $accepted" >"$TMP/load-bad.count"
}
echo "== load: ${LOAD_SECONDS}s of write/read/delete/audit with --auth call and --auth connection, plus wrong-secret calls"
load_loop call 1 &
LOAD_PIDS+=($!)
load_loop call 2 &
LOAD_PIDS+=($!)
load_loop connection 3 &
LOAD_PIDS+=($!)
load_loop connection 4 &
LOAD_PIDS+=($!)
bad_loop &
LOAD_PIDS+=($!)
for pid in "${LOAD_PIDS[@]}"; do
    wait "$pid" || fail "a load loop (pid $pid) exited with an error"
done
LOAD_PIDS=()
for n in call-1 call-2 connection-3 connection-4; do
    [ -s "$TMP/load-$n.count" ] || fail "the load loop $n left no count (it died before its end)"
done
[ -s "$TMP/load-bad.count" ] || fail "the wrong-secret loop left no count (it died before its end)"
for auth in call connection; do
    good=0
    bad=0
    for f in "$TMP"/load-"$auth"-*.count; do
        read -r _ g b <"$f"
        good=$((good + g))
        bad=$((bad + b))
    done
    echo "   --auth $auth: $good calls succeeded, $bad failed"
    if [ "$bad" -gt 0 ]; then
        sort "$TMP"/load-"$auth"-*.err | uniq -c | sort -rn | head -n 3 >&2
        fail "--auth $auth: $bad calls of the load failed (a dashboard could still show data)"
    elif [ "$good" = 0 ]; then
        fail "--auth $auth: no call of the load succeeded"
    fi
done
read -r _ n accepted <"$TMP/load-bad.count"
echo "   wrong secret: $n rounds, $accepted calls accepted (expected 0)"
[ "$accepted" = 0 ] || fail "cubed accepted $accepted calls made with a wrong secret"
sleep 2.5 # the last scrapes

# --- 4. promtool check metrics (on a scrape taken after the load: every metric family exists) ---
if ! curl -fsS --max-time 10 "http://$ADMIN/metrics" >"$TMP/metrics.txt"; then
    fail "scrape http://$ADMIN/metrics"
elif [ ! -s "$TMP/metrics.txt" ]; then
    fail "scrape http://$ADMIN/metrics: empty"
else
    families=$(grep -c '^# TYPE ' "$TMP/metrics.txt" || true)
    if out=$(promtool check metrics <"$TMP/metrics.txt" 2>&1); then
        ok "promtool check metrics ($families metric families)"
        if [ -n "$out" ]; then
            echo "     lint warnings (non-fatal, promtool exited 0):"
            printf '%s\n' "$out" | sed 's/^/       /'
        fi
    else
        printf '%s\n' "$out" | sed 's/^/       /'
        fail "promtool check metrics ($families metric families)"
    fi
fi

# --- 7. every dashboard query -------------------------------------------------------------------
mkdir "$TMP/queries"
python3 - "$TMP/queries" "$RANGE" deploy/grafana/dashboards/*.json <<'EOF'
import json, os, re, sys

out_dir, rng = sys.argv[1], sys.argv[2]
secs = {"s": 1, "m": 60, "h": 3600, "d": 86400}[rng[-1]] * int(rng[:-1])
builtin = {
    "__rate_interval": rng, "__interval": rng, "__range": rng, "__auto": rng,
    "__range_s": str(secs), "__range_ms": str(secs * 1000),
    "__interval_ms": str(secs * 1000), "__rate_interval_ms": str(secs * 1000),
}
var_re = re.compile(r"\$\{(\w+)(?::[^}]*)?\}|\[\[(\w+)(?::[^\]]*)?\]\]|\$(\w+)")


def panels(ps):
    for p in ps or []:
        yield p
        yield from panels(p.get("panels"))


n = 0
manifest = open(os.path.join(out_dir, "manifest"), "w")
for path in sys.argv[3:]:
    name = os.path.splitext(os.path.basename(path))[0]
    dash = json.load(open(path))
    variables = {}
    for v in (dash.get("templating") or {}).get("list") or []:
        if v.get("type") in ("interval",):
            variables[v["name"]] = rng
        else:
            cur = (v.get("current") or {}).get("value")
            if isinstance(cur, list):
                cur = "|".join(cur)
            variables[v["name"]] = ".*" if cur in (None, "", "$__all", "All") else str(cur)

    def subst(m):
        var = m.group(1) or m.group(2) or m.group(3)
        if var[0].isdigit():  # $1 in label_replace is PromQL, not Grafana
            return m.group(0)
        if var in builtin:
            return builtin[var]
        if var in variables:
            return variables[var]
        if var.startswith("__"):
            return rng
        return ".*"

    for p in panels(dash.get("panels")):
        for t in p.get("targets") or []:
            if "expr" not in t:
                continue
            n += 1
            expr = var_re.sub(subst, t["expr"] or "")
            with open(os.path.join(out_dir, "%03d.promql" % n), "w") as f:
                f.write(expr)
            title = " ".join(str(p.get("title") or "(untitled)").split())
            ref = t.get("refId") or "?"
            manifest.write("%03d\t%s\t%s [%s]\n" % (n, name, title, ref))
manifest.close()
if n == 0:
    sys.exit("no panel target with an expr in " + " ".join(sys.argv[3:]))
EOF
# One query that must return data: ok, or fail naming why, with the expression.
expect_data() { # LABEL EXPR
    local label=$1 expr=$2 res series nans
    if ! res=$(query "=$expr" 2>&1); then
        fail "$label: $res"
        echo "       $expr"
        return
    fi
    read -r series nans <<<"$res"
    if [ "$series" = 0 ]; then
        fail "$label: empty result"
        echo "       $expr"
    elif [ "$nans" = "$series" ]; then
        fail "$label: every series is NaN ($series series)"
        echo "       $expr"
    elif [ "$nans" != 0 ]; then
        ok "$label ($series series, $nans of them NaN)"
    else
        ok "$label ($series series)"
    fi
}

echo "== $(wc -l <"$TMP/queries/manifest") dashboard queries, Grafana variables as $RANGE"
while IFS=$'\t' read -r id dash title; do
    qfile=$TMP/queries/$id.promql
    if [ ! -s "$qfile" ]; then
        fail "$dash: $title: empty expr"
        continue
    fi
    expect_data "$dash: $title" "$(cat "$qfile")"
done <"$TMP/queries/manifest"

# --- 7b. every alert rule's expression, without its threshold --------------------------------
# `promtool check rules` checks syntax only: an alert on a misspelt metric or label value would
# pass it and never fire. So each rule, as this Prometheus loaded it, must evaluate without error
# and, with its final comparison against a number taken off (`... > 0.05`, `... == 0`), return
# data from the cubed it scrapes.
curl -sS --max-time 10 "$PROM/api/v1/rules" | python3 -c '
import json, re, sys
r = json.load(sys.stdin)
if r.get("status") != "success":
    sys.exit("rules api: %s" % r.get("error"))
threshold = re.compile(r"\s*(==|!=|>=|<=|>|<)\s*(bool\s+)?[0-9.eE+\-*\s]+$")
one_line = lambda text: " ".join(str(text).split())
for g in r["data"]["groups"]:
    for rule in g["rules"]:
        if rule.get("type") != "alerting":
            continue
        print("%s\t%s\t%s\t%s" % (rule["name"], rule.get("health", "?"),
                                    one_line(rule.get("lastError") or "-"),
                                    threshold.sub("", one_line(rule["query"]))))
' >"$TMP/rules.tsv" || fail "read the loaded alert rules from $PROM/api/v1/rules"
expected=$(grep -c '^ *- alert: ' deploy/prometheus/alerts.yml || true)
[ "$expected" -gt 0 ] || fail "deploy/prometheus/alerts.yml holds no alert rule"
loaded=$(wc -l <"$TMP/rules.tsv")
if [ "$loaded" != "$expected" ]; then
    fail "prometheus loaded $loaded alert rules, deploy/prometheus/alerts.yml has $expected"
fi
while IFS=$'\t' read -r name health err expr; do
    if [ "$health" = unknown ]; then
        fail "alert $name: not evaluated yet (prometheus evaluates rules every second here)"
        continue
    elif [ "$health" != ok ]; then
        fail "alert $name: evaluation health '$health' ($err)"
        continue
    fi
    expect_data "alert $name, its threshold taken off" "$expr"
done <"$TMP/rules.tsv"

# --- 8. shut down (the trap does the same on any other exit) -----------------------------------
stop_prometheus
stop_cubed && echo "== cubed exited 0 on SIGTERM"
summary
[ "$failed" = 0 ]
