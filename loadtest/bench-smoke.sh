#!/usr/bin/env bash
# CI smoke run of `cube-load bench --quick` against every peer: the disk, a tonic echo, Cube,
# SQLite (compiled in), etcd and Redis (Debian's etcd-server and redis-server, installed here with
# apt-get when missing). It fails if any part cannot run or any call fails; the figures of a debug
# build on a CI machine are not benchmark results (docs/benchmarks.md has those).
#
#   bash loadtest/bench-smoke.sh            # uses target/debug/cube-load (cargo build -p cube-load -p cubed)
#   CUBE_LOAD=target/release/cube-load bash loadtest/bench-smoke.sh
set -euo pipefail
cd "$(dirname "$0")/.."

CUBE_LOAD=${CUBE_LOAD:-target/debug/cube-load}
[ -x "$CUBE_LOAD" ] || { echo "no $CUBE_LOAD: cargo build -p cube-load -p cubed" >&2; exit 1; }

missing=()
command -v etcd >/dev/null 2>&1 || missing+=(etcd-server)
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
if [ "${#missing[@]}" -gt 0 ]; then
    echo "== installing ${missing[*]} (apt-get)"
    [ "$(id -u)" = 0 ] || { echo "need ${missing[*]}: apt-get install ${missing[*]}, or run as root" >&2; exit 1; }
    # The packages would start their own services; the bench starts its own servers on loopback,
    # so keep the package scripts from starting anything (and from failing without an init system).
    created_policy=0
    if [ ! -e /usr/sbin/policy-rc.d ]; then
        printf '#!/bin/sh\n# created by loadtest/bench-smoke.sh for its apt-get install\nexit 101\n' \
            >/usr/sbin/policy-rc.d
        chmod 755 /usr/sbin/policy-rc.d
        created_policy=1
    fi
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    [ "$created_policy" = 1 ] && rm -f /usr/sbin/policy-rc.d
fi

"$CUBE_LOAD" bench --quick --peers disk,echo,cube,sqlite,etcd,redis
