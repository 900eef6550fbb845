"""Where a one-shot unpack's time goes, in fresh processes (issues 14 and 18).

    python benchmarks/unpack_profile.py [CORPUS] --items a,b [--runs 10] [--threads 2] [--top 20] [--mode unpack]
                                        [--mode decompress | compress] [--faults]

For each item: its archive made once (brevis.compress, into a temporary
folder), then --runs fresh Python processes, each importing what the
harness's worker imports before its clock (benchmarks/worker.py), reading
the archive into memory and calling brevis.unpack once, as the harness's
in-memory decompression does, under `perf record` (cpu-clock samples at
20 kHz on every thread, CLOCK_MONOTONIC time stamps). Only the samples
inside the unpack call (each process prints its window) count: the
first call of a process pays what a user's one-shot decompression pays
and a warm loop hides (Python's first run of each function, the kernel
zeroing the output's pages). The table gives each function's share of
the CPU time in the window and its ms a run, beside a summary by library.
`--mode decompress`: brevis.decompress from the archive's file into a new
folder on tmpfs (--out-dir) instead, as the harness's file-to-file pass
(its fsync, free on tmpfs, left out). `--mode compress`: brevis.compress
of the item into an archive on tmpfs, as the harness's compression (its
worker processes' samples count too: perf follows them). `--faults`:
every page fault instead (the software event, each one a sample), by the
function that touched the page first: on a virtual machine a first
touch costs microseconds (3-4.4 us a 4 KiB page on the AMD EPYC of
2026-12-06), so a one-shot run of a small checkpoint is much the pages
it touches (fracast's unpack: 339, 117 of them its rANS tables).

Needs `perf` (linux-tools) and a kernel that lets this user sample its
processes (perf_event_paranoid); without them it says so and exits 2.
Prints Markdown; nothing is written.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.codecs import BY_NAME  # noqa: E402

DEFAULT_CORPUS = Path.home() / ".cache" / "brevis-corpus"
FREQUENCY = 20_000  # samples a second of CPU: 0.05 ms each

# One run, in the tree of the working folder (`python -c` puts it first on
# sys.path): the harness worker's imports (a module an older revision lacks
# skipped: benchmarks/ab.py runs older ones), the archive read, one timed
# unpack or decompress, or one timed compress of the item (the archive's
# place) into OUT/item.brv; the window goes to stderr as CLOCK_MONOTONIC
# seconds, perf's clock here. argv: archive (or item), threads, mode, out.
CHILD = """
import importlib, os, sys, time
for m in {imports!r}:
    try:
        importlib.import_module(m)
    except ModuleNotFoundError:
        pass
import brevis
assert brevis.__file__.startswith(os.getcwd()), brevis.__file__
archive, threads, mode, out = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
if mode == "unpack":
    data = open(archive, "rb").read()
    start = time.clock_gettime(time.CLOCK_MONOTONIC)
    brevis.unpack(data, threads=threads)
elif mode == "compress":
    os.makedirs(out, exist_ok=True)
    start = time.clock_gettime(time.CLOCK_MONOTONIC)
    brevis.compress([archive], os.path.join(out, "item.brv"), threads=threads, force=True)
else:
    start = time.clock_gettime(time.CLOCK_MONOTONIC)
    brevis.decompress(archive, out, threads=threads, force=True)
end = time.clock_gettime(time.CLOCK_MONOTONIC)
sys.stderr.write(f"WINDOW {{start:.6f}} {{end:.6f}}\\n")
"""


def one_shot(archive: Path, threads: int, mode: str, out: Path | None) -> list[str]:
    """The command line of one run (CHILD), to start in the tree it measures."""
    child = CHILD.format(imports=("numpy", *BY_NAME["brevis"].imports))
    return [sys.executable, "-c", child, str(archive), str(threads), mode, f"{out}/"]


def window(stderr: str) -> tuple[float, float] | None:
    """A run's (start, end), CLOCK_MONOTONIC seconds, from its stderr; None if it did not get there."""
    m = re.search(r"WINDOW (\S+) (\S+)", stderr)
    return (float(m.group(1)), float(m.group(2))) if m else None


SAMPLE = re.compile(r"^\s*(\d+\.\d+):\s+[0-9a-f]+\s+(.*?)\s+\((.*)\)\s*$")


def perf_usable() -> str | None:
    """None where perf can sample a child process here, else why not."""
    if shutil.which("perf") is None:
        return "perf is not installed (linux-tools)"
    with tempfile.TemporaryDirectory() as tmp:
        p = subprocess.run(["perf", "record", "-q", "-e", "cpu-clock", "-o", os.path.join(tmp, "t.data"), "--",
                            sys.executable, "-c", "pass"], capture_output=True, text=True)
    if p.returncode:
        return f"perf record failed: {p.stderr.strip().splitlines()[-1] if p.stderr.strip() else p.returncode}"
    return None


