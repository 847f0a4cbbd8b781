#!/usr/bin/env bash
# Proves that deploy/ is real: the Prometheus config and alert rules pass promtool, a live cubed's
# /metrics passes `promtool check metrics`, and every query of every Grafana dashboard in
# deploy/grafana/dashboards/ and every alert rule's expression (its threshold taken off) returns
# data from a real Prometheus, run with the shipped deploy/prometheus/prometheus.yml (its target
# and intervals replaced), scraping a real cubed under load; and every metric and label name those
# expressions use is one that cubed exports.
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
# With TLS (--tls-dev), so that the TLS series the alert rules use exist.
: >"$TMP/cubed.log"
"$CUBED" serve --data-dir "$TMP/data" --listen 127.0.0.1:0 --admin-listen 127.0.0.1:0 --tls-dev \
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
# The shipped deploy/prometheus/prometheus.yml with only its target (cubed:9464, the compose
# service) replaced by this cubed's admin address and every interval set to 1 s, so that its job
# name, metrics_path and rule_files are the ones checked: a wrong metrics_path or job name fails
# the wait for the first scrape below, which selects job="cubed" as the alert rules do, and a
# rule_files entry that does not name alerts.yml (copied next to the config, where the relative
# path finds it) loads no rule, which section 7b fails on. The shipped rules are so loaded too,
# so that section 7b can check them against real data.
cp deploy/prometheus/alerts.yml "$TMP/alerts.yml"
python3 - deploy/prometheus/prometheus.yml "$TMP/prometheus.yml" "$ADMIN" <<'EOF' ||
import re, sys
src, dst, admin = sys.argv[1:]
text = open(src).read()
text, n = re.subn(r"""^(\s*-\s*)(['"]?)cubed:9464\2[ \t]*$""", lambda m: m.group(1) + admin,
                  text, flags=re.M)
if n != 1:
    sys.exit("%s: %d scrape targets cubed:9464, expected one" % (src, n))
text, n = re.subn(r"^(\s*(?:scrape_interval|scrape_timeout|evaluation_interval):[ \t]*)\S+",
                  lambda m: m.group(1) + "1s", text, flags=re.M)
if n == 0:
    sys.exit("%s: no scrape_interval or evaluation_interval" % src)
open(dst, "w").write(text)
EOF
    die "cannot make a Prometheus configuration from deploy/prometheus/prometheus.yml"
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
if [ "$scraped" = 0 ]; then
    # What prometheus made of the shipped scrape job: its name, URL and last error.
    curl -sS --max-time 10 "$PROM/api/v1/targets" | python3 -c '
import json, sys
for t in json.load(sys.stdin)["data"]["activeTargets"]:
    print("   target job=%s %s: %s %s" % (t["labels"].get("job"), t["scrapeUrl"], t["health"],
                                        t.get("lastError") or ""))
' >&2 || true
    die "prometheus does not scrape cubed at $ADMIN as job \"cubed\" (deploy/prometheus/prometheus.yml: job_name, metrics_path)"
fi

