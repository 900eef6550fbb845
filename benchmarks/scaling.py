"""How compression scales with workers: brevis compress -j1 against -j2, and
zstd -3 with 1 and 2 threads on the same bytes, in one run; then
compress-many on a local Dask cluster of 1 and 2 workers; and, with
--serial, the serial share of compress and decompress and the speed-ups it
allows on more cores.

    python benchmarks/scaling.py                       # the six items of issue 4
    python benchmarks/scaling.py --items ppocr-v5 --repeat 5 --modes j1,j2,j2-threads
    python benchmarks/scaling.py --dask ppocr-v5,pocketnet-v3,piper-joe-medium,minilm-l6-v2
    python benchmarks/scaling.py --serial --items astra-i3d-resnet152,pocketnet-v3
    python benchmarks/scaling.py --jobs 1,4,16 --items astra-i3d-resnet152 --tmp /dev/shm

--jobs measures instead of projecting, on a machine with that many cores:
compress and decompress at each -jN (the CLI's own choice of threads or
worker processes), the best wall time of `--repeat`, its speed-up against
the first -jN, the main process's and the workers' CPU seconds (so the
serial share at that N), and zstd -3 on the same bytes with N threads in
memory (python-zstandard; its decompression has one thread whatever N).
Every -jN must write the same archive to the byte. --concurrent K,... runs
K independent -j1 commands at once instead: how far the machine itself
scales on this work (memory bandwidth, page faults, shared caches), the
bound that -jN's speed-up is read against. `seconds` is brevis's
own summary (scan to last write); `process s` the whole command's, the
interpreter's start and imports included.

--serial runs each command at -j1 (one process, one thread) and at -j2
with worker processes forced (what -j16 would use): the main process's
CPU seconds there (scan, discovery, learning, planning and writing for
compress; the index, the jobs' dispatch and the files' set-up for
decompress) are the work no worker can take, the workers' CPU seconds
the work N of them share. The serial share s is main / (main + workers),
and Amdahl's law projects the wall time on N cores as main + workers / N
(the main process's work counted as wholly serial, though part of it
overlaps the workers' on two cores: a bound from below on the speed-up),
against -j1's wall time for the speed-up. The main process's threads
are counted apart too (the command's summary: its main thread's CPU
seconds and, compressing, the stream writer's; the rest of the process's
are the worker pool's threads'): where each runs beside the others and
the workers on cores of its own, the wall time on N cores is the longest
of them and workers / N, a bound from above on the speed-up (`overlapping`
columns). The two bounds frame what N cores would do; only a machine with
them tells (--jobs).

Every brevis run is `python -m brevis compress ITEM -j N --json` in a fresh
process (throughput from its summary: scan, learning, planning, encoding
and writing; not the interpreter's start). Runs of one item alternate
between the modes, `--repeat` times, and the best of each is kept, since
the machine may be shared. Peak RSS is the brevis process's own and, with
worker processes, the largest worker's. Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CORPUS = Path(os.environ.get("BREVIS_CORPUS", Path.home() / ".cache" / "brevis-corpus"))
ITEMS = ["astra-i3d-resnet152", "piper-joe-medium", "ppocr-v5", "pocketnet-v3", "minilm-l6-v2", "gemma3-270m-q4km"]
REPO = Path(__file__).resolve().parent.parent
# The children import brevis from this checkout, and what PYTHONPATH already names.
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])}

# Runs brevis in this process and reports its peak RSS and its children's.
LAUNCHER = """
import json, resource, sys
from brevis import cli
from brevis.codec import chunks, encoder
mode = sys.argv.pop(1)
if mode == "threads":  # the thread pool, as before worker processes
    encoder.PROCESS_MIN_BYTES = 1 << 62
    compress = encoder.compress
    encoder.compress = lambda *a, **k: compress(*a, **{**k, "processes": False})
    import brevis.api
    brevis.api.compress = encoder.compress