def samples_in_window(data: Path, start: float, end: float) -> Counter:
    """(function, library) -> samples of the perf file between start and end."""
    out = subprocess.run(["perf", "script", "-i", str(data), "-F", "time,ip,sym,dso"], capture_output=True,
                         text=True).stdout
    found: Counter = Counter()
    for line in out.splitlines():
        m = SAMPLE.match(line)
        if m and start <= float(m.group(1)) <= end:
            found[(m.group(2) or "?", os.path.basename(m.group(3)))] += 1
    return found


def library(dso: str) -> str:
    """A short name for a sample's library."""
    if dso.startswith("libpython"):
        return "Python"
    if dso == "[kernel.kallsyms]":
        return "kernel"
    return dso.split(".cpython")[0].split(".so")[0]


def profile(archive: Path, runs: int, threads: int, tmp: Path, mode: str = "unpack",
            out: Path | None = None, faults: bool = False) -> tuple[Counter, float]:
    """Samples by (function, library) over `runs` fresh unpacks (or
    decompressions into `out`, a new folder each run), and their mean
    window in seconds. `faults`: every page fault a sample (where the
    process first touched a page), not the CPU clock."""
    total: Counter = Counter()
    windows = []
    for k in range(runs):
        data = tmp / f"run{k}.data"
        if out is not None:
            shutil.rmtree(out, ignore_errors=True)
        event = ["-e", "page-faults", "-c", "1"] if faults else ["-e", "cpu-clock", "-F", str(FREQUENCY)]
        p = subprocess.run(["perf", "record", "-q", "-k", "CLOCK_MONOTONIC", *event, "-o", str(data), "--",
                            *one_shot(archive, threads, mode, out)], capture_output=True, text=True, cwd=ROOT)
        found = window(p.stderr)
        if p.returncode or found is None:
            raise SystemExit(f"{archive.name}: the {mode} did not run: {p.stderr.strip()[-500:]}")
        start, end = found
        windows.append(end - start)
        total += samples_in_window(data, start, end)
        data.unlink()
    return total, sum(windows) / len(windows)


def report(item: str, found: Counter, window: float, runs: int, top: int, mode: str = "unpack",
           faults: bool = False) -> None:
    n = sum(found.values()) or 1
    per = 1 / runs if faults else 1e3 / FREQUENCY / runs  # faults, or ms, a run per sample
    unit = "faults" if faults else "ms"
    print(f"\n### {item}\n")
    print(f"{mode} window {window * 1e3:.1f} ms (mean of {runs} fresh processes), "
          + (f"page faults in it {sum(found.values()) * per:.0f} a run" if faults
             else f"CPU in it {sum(found.values()) * per:.1f} ms a run"))
    by_library: Counter = Counter()
    for (_, dso), c in found.items():
        by_library[library(dso)] += c
    print("by library: " + ", ".join(f"{name} {c / n:.0%}" for name, c in by_library.most_common(8)) + "\n")
    print(f"| function | library | share | {unit} a run |")
    print("|---|---|---:|---:|")
    for (sym, dso), c in found.most_common(top):
        print(f"| {sym[:60]} | {library(dso)} | {c / n:.1%} | {c * per:.{1 if faults else 2}f} |")


def one_shot_options(ap: argparse.ArgumentParser) -> None:
    """The corpus, the items and how the one-shot runs go (one_shot): this
    script's options and benchmarks/ab.py's."""
    ap.add_argument("corpus", nargs="?", type=Path, default=DEFAULT_CORPUS)
    ap.add_argument("--items", required=True)
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--mode", choices=("unpack", "decompress", "compress"), default="unpack")
    ap.add_argument("--out-dir", type=Path, default=Path("/dev/shm"),
                    help="where --mode decompress and compress write (default /dev/shm, tmpfs)")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    one_shot_options(ap)
    ap.add_argument("--top", type=int, default=20)
    ap.add_argument("--faults", action="store_true",
                    help="count page faults (first touches of memory) by function instead of CPU time")
    args = ap.parse_args(argv)
    why = perf_usable()
    if why:
        print(f"unpack_profile: {why}", file=sys.stderr)
        return 2
    import brevis

    print(f"# One-shot {args.mode}, {args.runs} fresh processes an item, {args.threads} threads"
          + (", page faults" if args.faults else ""))
    with tempfile.TemporaryDirectory(prefix="brevis-unpack-profile-") as tmp:
        tmp = Path(tmp)
        for item in args.items.split(","):
            archive = tmp / f"{item}.brv"  # compress: the item itself is what each run reads
            if args.mode != "compress":
                brevis.compress([str(args.corpus / item)], archive, force=True)
            out = Path(tempfile.mkdtemp(prefix="brevis-profile-out-", dir=args.out_dir)) \
                if args.mode != "unpack" else None
            try:
                found, window = profile(args.corpus / item if args.mode == "compress" else archive, args.runs,
                                        args.threads, tmp, args.mode, out, args.faults)
            finally:
                if out is not None:
                    shutil.rmtree(out, ignore_errors=True)
            report(item, found, window, args.runs, args.top, args.mode, args.faults)
            archive.unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
