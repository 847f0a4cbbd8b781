#!/usr/bin/env bash
# CI smoke run of `cube-load bench --quick` against every peer: the disk, a tonic echo, Cube,
# SQLite (compiled in), etcd and Redis (Debian's etcd-server and redis-server, installed here with
# apt-get when missing). It fails if any part cannot run or any call fails; the figures of a debug
# build on a CI machine are not benchmark results (docs/benchmarks.md has those).
#
#   bash loadtest/bench-smoke.sh            # uses target/debug/cube-load (cargo build --workspace --bins)
#   CUBE_LOAD=target/release/cube-load bash loadtest/bench-smoke.sh
set -euo pipefail
cd "$(dirname "$0")/.."

CUBE_LOAD=${CUBE_LOAD:-target/debug/cube-load}
[ -x "$CUBE_LOAD" ] || { echo "no $CUBE_LOAD: cargo build --workspace --bins" >&2; exit 1; }

missing=()
command -v etcd >/dev/null 2>&1 || missing+=(etcd-server)
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
if [ "${#missing[@]}" -gt 0 ]; then
    echo "== installing ${missing[*]} (apt-get)"
    . loadtest/lib/apt.sh
    apt_install_no_services "${missing[@]}"
fi

"$CUBE_LOAD" bench --quick --peers disk,echo,cube,sqlite,etcd,redis
