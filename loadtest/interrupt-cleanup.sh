#!/usr/bin/env bash
# Does `cube-durability` leave nothing behind when it is stopped half-way? Runs scenarios D, E
# and A (D and E mount a loop-device ext4 and a tmpfs where root can; elsewhere they skip, and A
# keeps the run going) N times and stops each run at a random moment within its first 10 s with
# SIGTERM, SIGINT or SIGHUP in turn (those not ignored). Each run must exit
# with 128 + the signal's number and leave no process, mount, loop device or directory behind
# (README.md, "Stopped half-way"; `cube_testkit::interrupt`). Each run's temporary files go to a
# directory of this script's own (TMPDIR), so only what the runs made is looked at.
#
#   bash loadtest/interrupt-cleanup.sh [N] [CUBE_DURABILITY]   # N = 8, target/release/cube-durability
set -euo pipefail
cd "$(dirname "$0")/.."

N=${1:-8}
BIN=${2:-target/release/cube-durability}
[ -x "$BIN" ] || { echo "no $BIN: cargo build --release -p cubed -p cube-load" >&2; exit 1; }
BASE=$(mktemp -d /tmp/cube-interrupt.XXXXXX)
trap 'rm -rf "$BASE"' EXIT
# The run under way, if any (see the trap below).
pid=
# Job control: a background job of a non-interactive shell would otherwise start with SIGINT
# ignored, which the harness rightly leaves alone.
set -m

# What the runs left behind, one line each (nothing when clean).
leftovers() {
    find "$BASE" -mindepth 1 -maxdepth 1 -printf 'directory %p\n'
    grep -F " $BASE/" /proc/mounts | awk '{print "mount " $2}' || true
    if command -v losetup > /dev/null; then
        losetup -a 2>/dev/null | grep -F "($BASE/" | sed 's/^/loop device /' || true
    fi
    pgrep -af -- "--data-dir $BASE/" | sed 's/^/process /' || true
}

# Undo what a failed run left, touching only what is under $BASE.
sweep() {
    pkill -9 -f -- "--data-dir $BASE/" || true
    grep -F " $BASE/" /proc/mounts | awk '{print $2}' | sort -r | xargs -r -n1 umount -l || true
    if command -v losetup > /dev/null; then
        losetup -a 2>/dev/null | grep -F "($BASE/" | cut -d: -f1 | xargs -r -n1 losetup -d || true
    fi
    find "$BASE" -mindepth 1 -maxdepth 1 -exec rm -rf {} +
}
# However this script ends (a time bound's SIGTERM too: the runs are in process groups of their
# own, so a signal to this script's group does not reach them), the run under way is stopped and
# what it left is undone before its directory goes.
trap '[ -n "$pid" ] && kill -KILL "$pid" 2>/dev/null; sweep 2>/dev/null; rm -rf "$BASE"' EXIT
trap 'exit 143' TERM
trap 'exit 130' INT

# A signal this shell was started with ignored (SIGHUP under nohup, SIGINT in a background job
# of a non-interactive shell) stays ignored in the harness, which rightly leaves it alone: not
# sent then.
ignored=$(awk '/^SigIgn:/ { print $2 }' /proc/$$/status)
signals=()
numbers=()
for pair in TERM:15 INT:2 HUP:1; do
    name=${pair%:*}
    number=${pair#*:}
    if (( (16#$ignored >> (number - 1)) & 1 )); then
        echo "SIG$name is ignored here (inherited): not sent"
    else
        signals+=("$name")
        numbers+=("$number")
    fi
done
[ ${#signals[@]} -gt 0 ] || { echo "SIGTERM, SIGINT and SIGHUP are all ignored here" >&2; exit 1; }
failed=0
stopped=0
for i in $(seq 1 "$N"); do
    k=$(( (i - 1) % ${#signals[@]} ))
    sig=${signals[$k]}
    delay=$(awk -v s="$RANDOM" 'BEGIN { srand(s); printf "%.2f", 0.2 + rand() * 9.8 }')
    TMPDIR=$BASE "$BIN" --scenarios d,e,a --repeat 1 --size 4MiB > "$BASE.log" 2>&1 &
    pid=$!
    sleep "$delay"
    kill -s "$sig" "$pid" 2>/dev/null || true
    rc=0
    wait "$pid" || rc=$?
    pid=
    # A loop device detached by the harness may still be listed for a moment (udev probing
    # it): when that is all that is left, looked at again for up to 5 s.
    left=$(leftovers)
    settle_until=$((SECONDS + 5))
    while [ -n "$left" ] && ! grep -qv '^loop device ' <<< "$left" && [ "$SECONDS" -lt "$settle_until" ]; do
        sleep 0.2
        left=$(leftovers)
    done
    said=$(grep -m1 '^stopped by' "$BASE.log" || true)
    if [ "$rc" = 0 ]; then
        echo "run $i: finished before SIG$sig (after ${delay} s): not a stop, not counted"
    elif [ "$rc" != $((128 + ${numbers[$k]})) ] || [ -n "$left" ]; then
        echo "run $i: SIG$sig after ${delay} s: exit $rc (want $((128 + ${numbers[$k]}))), left behind:"
        echo "${left:-  nothing}"
        tail -5 "$BASE.log"
        failed=1
        sweep
    else
        stopped=$((stopped + 1))
        echo "run $i: SIG$sig after ${delay} s: exit $rc, nothing left; $said"
    fi
done
rm -f "$BASE.log"
if [ "$failed" != 0 ]; then
    echo "FAILED: a stopped run left something behind or exited wrongly" >&2
    exit 1
fi
if [ "$stopped" -lt $(( (N + 1) / 2 )) ]; then
    echo "FAILED: only $stopped of $N runs were stopped before they finished" >&2
    exit 1
fi
echo "ok: $stopped runs stopped half-way, each cleaned up"