elif mode == "processes":  # worker processes whatever the size and the threads, compressing and decoding,
    encoder.PROCESS_MIN_BYTES = chunks.PROCESS_MIN_BYTES = 0  # and streams written behind (from 3 threads)
    chunks.PROCESS_MIN_THREADS = encoder.WRITE_BEHIND_THREADS = 2
import brevis.api, brevis.codec.decoder, brevis.codec.plan  # imported before the CPU clock starts
cpu = lambda r: r.ru_utime + r.ru_stime
start = cpu(resource.getrusage(resource.RUSAGE_SELF))
try:
    cli.main(sys.argv[1:])
finally:
    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    hwm = [int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM:")][0]  # ru_maxrss survives exec
    print(json.dumps({"rss_kib": hwm, "child_rss_kib": c.ru_maxrss,
                      "cpu_s": cpu(s) - start, "child_cpu_s": cpu(c), "sys_s": s.ru_stime, "child_sys_s": c.ru_stime,
                      "faults": s.ru_minflt, "child_faults": c.ru_minflt}), file=sys.stderr)
"""


def files_of(item: str) -> list[Path]:
    return sorted(p for p in (CORPUS / item).rglob("*") if p.is_file())


def launch(args: list[str], mode: str) -> dict:
    """`brevis ARGS --json` in a fresh process (LAUNCHER, `mode`): its JSON
    summary with the process's and its children's peak RSS and CPU seconds."""
    return launched(start(args, mode))


def start(args: list[str], mode: str) -> tuple[subprocess.Popen, float, list[str]]:
    """launch's process, started: wait for it with `launched`."""
    p = subprocess.Popen([sys.executable, "-c", LAUNCHER, mode, *args, "-q", "--json"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=ENV)
    return p, time.perf_counter(), args


def launched(started: tuple[subprocess.Popen, float, list[str]]) -> dict:
    p, begun, args = started
    out, err = p.communicate(timeout=3600)
    if p.returncode != 0:
        raise SystemExit(f"brevis {' '.join(args)}: {err}")
    s = json.loads(out)
    s["process_seconds"] = time.perf_counter() - begun
    s.update(json.loads(err.strip().splitlines()[-1]))
    return s


def brevis_run(item: str, threads: int, mode: str, tmp: Path) -> dict:
    out = tmp / f"{item}.brv"
    s = launch(["compress", str(CORPUS / item), "-o", str(out), "-f", "-j", str(threads)], mode)
    s["sha256"] = subprocess.run(["sha256sum", str(out)], capture_output=True, text=True).stdout.split()[0]
    return s


CORES = (16, 64)


def serial_share(items: list[str], repeat: int) -> None:
    """Per item and command: -j1's wall time, -j2's with worker processes
    (wall, main and workers' CPU seconds), the serial share and the
    projected speed-ups and throughputs on CORES (module docstring). The
    archive is written and decoded under the system's temporary folder;
    best of `repeat` runs (by wall time) for each."""
    print("| item | MB | command | -j1 s | -j2 s (processes) | -j2/-j1 | main CPU s | main thread / writer / pool "
          "threads CPU s | workers CPU s | serial share | "
          + " | ".join(f"projected {n} cores: speed-up, MB/s" for n in CORES) + " | "
          + " | ".join(f"{n} cores, overlapping: speed-up, MB/s" for n in CORES) + " |")
    print("|---|---:|---|---:|---:|---:|---:|---:|---:|---:|" + "---:|" * 2 * len(CORES))
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        for item in items:
            archive, out = tmp / f"{item}.brv", tmp / "out"
            commands = {
                "compress": lambda j: ["compress", str(CORPUS / item), "-o", str(archive), "-f", "-j", str(j)],
                "decompress": lambda j: ["decompress", str(archive), "-o", str(out), "-f", "-j", str(j)],
            }
            for name, args in commands.items():
                best = {}
                for _ in range(repeat):
                    for j, mode in ((1, "auto"), (2, "processes")):
                        s = launch(args(j), mode)
                        if j not in best or s["seconds"] < best[j]["seconds"]:
                            best[j] = s
                one, two = best[1], best[2]
                main, workers = two["cpu_s"], two["child_cpu_s"]
                share = main / (main + workers)
                mb = one["original_bytes"] / 1e6
                thread, writer = two["main_thread_cpu_s"], two.get("writer_cpu_s", 0.0)
                pool = max(0.0, main - thread - writer)
                cells = []
                for n in CORES:
                    wall = main + workers / n
                    cells.append(f"{one['seconds'] / wall:.1f}x, {mb / wall:.0f}")
                for n in CORES:
                    wall = max(thread, writer, pool, workers / n)
                    cells.append(f"{one['seconds'] / wall:.1f}x, {mb / wall:.0f}")
                print(f"| {item} | {mb:.0f} | {name} | {one['seconds']:.2f} | {two['seconds']:.2f} | "
                      f"{one['seconds'] / two['seconds']:.2f} | {main:.2f} | {thread:.2f} / {writer:.2f} / {pool:.2f} | "
                      f"{workers:.2f} | {share:.1%} | " + " | ".join(cells) + " |", flush=True)


def measured_cores(items: list[str], jobs: list[int], repeat: int, tmp: Path) -> None:
    """Per item and command, at each -jN of `jobs`: best wall time of
    `repeat` runs, speed-up against jobs[0], CPU seconds of the main
    process and of its workers, serial share, and zstd -3 with N threads
    on the same bytes (module docstring). Archives are written and decoded
    under `tmp`; the archives of every -jN must be the same to the byte."""
    print("| item | MB | command | -jN | seconds | MB/s | speed-up | process s | main CPU s | workers CPU s | "
          "serial share | system CPU s (main + workers) | page faults, thousands (main + workers) | "
          "peak RSS MiB (main + largest worker) | zstd -3 tN MB/s | zstd speed-up |")
    print("|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for item in items:
        archive, out = tmp / f"{item}.brv", tmp / f"{item}.out"
        commands = {  # compress writes `archive` (brevis_run's), with its digest
            "compress": lambda j: brevis_run(item, j, "auto", tmp),
            "decompress": lambda j: launch(["decompress", str(archive), "-o", str(out), "-f", "-j", str(j)], "auto"),
        }
        digests = set()
        for name, run in commands.items():
            best: dict[int, dict] = {}
            for _ in range(repeat):
                for j in jobs:
                    s = run(j)
                    if "sha256" in s:
                        digests.add(s["sha256"])
                    if j not in best or s["seconds"] < best[j]["seconds"]:
                        best[j] = s
            assert len(digests) == 1, f"{item}: the archives of {jobs} differ"
            zstd = {j: max(zstd_run(item, j, decode=name == "decompress") for _ in range(repeat)) for j in jobs}
            first = best[jobs[0]]
            for j in jobs:
                s = best[j]
                main, workers = s["cpu_s"], s["child_cpu_s"]
                mb = s["original_bytes"] / 1e6
                # Only worker processes split the CPU between serial and shared work; threads count as main's.
                share = f"{main / (main + workers):.1%}" if workers else "- (one process)"
                print(f"| {item} | {mb:.0f} | {name} | {j} | {s['seconds']:.3f} | {mb / s['seconds']:.0f} | "
                      f"{first['seconds'] / s['seconds']:.2f}x | {s['process_seconds']:.2f} | {main:.2f} | "
                      f"{workers:.2f} | {share} | {s['sys_s']:.2f} + {s['child_sys_s']:.2f} | "
                      f"{s['faults'] / 1e3:.1f} + {s['child_faults'] / 1e3:.1f} | "
                      f"{s['rss_kib'] // 1024} + {s['child_rss_kib'] // 1024} | "
                      f"{zstd[j]:.0f} | {zstd[j] / zstd[jobs[0]]:.2f}x |", flush=True)
        shutil.rmtree(out, ignore_errors=True)
        archive.unlink(missing_ok=True)


def concurrent_runs(items: list[str], counts: list[int], repeat: int, tmp: Path) -> None:
    """The machine's own scaling, as a bound for -jN's: K independent
    `brevis compress -j1` (then decompress -j1) of the same item started
    together, for each K of `counts`; their aggregate throughput (K times
    the item over the longest run's own seconds, as -jN's, without the
    interpreters' start) against K = 1's. Best of `repeat` by the wall
    time of all K; the input is read from the page cache by all of them."""
    print("| item | MB | command | K processes at once | wall s (processes) | longest brevis s | aggregate MB/s | "
          "speed-up | mean CPU s each | mean system CPU s each |")
    print("|---|---:|---|---:|---:|---:|---:|---:|---:|---:|")
    for item in items:
        archive = Path(brevis_run(item, 1, "auto", tmp)["archive"])
        commands = {
            "compress": lambda k: ["compress", str(CORPUS / item), "-o", str(tmp / f"{item}.{k}.brv"), "-f", "-j", "1"],
            "decompress": lambda k: ["decompress", str(archive), "-o", str(tmp / f"{item}.{k}.out"), "-f", "-j", "1"],
        }
        for name, args in commands.items():
            first = None
            for k in counts:
                best = None
                for _ in range(repeat):
                    begun = time.perf_counter()
                    runs = [launched(p) for p in [start(args(i), "auto") for i in range(k)]]
                    wall = time.perf_counter() - begun
                    if best is None or wall < best[0]:
                        best = (wall, runs)
                wall, runs = best
                mb = runs[0]["original_bytes"] / 1e6
                longest = max(r["seconds"] for r in runs)  # without the interpreters' start, as -jN's seconds
                first = first or mb / longest
                cpu = sum(r["cpu_s"] + r["child_cpu_s"] for r in runs) / k
                system = sum(r["sys_s"] + r["child_sys_s"] for r in runs) / k
                print(f"| {item} | {mb:.0f} | {name} | {k} | {wall:.2f} | {longest:.3f} | {k * mb / longest:.0f} | "
                      f"{k * mb / longest / first:.2f}x | {cpu:.2f} | {system:.2f} |", flush=True)
            for k in range(max(counts)):
                shutil.rmtree(tmp / f"{item}.{k}.out", ignore_errors=True)
                (tmp / f"{item}.{k}.brv").unlink(missing_ok=True)
        archive.unlink(missing_ok=True)


def zstd_run(item: str, threads: int, decode: bool = False) -> float:
    """zstd -3 on the item's files in memory, MB/s of original bytes: compressing
    with `threads` threads, or (`decode`) decoding the frames that makes
    (python-zstandard decodes a frame on one thread)."""
    import zstandard

    total, seconds = 0, 0.0
    for p in files_of(item):
        data = p.read_bytes()
        c = zstandard.ZstdCompressor(level=3, threads=threads)
        if decode:
            frame, d = c.compress(data), zstandard.ZstdDecompressor()
            t = time.perf_counter()
            d.decompress(frame, max_output_size=len(data))
        else:
            t = time.perf_counter()
            c.compress(data)
        seconds += time.perf_counter() - t
        total += len(data)
    return total / seconds / 1e6


MODES = {"j1": (1, "auto"), "j2": (2, "auto"), "j2-threads": (2, "threads"), "j2-processes": (2, "processes")}


def scaling(items: list[str], modes: list[str], repeat: int) -> None:
    print("| item | MB | " + " | ".join(f"brevis {m} MB/s" for m in modes) + " | j2/j1 | zstd -3 t1 | zstd -3 t2 | "
          "t2/t1 | peak RSS MiB j1 | j2 (main + largest worker) |")
    print("|---|---:|" + "---:|" * (len(modes) + 6))
    with tempfile.TemporaryDirectory() as tmp:
        for item in items:
            best: dict[str, dict] = {}
            for _ in range(repeat):
                for m in modes:
                    threads, mode = MODES[m]
                    s = brevis_run(item, threads, mode, Path(tmp))
                    if m not in best or s["throughput_mb_s"] > best[m]["throughput_mb_s"]:
                        best[m] = s
            hashes = {s["sha256"] for s in best.values()}
            assert len(hashes) == 1, f"{item}: archives differ between modes"
            z1 = max(zstd_run(item, 1) for _ in range(repeat))
            z2 = max(zstd_run(item, 2) for _ in range(repeat))
            size = best[modes[0]]["original_bytes"] / 1e6
            cells = [f"{best[m]['throughput_mb_s']:.1f}" for m in modes]
            ratio = (f"{best['j2']['throughput_mb_s'] / best['j1']['throughput_mb_s']:.2f}"
                     if "j1" in best and "j2" in best else "")
            rss1 = best["j1"]["rss_kib"] // 1024 if "j1" in best else ""
            rss2 = (f"{best['j2']['rss_kib'] // 1024} + {best['j2']['child_rss_kib'] // 1024}"
                    if "j2" in best else "")
            print(f"| {item} | {size:.0f} | " + " | ".join(cells) + f" | {ratio} | {z1:.0f} | {z2:.0f} | "
                  f"{z2 / z1:.2f} | {rss1} | {rss2} |", flush=True)


def dask_scaling(items: list[str], repeat: int) -> None:
    print("| workers | checkpoints | MB | seconds | MB/s | speed-up |")
    print("|---:|---|---:|---:|---:|---:|")
    first = None
    for workers in (1, 2):
        best = None
        for _ in range(repeat):
            with tempfile.TemporaryDirectory() as tmp:
                r = subprocess.run([sys.executable, "-m", "brevis", "compress-many",
                                    *[str(CORPUS / i) for i in items], "-o", tmp, "-w", str(workers),
                                    "--engine", "dask", "--json", "-q"], capture_output=True, text=True,
                                   env=ENV, timeout=3600)
                if r.returncode != 0:
                    raise SystemExit(r.stderr)
                s = json.loads(r.stdout)
                if best is None or s["seconds"] < best["seconds"]:
                    best = s
        first = first or best["seconds"]
        mb = best["original_bytes"] / 1e6
        print(f"| {workers} | {', '.join(items)} | {mb:.0f} | {best['seconds']:.1f} | {mb / best['seconds']:.1f} | "
              f"{first / best['seconds']:.2f} |", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--items", default=",".join(ITEMS))
    ap.add_argument("--modes", default="j1,j2", help=f"of {', '.join(MODES)}")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--dask", default="", help="items for compress-many with 1 and 2 Dask workers")
    ap.add_argument("--serial", action="store_true", help="the serial share and projected speed-ups instead")
    ap.add_argument("--jobs", default="", help="-jN to measure compress and decompress at, e.g. 1,4,16")
    ap.add_argument("--concurrent", default="", help="K independent -j1 runs at once, e.g. 1,4,16: the machine's scaling")
    ap.add_argument("--tmp", default=None, help="folder for --jobs' archives and outputs (default: the system's)")
    args = ap.parse_args()
    print(f"{time.strftime('%Y-%m-%d %H:%M')}, load average {os.getloadavg()}, {os.cpu_count()} CPUs")
    if args.jobs or args.concurrent:
        with tempfile.TemporaryDirectory(dir=args.tmp) as tmp:
            if args.jobs:
                measured_cores(args.items.split(","), [int(j) for j in args.jobs.split(",")], args.repeat, Path(tmp))
            if args.concurrent:
                concurrent_runs(args.items.split(","), [int(k) for k in args.concurrent.split(",")], args.repeat,
                                Path(tmp))
    elif args.serial:
        serial_share(args.items.split(","), args.repeat)
    elif args.items:
        scaling(args.items.split(","), args.modes.split(","), args.repeat)
    if args.dask:
        dask_scaling(args.dask.split(","), args.repeat)
    print(f"load average at the end {os.getloadavg()}")


if __name__ == "__main__":
    main()
