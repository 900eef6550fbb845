"""One codec run in its own process, so that its peak memory is its own.

    python -m benchmarks.worker JOB.json

JOB: {"codec", "action": "compress" | "decompress" | "idle", "threads",
"files", "names", "dtypes", "work", "out"}. Prints {"seconds", "peak_mib"}: the wall
clock of the codec's work alone (reading and writing files included, the
interpreter's start and the library's import not) and "peak_mib", its peak
RSS (with worker processes, plus threads x the largest one's peak). "idle" only imports the library: its peak is the codec's baseline.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from .codecs import BY_NAME


def main(argv: list[str]) -> None:
    job = json.loads(Path(argv[0]).read_text())
    codec = BY_NAME[job["codec"]]
    if codec.module:
        __import__(codec.module)
    if codec.name == "brevis":
        # Imported outside the timed part, like the peers' libraries: the
        # package loads its modules on first use, so load them now.
        import brevis.api  # noqa: F401  (the entry points the codec calls)
        import brevis.codec.decoder  # noqa: F401
        import brevis.codec.encoder  # noqa: F401
    threads = job["threads"]
    work = Path(job["work"])
    start = time.perf_counter()
    if job["action"] == "compress":
        codec.compress([Path(f) for f in job["files"]], job["names"], work, threads, job["dtypes"])
    elif job["action"] == "decompress":
        codec.decompress(work, job["names"], Path(job["out"]), threads)
    seconds = time.perf_counter() - start
    workers = workers_peak_mib()
    # Worker processes (Brevis from -j2 on large inputs) run beside this
    # one: count each at the largest one's peak, an upper bound.
    print(json.dumps({"seconds": seconds, "peak_mib": peak_mib() + threads * workers,
                      "workers_peak_mib": workers}))


def workers_peak_mib() -> float:
    """The largest peak RSS of the child processes this run waited for (0 if none)."""
    import resource

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
    import resource

    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / (1 << 20 if sys.platform == "darwin" else 1024)


if __name__ == "__main__":
    main(sys.argv[1:])