# --- 6. load in both auth models -----------------------------------------------------------------
cubec() { # AUTH CREDENTIALS ARGS...
    local auth=$1 creds=$2
    shift 2
    "$CUBEC" --credentials "$creds" --endpoint "https://$GRPC" --ca "$TMP/data/tls/ca.pem" \
        --auth "$auth" "$@"
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
# The expressions as written (Grafana variables and all), for the name check of section 7c.
names = open(os.path.join(out_dir, "names.tsv"), "w")
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
            names.write("%s: %s [%s]\t%s\n" % (name, title, ref,
                                                 re.sub(r"[\t\r\n]", " ", t["expr"] or "")))
manifest.close()
names.close()
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
# and, with a final `or absent(...)` (which returns nothing while cubed is scraped) and then its
# final comparison against a number taken off (`... > 0.05`, `... == 0`), return data from the
# cubed it scrapes. (An `or vector(0)` returns data whatever the metric is called: section 7c
# checks the names.)
: >"$TMP/alert-names.tsv"
curl -sS --max-time 10 "$PROM/api/v1/rules" | python3 -c '
import json, re, sys
r = json.load(sys.stdin)
if r.get("status") != "success":
    sys.exit("rules api: %s" % r.get("error"))
absent = re.compile(r"\s+or\s+absent\((?:[^()]|\([^()]*\))*\)$")
threshold = re.compile(r"\s*(==|!=|>=|<=|>|<)\s*(bool\s+)?[0-9.eE+\-*\s]+$")
one_line = lambda text: " ".join(str(text).split())
names = open(sys.argv[1], "w")
for g in r["data"]["groups"]:
    for rule in g["rules"]:
        if rule.get("type") != "alerting":
            continue
        print("%s\t%s\t%s\t%s" % (rule["name"], rule.get("health", "?"),
                                    one_line(rule.get("lastError") or "-"),
                                    threshold.sub("", absent.sub("", one_line(rule["query"])))))
        names.write("alert %s\t%s\n" % (rule["name"], one_line(rule["query"])))
' "$TMP/alert-names.tsv" >"$TMP/rules.tsv" || fail "read the loaded alert rules from $PROM/api/v1/rules"
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

# --- 7c. every metric and label name, against the scrape of section 4 ---------------------------
# A query that returns data can still hold a typo: in one half of an `or` whose other half has
# data, in a `!=` or `!~` matcher on a misspelt label (which every series matches), in a
# `by (...)` label that no series has. So every metric name and every label name in a matcher or
# in a by/without/on/ignoring/group_left/group_right list, of every dashboard query (as written,
# Grafana variables skipped) and every alert rule, must be exported by cubed: a metric as a series
# name of the scrape (a histogram x as x_bucket, x_sum, x_count; `up` and Prometheus' other
# scrape series too), a label on some series of the metric it selects (in a list: of the metrics
# it aggregates, or of the whole expression) or one of job, instance, le, __name__.
cat >"$TMP/names.py" <<'EOF'
# names.py METRICS_TXT EXPRS_TSV...: every metric and label name that the expressions use (one
# "LABEL<TAB>EXPR" a line) must be exported in METRICS_TXT (a /metrics scrape). A query that returns
# data can still hold a typo: one half of an `or` whose other half has data, a `!=`/`!~` matcher
# on a misspelt label (which matches every series), a `by (...)` label no series has. Prints
# "names<TAB>N expressions ..." and exits 0, or one "LABEL<TAB>PROBLEM<TAB>EXPR" line per problem
# and exits 1.
import re
import sys

# Labels Prometheus adds or uses itself.
BUILTIN_LABELS = {"job", "instance", "le", "__name__"}
# Series Prometheus records for each target.
SYNTHETIC = ("up", "scrape_duration_seconds", "scrape_samples_scraped",
             "scrape_samples_post_metric_relabeling", "scrape_series_added")
AGGREGATIONS = {"sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values",
                "bottomk", "topk", "quantile", "limitk", "limit_ratio"}
FUNCTIONS = AGGREGATIONS | {
    "abs", "absent", "absent_over_time", "acos", "acosh", "asin", "asinh", "atan", "atanh",
    "avg_over_time", "ceil", "changes", "clamp", "clamp_max", "clamp_min", "cos", "cosh",
    "count_over_time", "day_of_month", "day_of_week", "day_of_year", "days_in_month", "deg",
    "delta", "deriv", "double_exponential_smoothing", "end", "exp", "floor", "histogram_avg",
    "histogram_count", "histogram_fraction", "histogram_quantile", "histogram_stddev",
    "histogram_stdvar", "histogram_sum", "holt_winters", "hour", "idelta", "increase", "info",
    "irate", "label_join", "label_replace", "last_over_time", "ln", "log10", "log2",
    "mad_over_time", "max_over_time", "min_over_time", "minute", "month", "pi",
    "predict_linear", "present_over_time", "quantile_over_time", "rad", "rate", "resets",
    "round", "scalar", "sgn", "sin", "sinh", "sort", "sort_by_label", "sort_by_label_desc",
    "sort_desc", "sqrt", "start", "stddev_over_time", "stdvar_over_time", "sum_over_time", "tan",
    "tanh", "time", "timestamp", "vector", "year",
}
# Keywords followed by a list of label names.
LABEL_LISTS = {"by", "without", "on", "ignoring", "group_left", "group_right"}
KEYWORDS = LABEL_LISTS | {"or", "and", "unless", "offset", "bool", "atan2"}
# Functions that make a label: the index of the argument that names it.
MAKES_LABEL = {"label_replace": 1, "label_join": 1, "count_values": 0}

TOKEN = re.compile(r"""
    (?P<space>\s+)
  | (?P<comment>\#[^\n]*)
  | (?P<var>\$\{[^}]*\}|\[\[\w+(?::\w+)?\]\]|\$\w+)
  | (?P<string>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|`[^`]*`)
  | (?P<range>\[(?:[^\[\]]|\[\[\w+(?::\w+)?\]\])*\])      # [5m], [5m:1m], [[[interval]]]
  | (?P<number>(?:0[xX][0-9a-fA-F]+|(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)[a-zA-Z0-9]*)
  | (?P<ident>[a-zA-Z_:][a-zA-Z0-9_:]*)
  | (?P<op>=~|!~|!=|==|>=|<=|[-+*/%^<>=,(){}@])
""", re.X)


def tokenize(expr):
    toks, pos = [], 0
    while pos < len(expr):
        m = TOKEN.match(expr, pos)
        if not m:
            raise ValueError("cannot read %r at offset %d" % (expr[pos:pos + 20], pos))
        pos = m.end()
        kind = m.lastgroup
        if kind in ("space", "comment"):
            continue
        text = m.group()
        if kind == "ident" and text.lower() in ("inf", "nan"):
            kind = "number"
        toks.append((kind, text))
    return toks


def read_metrics(path):
    """Series name -> label names seen on it (a family without series: no label names)."""
    labels = {}
    sample = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+[-+]?(?:[0-9.]|Inf|NaN)")
    label = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"(?:[^"\\]|\\.)*"')
    suffixes = {"histogram": ("_bucket", "_sum", "_count"),
                "gaugehistogram": ("_bucket", "_gsum", "_gcount"),
                "summary": ("", "_sum", "_count")}
    for line in open(path):
        line = line.strip()
        if not line:
            continue
        if line.startswith("#"):
            parts = line.split()
            if len(parts) >= 4 and parts[1] == "TYPE":
                name, kind = parts[2], parts[3]
                names = [name + s for s in suffixes.get(kind, ("",))]
                if kind == "counter" and not name.endswith("_total"):  # OpenMetrics
                    names.append(name + "_total")
                for n in names:
                    labels.setdefault(n, set())
            continue
        m = sample.match(line)
        if not m:
            raise ValueError("%s: cannot read the line %r" % (path, line))
        labels.setdefault(m.group(1), set()).update(label.findall(m.group(2) or ""))
    for n in SYNTHETIC:
        labels.setdefault(n, set())
    return labels


