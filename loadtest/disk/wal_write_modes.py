#!/usr/bin/env python3
"""How fast this disk makes a small WAL append durable, two ways (docs/benchmarks.md,
"A WAL append through O_DIRECT | O_DSYNC: measured on the disk alone, not built").

- buffered: pwrite of one 400-byte record after the previous one, then fdatasync (what the
  WAL's syncer does today for a batch of about two records);
- direct_dsync: the same append as one pwrite of the 4 KiB block that holds the log's tail,
  through a descriptor opened O_DIRECT | O_DSYNC (no page cache, no separate fdatasync; what a
  WAL writing with O_DIRECT would do).

Usage: python3 loadtest/disk/wal_write_modes.py [FILE] [--appends N] [--rounds R]
FILE (default ./wal-write-modes.bin, 64 MiB, written and synced first, removed at the end)
must be on the disk to measure (not tmpfs, which refuses O_DIRECT). The modes alternate
(ABBA...), since this machine's speed moves within minutes; compare them pair by pair.
"""

import argparse
import mmap
import os
import resource
import time

SIZE = 64 << 20
RECORD = 400
BLOCK = 4096


def run(path: str, mode: str, appends: int) -> str:
    flags = os.O_WRONLY
    if mode == "direct_dsync":
        flags |= os.O_DIRECT | os.O_DSYNC
    fd = os.open(path, flags)
    buf = mmap.mmap(-1, BLOCK)  # page-aligned, as O_DIRECT requires
    buf.write(os.urandom(BLOCK))
    before = resource.getrusage(resource.RUSAGE_SELF)
    lat = []
    off = 0
    start = time.perf_counter()
    for _ in range(appends):
        t = time.perf_counter()
        if mode == "direct_dsync":
            os.pwrite(fd, memoryview(buf), (off // BLOCK) * BLOCK)
        else:
            os.pwrite(fd, memoryview(buf)[:RECORD], off)
            os.fdatasync(fd)
        lat.append(time.perf_counter() - t)
        off = (off + RECORD) % (SIZE - BLOCK)
    elapsed = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_SELF)
    os.close(fd)
    lat.sort()
    cpu = (after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime) / appends
    return (
        f"{mode:13s} {appends / elapsed:8.0f}/s  p50 {lat[len(lat) // 2] * 1e6:6.1f} µs  "
        f"p99 {lat[int(len(lat) * 0.99)] * 1e6:6.1f} µs  CPU {cpu * 1e6:5.1f} µs per append"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("file", nargs="?", default="wal-write-modes.bin")
    ap.add_argument("--appends", type=int, default=3000)
    ap.add_argument("--rounds", type=int, default=4)
    args = ap.parse_args()
    with open(args.file, "wb") as f:
        f.write(b"\0" * SIZE)
        f.flush()
        os.fsync(f.fileno())
    try:
        for r in range(args.rounds):
            modes = ["buffered", "direct_dsync"]
            for mode in modes if r % 2 == 0 else modes[::-1]:
                print(run(args.file, mode, args.appends), flush=True)
    finally:
        os.remove(args.file)


if __name__ == "__main__":
    main()
