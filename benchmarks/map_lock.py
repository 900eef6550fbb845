"""What faulting an unpack's output in on a thread of its own costs the
other threads: the latency of their mmap and munmap calls meanwhile.

    python benchmarks/map_lock.py [--mib 256] [--rounds 3]

unpack faults its output buffers in on a thread while the main thread
reads the archive's index (brevis/workers/heap.py populate). A thread
that maps or unmaps memory (Python's allocator taking an arena, malloc
growing its heap, numpy's large arrays) needs the process's memory map
for writing. Each round makes a fresh buffer of --mib MiB (numpy: huge
pages advised) and faults it in two ways, in turn, while this thread
maps, touches and unmaps 1 MiB in a loop:

- madvise: MADV_POPULATE_WRITE a 2 MiB span a call (through ctypes), as
  _layout.prefault did up to 065c329: the call holds the map for reading
  while it faults, huge pages included;
- prefault: _layout.prefault as built (on x86-64 a locked OR of 0 a page:
  plain write faults, which take only their own mapping's lock).

Prints, per way and round, how long the faulting took and the loop's
calls: how many, their median, 99th percentile and longest, in ms. Linux
only (it says so and exits 2 elsewhere); nothing is written.
"""

from __future__ import annotations

import argparse
import mmap
import statistics
import sys
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from brevis.workers import heap  # noqa: E402

SPAN = 2 << 20
_populate_write = heap.populate_write()  # looked up once, not inside a timed faulting


def by_madvise(buf: np.ndarray) -> None:
    if _populate_write is None:
        raise OSError("no madvise in the C library")
    at, end = buf.ctypes.data, buf.ctypes.data + len(buf)
    at -= at % mmap.PAGESIZE
    while at < end:
        n = min(SPAN - at % SPAN, end - at)
        if _populate_write(at, n):
            raise OSError("madvise(MADV_POPULATE_WRITE) refused (a kernel before 5.14?)")
        at += n


def by_prefault(buf: np.ndarray) -> None:
    heap._layout.prefault([buf], np.zeros(1, np.uint8), 10**12, 10**9)


def one_round(fault, mib: int) -> dict:
    """Fault a fresh buffer in on a thread while this one maps and unmaps."""
    buf = np.empty(mib << 20, np.uint8)
    took: list[float] = []
    ended = threading.Event()

    def run() -> None:
        start = time.perf_counter()
        try:
            fault(buf)
        finally:
            took.append(time.perf_counter() - start)
            ended.set()

    calls = []
    thread = threading.Thread(target=run)
    thread.start()
    while True:  # one call at least: a small buffer can be faulted in before the first
        start = time.perf_counter()
        m = mmap.mmap(-1, 1 << 20)
        m[0] = 1
        m.close()
        calls.append((time.perf_counter() - start) * 1e3)
        if ended.is_set():
            break
    thread.join()
    calls.sort()
    return {"ms": took[0] * 1e3, "calls": len(calls), "median": statistics.median(calls),
            "p99": calls[min(len(calls) - 1, int(0.99 * len(calls)))], "longest": calls[-1]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mib", type=int, default=256, help="buffer size, MiB")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)
    if not sys.platform.startswith("linux") or heap._layout is None:
        print("needs Linux and the built extension", file=sys.stderr)
        return 2
    print(f"{args.mib} MiB a round, {args.rounds} rounds, the two ways in turn\n")
    print("| way | round | faulting ms | mmap calls | median ms | p99 ms | longest ms |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    ways = [("madvise", by_madvise), ("prefault", by_prefault)]
    try:
        by_madvise(np.empty(SPAN, np.uint8))
    except OSError as e:
        print(f"(madvise left out: {e})\n")
        ways = ways[1:]
    for r in range(1, args.rounds + 1):
        for name, fault in ways:
            s = one_round(fault, args.mib)
            print(f"| {name} | {r} | {s['ms']:.1f} | {s['calls']} | {s['median']:.3f} | {s['p99']:.2f} | "
                  f"{s['longest']:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