def check(expr, exported):
    """The problems of one expression, in order, each once."""
    toks = tokenize(expr)
    text = lambda i: toks[i][1] if 0 <= i < len(toks) else None
    match, stack = {}, []
    for i, (kind, t) in enumerate(toks):
        if kind == "op" and t in "({":
            stack.append(i)
        elif kind == "op" and t in ")}":
            if not stack or text(stack[-1]) != {")": "(", "}": "{"}[t]:
                raise ValueError("unbalanced %r" % t)
            j = stack.pop()
            match[i], match[j] = j, i
    if stack:
        raise ValueError("unbalanced %r" % text(stack[-1]))

    problems = []
    selectors = []   # (token index, metric name or None)
    clauses = []     # (keyword, [label names], first, last token index of its scope)
    made = set()     # labels made by label_replace, label_join, count_values
    i = 0
    while i < len(toks):
        kind, t = toks[i]
        word = t.lower() if kind == "ident" else None
        if word in LABEL_LISTS:
            if text(i + 1) != "(":
                i += 1       # group_left without labels
                continue
            end = match[i + 1]
            names = [toks[k][1] for k in range(i + 2, end) if toks[k][0] == "ident"]
            lo, hi = 0, len(toks) - 1    # on, ignoring, group_*: both sides of the operator
            if word in ("by", "without"):
                if i > 0 and toks[i - 1][0] == "ident" and text(end + 1) == "(":   # sum by (x) (...)
                    lo, hi = end + 1, match[end + 1]
                elif text(i - 1) == ")":                                # sum(...) by (x)
                    lo, hi = match[i - 1], i - 1
            clauses.append((word, names, lo, hi))
            i = end + 1
        elif word in KEYWORDS:
            i += 1
        elif word in AGGREGATIONS and (text(i + 1) or "").lower() in ("by", "without"):
            i += 1           # sum by (...) (...)
        elif kind == "ident" and text(i + 1) == "(":
            if t not in FUNCTIONS and word not in AGGREGATIONS:
                problems.append("unknown function %s()" % t)
            elif word in MAKES_LABEL:
                arg, depth = 0, 0
                for k in range(i + 2, match[i + 1]):
                    if text(k) in ("(", "{"):
                        depth += 1
                    elif text(k) in (")", "}"):
                        depth -= 1
                    elif depth == 0 and text(k) == ",":
                        arg += 1
                    elif depth == 0 and arg == MAKES_LABEL[word] and toks[k][0] == "string":
                        made.add(toks[k][1][1:-1])
            i += 1
        elif kind == "ident" or (kind == "op" and t == "{"):
            name = t if kind == "ident" else None
            start = i + 1 if kind == "ident" else i
            matchers = []
            if text(start) == "{":
                end = match[start]
                k = start + 1
                while k < end:
                    if toks[k][0] == "ident":
                        matchers.append((toks[k][1], text(k + 1), toks[k + 2] if k + 2 < end else None))
                        k += 3
                    else:
                        k += 1
                i = end + 1
            else:
                i += 1
            for label, op, value in matchers:
                if label == "__name__" and op == "=" and value and value[0] == "string":
                    name = value[1][1:-1]
            if name is not None and name not in exported:
                problems.append("unknown metric %s: cubed exports no such series" % name)
                selectors.append((i - 1, name))
                continue
            selectors.append((i - 1, name))
            have = exported[name] if name else set().union(*exported.values())
            for label, _op, _value in matchers:
                if label not in have and label not in BUILTIN_LABELS:
                    problems.append("unknown label %s in %s{...}: no series of %s has it"
                                    % (label, name or "", name or "any metric"))
        else:
            i += 1

    for keyword, names, lo, hi in clauses:
        metrics = {n for k, n in selectors if lo <= k <= hi}
        if not metrics or any(n is not None and n not in exported for n in metrics):
            continue     # nothing to check against, or an unknown metric (already reported)
        have = set().union(*(exported[n] if n else set().union(*exported.values())
                             for n in metrics))
        for label in names:
            if label not in have and label not in BUILTIN_LABELS and label not in made:
                problems.append("unknown label %s in %s (...): no series of %s has it"
                                % (label, keyword, ", ".join(sorted(n or "{...}" for n in metrics))))
    return list(dict.fromkeys(problems))


