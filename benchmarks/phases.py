"""Where compression time goes, and the floor under it (issue 4).

Runs `brevis compress` on one thread in this process with timers around
each phase, and around the library calls that chunk encoding cannot do
without whatever Python does around them: zstd coding the streams, the
digest of every chunk (XXH3-128: the format stores it, and it is the
chunk's key for deduplication), the check of every stream (XXH3-64),
reading the chunks and writing the streams ("read" also counts the
chunks a repeat is compared with, read again). Their sum is the
floor: what one thread needs even with no Python or numpy work at all.
zstd -3 (one thread) compresses the same files in the same run, file
reads and writes included as for Brevis.

    python benchmarks/phases.py                              # the items of scaling.py
    python benchmarks/phases.py --items astra-i3d-resnet152 --repeat 3

Timers are inclusive: "plan" includes the trial encodings it runs (their
zstd is not in the floor, which counts chunk encoding only), "encode" is
every chunk's work (read, digest, program, CRCs). Every figure is the
best of --repeat runs (the machine may be shared). Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections import defaultdict
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import zstandard  # noqa: E402

from benchmarks.scaling import CORPUS, ITEMS, files_of  # noqa: E402
from brevis import api  # noqa: E402
from brevis.codec import encoder  # noqa: E402
from brevis.workers import tasks as jobs  # noqa: E402
from brevis.archive.writer import ArchiveWriter  # noqa: E402
from brevis.dsl.coders import Zstd  # noqa: E402
from brevis.synth.planner import Planner  # noqa: E402

PHASES = ["scan", "discover", "learn", "plan", "encode", "write", "finish"]
FLOOR = ["zstd", "digest", "stream check", "read", "write"]

seconds: dict[str, float] = defaultdict(float)
_in_chunk = [False]


@contextmanager
def timed(name: str):
    t = time.perf_counter()
    try:
        yield
    finally:
        seconds[name] += time.perf_counter() - t


def _wrap(name: str, fn, *, chunk: bool = False, only_in_chunk: bool = False):
    def wrapper(*args, **kwargs):
        if only_in_chunk and not _in_chunk[0]:
            return fn(*args, **kwargs)
        with timed(name):
            if not chunk:
                return fn(*args, **kwargs)
            _in_chunk[0] = True
            try:
                return fn(*args, **kwargs)
            finally:
                _in_chunk[0] = False
    return wrapper



def instrument() -> None:
    encoder.scan = _wrap("scan", encoder.scan)
    encoder.discover = _wrap("discover", encoder.discover)
    encoder._learn = _wrap("learn", encoder._learn)
    Planner.plan = _wrap("plan", Planner.plan)
    jobs.run_chunk = _wrap("encode", jobs.run_chunk, chunk=True)
    jobs.chunk_digest = _wrap("digest", jobs.chunk_digest)
    jobs.stream_check = _wrap("stream check", jobs.stream_check)
    jobs._read = _wrap("read", jobs._read)
    Zstd.encode = _wrap("zstd", Zstd.encode, only_in_chunk=True)
    ArchiveWriter.write_stream = _wrap("write", ArchiveWriter.write_stream)
    ArchiveWriter.finish = _wrap("finish", ArchiveWriter.finish)


def brevis_phases(item: str, tmp: Path) -> dict[str, float]:
    seconds.clear()
    t = time.perf_counter()
    api.compress([str(CORPUS / item)], str(tmp / f"{item}.brv"), threads=1, force=True)
    total = time.perf_counter() - t
    return {"total": total, **seconds}


def zstd3_seconds(item: str, tmp: Path) -> float:
    """zstd -3 on one thread, reading and writing files as benchmarks/run.py does."""
    total = 0.0
    for p in files_of(item):
        with open(p, "rb") as fin, open(tmp / "file.zst", "wb") as fout:
            t = time.perf_counter()
            zstandard.ZstdCompressor(level=3).copy_stream(fin, fout, read_size=16 << 20, write_size=1 << 20)
            total += time.perf_counter() - t
    return total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--items", default=",".join(ITEMS))
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    instrument()
    print(f"{time.strftime('%Y-%m-%d %H:%M')}, load average {os.getloadavg()}, {os.cpu_count()} CPUs, one thread\n")
    print("| item | MB | total s | " + " | ".join(PHASES) + " | other | floor: " + " + ".join(FLOOR)
          + " | floor s | zstd -3 s | floor / zstd -3 | total / zstd -3 |")
    print("|---|---:|" + "---:|" * (len(PHASES) + 7))
    with tempfile.TemporaryDirectory() as d:
        for item in args.items.split(","):
            mb = sum(p.stat().st_size for p in files_of(item)) / 1e6
            runs = []
            for _ in range(args.repeat):  # alternating, best of each
                runs.append((brevis_phases(item, Path(d)), zstd3_seconds(item, Path(d))))
            best = min((r for r, _ in runs), key=lambda r: r["total"])
            z3 = min(z for _, z in runs)
            other = best["total"] - sum(best.get(p, 0.0) for p in PHASES)
            floor = sum(best.get(f, 0.0) for f in FLOOR)
            parts = " + ".join(f"{best.get(f, 0.0):.2f}" for f in FLOOR)
            print(f"| {item} | {mb:.1f} | {best['total']:.2f} | "
                  + " | ".join(f"{best.get(p, 0.0):.2f}" for p in PHASES)
                  + f" | {other:.2f} | {parts} | {floor:.2f} | {z3:.2f} | {floor / z3:.2f}"
                  + f" | {best['total'] / z3:.2f} |")
    print(f"\nload average at the end {os.getloadavg()}")


if __name__ == "__main__":
    main()
