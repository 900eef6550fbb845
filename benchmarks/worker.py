"""One codec run in its own process, so that its peak memory is its own.

    python -m benchmarks.worker JOB.json

JOB: {"codec", "action": "compress" | "decompress" | "idle", "mode": "file" |
"memory", "threads", "files", "names", "dtypes", "work", "out"}.

- mode "file": compress reads the files and writes under `work`,
  decompress reads `work` and writes under `out`; every file written is
  fsync'ed before the clock stops (Brevis's compress fsyncs its archive
  itself; on tmpfs fsync costs nothing).
- mode "memory": compress reads the files into memory before the clock
  starts, and after it stops writes the compressed form under `work`;
  decompress reads that into memory before the clock starts and keeps
  the output in memory, hashed by SHA-256 after the clock stops.

Before the clock starts: the library's import and the codec's objects
(`begin`), and what it is told about the files (`prepare`). Prints
{"seconds", "cpu_s", "peak_mib", "workers_peak_mib", "compressed_bytes",
"hashes"}: the wall clock of the timed part; the CPU time (user + system)
this process and the children it waited for spent in it (getrusage
RUSAGE_SELF + RUSAGE_CHILDREN); the peak RSS (with worker processes, plus
threads x the largest one's peak); in memory, the bytes of the compressed
form, and each output file's SHA-256. "idle" only imports the library and
makes the codec's objects: its peak is the codec's baseline.
"""

from __future__ import annotations

import hashlib
import json
import os
import resource
import sys
import time
from pathlib import Path

from .codecs import BY_NAME, read_all


def cpu_seconds() -> float:
    total = 0.0
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
        r = resource.getrusage(who)
        total += r.ru_utime + r.ru_stime
    return total


def fsync_tree(folder: Path) -> None:
    for root, _, names in os.walk(folder):
        for n in names:
            fd = os.open(os.path.join(root, n), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)


def main(argv: list[str]) -> None:
    job = json.loads(Path(argv[0]).read_text())
    codec = BY_NAME[job["codec"]]
    # Imported outside the timed part: the library, numpy (which Brevis and
    # most peers use) and what the codec's calls import (Brevis loads its
    # modules on first use, so they are loaded now).
    import importlib

    for m in filter(None, ("numpy", codec.module, *codec.imports)):
        importlib.import_module(m)
    threads = job["threads"]
    codec.begin(threads)
    files = [Path(f) for f in job["files"]]
    names = job["names"]
    work, out = Path(job["work"]), Path(job["out"]) if job["out"] else None
    action, mode = job["action"], job.get("mode", "file")
    result: dict = {}
    seconds = cpu = 0.0
    if action != "idle":
        metas = codec.prepare(files, job["dtypes"]) if action == "compress" else None
        if mode == "memory":
            if action == "compress":
                inputs = [] if codec.reads_files else [read_all(f) for f in files]
            else:
                loaded = codec.load(work, names)
        cpu0, start = cpu_seconds(), time.perf_counter()
        if mode == "memory":
            if action == "compress":
                kept = codec.compress_memory(files, inputs, names, metas, work, threads)
            else:
                kept = codec.decompress_memory(loaded, names, threads)
        elif action == "compress":
            codec.compress(files, names, metas, work, threads)
            fsync_tree(work)
        else:
            codec.decompress(work, names, out, threads)
            fsync_tree(out)
        seconds, cpu = time.perf_counter() - start, cpu_seconds() - cpu0
        if mode == "memory":
            if action == "compress":
                if kept is not None:
                    result["compressed_bytes"] = sum(len(memoryview(p).cast("B")) for parts in kept for p in parts)
                    codec.save(kept, names, work)
            else:
                result["hashes"] = [_sha256(parts) for parts in kept]
    workers = workers_peak_mib()
    # Worker processes (Brevis from -j2 on large inputs) run beside this
    # one: count each at the largest one's peak, an upper bound.
    result.update(seconds=seconds, cpu_s=cpu, peak_mib=peak_mib() + threads * workers, workers_peak_mib=workers)
    print(json.dumps(result))


def _sha256(parts) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(memoryview(p).cast("B"))
    return h.hexdigest()


def workers_peak_mib() -> float:
    """The largest peak RSS of the child processes this run waited for (0 if none)."""
    rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return rss / (1 << 20 if sys.platform == "darwin" else 1024)


def peak_mib() -> float:
    """This process's peak resident set size.

    VmHWM, the high-water mark of this address space, rather than ru_maxrss:
    on Linux ru_maxrss also counts the parent's size at the fork that
    started this process.
    """
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024  # kB
    except OSError:
        pass
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / (1 << 20 if sys.platform == "darwin" else 1024)


if __name__ == "__main__":
    main(sys.argv[1:])