def main():
    try:
        exported = read_metrics(sys.argv[1])
    except (OSError, ValueError) as e:
        sys.exit("names\t%s\t" % e)
    if not set(exported) - set(SYNTHETIC):
        sys.exit("names\t%s holds no metric\t" % sys.argv[1])
    n = bad = 0
    for path in sys.argv[2:]:
        for line in open(path):
            line = line.rstrip("\n")
            if not line:
                continue
            label, _, expr = line.partition("\t")
            n += 1
            try:
                problems = check(expr, exported)
            except (ValueError, IndexError, KeyError) as e:
                problems = ["cannot read the expression: %s" % e]
            for p in problems:
                print("%s\t%s\t%s" % (label, p, expr))
            bad += bool(problems)
    if n == 0:
        sys.exit("names\tno expression to check in %s\t" % " ".join(sys.argv[2:]))
    if bad:
        sys.exit(1)
    print("names\t%d expressions use only metrics and labels that cubed exports (%d series names)"
          % (n, len(exported)))


main()
EOF
if [ ! -s "$TMP/metrics.txt" ]; then
    fail "names: no scrape of /metrics to check the names against (section 4)"
elif out=$(python3 "$TMP/names.py" "$TMP/metrics.txt" "$TMP/queries/names.tsv" \
    "$TMP/alert-names.tsv" 2>&1); then
    ok "names: $(cut -f 2 <<<"$out")"
else
    while IFS=$'\t' read -r label problem expr; do
        fail "$label: $problem"
        [ -z "$expr" ] || echo "       $expr"
    done <<<"$out"
fi

# --- 8. shut down (the trap does the same on any other exit) -----------------------------------
stop_prometheus
stop_cubed && echo "== cubed exited 0 on SIGTERM"
summary
[ "$failed" = 0 ]
