"""Benchmark Brevis against general and model-specific compressors.

    python benchmarks/run.py [CORPUS | --corpus PATH] [--items a,b] [--codecs c,d|all] [--modes m,n]
                             [--threads N] [--out DIR] [--tmp DISK_DIR] [--tmpfs TMPFS_DIR]

CORPUS is a folder with one subfolder per item (default ~/.cache/brevis-corpus,
built by fetch-corpus.sh). An item's files are those its MANIFEST.json entry
lists, or else the regular files at its top level except SOURCE.json and
hidden ones. Each codec is timed in up to four passes (--modes): in memory
(codec calls only), file to file with outputs on tmpfs, file to file on
disk, and in memory on one thread for CPU seconds per GB. Every compression
and decompression is a separate process; every pass's output is
decompressed and compared with the original by SHA-256. Writes latest.md,
latest.json and plot.png to DIR. Exits 1 if any round trip failed.
Details: benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if __name__ == "__main__":  # run as a script: import this folder as the package it is
    sys.path[0] = str(ROOT)

from benchmarks import report, startup  # noqa: E402
from benchmarks.codecs import BY_NAME, DEFAULT, SLOW, Codec  # noqa: E402
from benchmarks.entropy import file_dtypes, file_entropy  # noqa: E402

DEFAULT_CORPUS = Path.home() / ".cache" / "brevis-corpus"
SKIP_FILES = {"SOURCE.json"}


class WorkerError(Exception):
    pass


def threads_available() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def cpu_model() -> str:
    """The processor's name and its widest vector extension (Linux's
    /proc/cpuinfo; the machine name elsewhere): figures of one processor do
    not carry to another (on an AMD EPYC with AVX-512 both Brevis and pcodec
    decoded slower than on the processor of the runs before, and the items
    where each leads changed)."""
    try:
        with open("/proc/cpuinfo") as f:
            info = f.read()
    except OSError:
        return platform.processor() or platform.machine()
    fields = {}
    for line in info.splitlines():  # the first processor's lines
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    name, flags = fields.get("model name", "?"), fields.get("flags", "").split()
    widest = next((label for flag, label in (("avx512f", "AVX-512"), ("avx2", "AVX2"), ("sse4_2", "SSE4.2"))
                   if flag in flags), None)
    return f"{name} ({widest})" if widest else name


# ---------------------------------------------------------------- the corpus

def load_items(corpus: Path, wanted: list[str] | None) -> list[dict]:
    """[{name, files: [Path], names: [str], dtypes: [{dtype: bytes}]}]"""
    manifest = {}
    if (corpus / "MANIFEST.json").is_file():
        manifest = {m["item"]: m for m in json.loads((corpus / "MANIFEST.json").read_text())}
    names = sorted(p.name for p in corpus.iterdir() if p.is_dir() and not p.name.startswith("."))
    if wanted:
        missing = [w for w in wanted if w not in names]
        if missing:
            raise SystemExit(f"no such item in {corpus}: {', '.join(missing)}")
        names = [n for n in names if n in wanted]
    items = []
    for name in names:
        folder = corpus / name
        if name in manifest:
            entries = manifest[name]["files"]
            files = [corpus / e["file"] for e in entries]
            dtypes = [{k: v["bytes"] for k, v in e.get("dtypes", {}).items()} or file_dtypes(f)
                      for e, f in zip(entries, files)]
        else:
            files = sorted(p for p in folder.iterdir()
                           if p.is_file() and p.name not in SKIP_FILES and not p.name.startswith("."))
            dtypes = [file_dtypes(p) for p in files]
        if files:
            items.append({"name": name, "files": files, "names": [f.name for f in files], "dtypes": dtypes})
    if not items:
        raise SystemExit(f"no items in {corpus}")
    return items


def revision() -> str | None:
    """The commit of the brevis being measured, '+dirty' if its files differ from it."""
    try:
        git = ["git", "-C", str(ROOT)]
        head = subprocess.run(git + ["rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True)
        dirty = subprocess.run(git + ["status", "--porcelain", "--", "brevis"], capture_output=True, text=True)
    except (OSError, subprocess.CalledProcessError):
        return None
    return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


def tree_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


# ---------------------------------------------------------------- one codec run

# The timed passes, each a compression and a decompression in worker
# processes: (name, the worker's mode, threads: None = --threads, where).
MODES = {
    "memory": ("memory", None, "tmpfs"),  # codec calls only, input and output in memory
    "tmpfs": ("file", None, "tmpfs"),     # file to file, outputs on tmpfs
    "disk": ("file", None, "disk"),       # file to file, outputs on disk
    "cpu": ("memory", 1, "tmpfs"),        # in memory on one thread: CPU seconds per GB
}


def run_worker(job: dict, scratch: Path) -> dict:
    """Run one job in a fresh process: the worker's report (seconds, cpu_s, peak_mib, ...)."""
    jobfile = scratch / "job.json"
    jobfile.write_text(json.dumps(job))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    # The worker imports numpy for every codec; its OpenBLAS would start a
    # thread per core that spins for about 0.1 s after the import, into the
    # timed part, taking a core from codecs that decode on two threads
    # (one-shot unpack of silero: 10.1 ms against 7.8 with one BLAS thread). No codec
    # here does linear algebra.
    env.setdefault("OPENBLAS_NUM_THREADS", "1")
    p = subprocess.run([sys.executable, "-m", "benchmarks.worker", str(jobfile)],
                       cwd=ROOT, env=env, capture_output=True, text=True)
    if p.returncode != 0:
        raise WorkerError(f"{job['codec']} {job['action']} ({job.get('mode', 'file')}) exited {p.returncode}: "
                          f"{p.stderr.strip()[-2000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def clear(path: Path) -> None:
    """Remove a scratch folder, or a file a codec left in its place."""
    if path.is_file() or path.is_symlink():
        path.unlink()
    shutil.rmtree(path, ignore_errors=True)


def bench_codec(codec: Codec, item: dict, hashes: list[str], threads: int, places: dict[str, Path],
                modes: list[str], repeat: int = 1) -> dict:
    """Every pass of `modes` for one codec on one item; each output checked
    against `hashes`. With repeat > 1, each compression and decompression
    runs that many times: the least seconds, CPU seconds and peak are kept
    (each its own minimum)."""
    why = codec.unsupported(item["files"], item["dtypes"])
    if why:
        return {"status": "unsupported", "note": why}
    original = sum(f.stat().st_size for f in item["files"])
    runs: dict[str, dict] = {}
    checked_by = set()
    for mode in modes:
        kind, mode_threads, where = MODES[mode]
        mode_threads = mode_threads or threads
        if mode == "cpu" and threads == 1 and "memory" in runs:  # the same pass
            runs["cpu"] = dict(runs["memory"], same_as="memory")
            continue
        work, out = places[where] / "work", places[where] / "out"
        job = {"codec": codec.name, "mode": kind, "threads": mode_threads, "files": [str(f) for f in item["files"]],
               "names": item["names"], "dtypes": item["dtypes"], "work": str(work), "out": str(out)}
        try:
            cs, ds = [], []
            for _ in range(repeat):  # best of `repeat`: each compression replaces the last one's output
                clear(work)
                work.mkdir()
                cs.append(run_worker(dict(job, action="compress"), places["tmpfs"]))
            stored = tree_bytes(work)
            for _ in range(repeat):
                clear(out)
                ds.append(run_worker(dict(job, action="decompress"), places["tmpfs"]))
                if kind == "file":
                    got = [sha256(out / n) if (out / n).is_file() else None for n in item["names"]]
                else:
                    got = ds[-1]["hashes"]
                bad = [n for n, h, g in zip(item["names"], hashes, got) if g != h]
                if bad:
                    raise WorkerError(f"{mode}: decompressed output differs from the input: {', '.join(bad)}")
                checked_by.add("sha256")
        except WorkerError as e:
            return {"status": "FAILED", "note": str(e)}
        finally:
            for d_ in (work, out):
                clear(d_)
        c = {k: min(r[k] for r in cs) for k in ("seconds", "cpu_s", "peak_mib")}
        d = {k: min(r[k] for r in ds) for k in ("seconds", "cpu_s", "peak_mib")}
        runs[mode] = {"threads": mode_threads, "compressed_bytes": stored,
                      "compress_s": c["seconds"], "decompress_s": d["seconds"],
                      # the best run hides a change that betters the typical run and worsens
                      # the slow ones: the median of the runs is kept beside it
                      "compress_s_median": statistics.median(r["seconds"] for r in cs),
                      "decompress_s_median": statistics.median(r["seconds"] for r in ds),
                      # and the mean, the time a user waits on average: a slow run now
                      # and then (huge pages faulted in by the host) moves neither the
                      # best nor the median of three
                      "compress_s_mean": statistics.fmean(r["seconds"] for r in cs),
                      "decompress_s_mean": statistics.fmean(r["seconds"] for r in ds),
                      "compress_cpu_s": c["cpu_s"], "decompress_cpu_s": d["cpu_s"],
                      "compress_peak_mib": c["peak_mib"], "decompress_peak_mib": d["peak_mib"]}
    # The size: of the file-to-file output where there is one (the in-memory
    # form is the same bytes, or zstd's one-shot frame instead of its stream).
    ref = next(runs[m] for m in ("disk", "tmpfs", "memory", "cpu") if m in runs)
    r = {"status": "ok", "original_bytes": original, "compressed_bytes": ref["compressed_bytes"],
         "ratio": ref["compressed_bytes"] / original, "checked_by": sorted(checked_by), "runs": runs}
    r.update(flat(runs, original))
    return r


def flat(runs: dict[str, dict], original: int) -> dict:
    """The figures the tables show, from the passes: MB/s per pass, CPU s/GB
    on one thread, peaks; compress_mb_s / decompress_mb_s and the peaks
    without a suffix: file to file on disk (else tmpfs), as before."""
    out = {}
    for mode, run in runs.items():
        for what in ("compress", "decompress"):
            s = run[f"{what}_s"]
            out[f"{what}_mb_s_{mode}"] = original / s / 1e6 if s > 0 else None
            out[f"{what}_peak_mib_{mode}"] = run[f"{what}_peak_mib"]
            for stat in ("median", "mean"):
                s = run.get(f"{what}_s_{stat}", run[f"{what}_s"])
                out[f"{what}_mb_s_{mode}_{stat}"] = original / s / 1e6 if s > 0 else None
    if "cpu" in runs:
        for what in ("compress", "decompress"):
            out[f"{what}_cpu_s_per_gb"] = runs["cpu"][f"{what}_cpu_s"] / original * 1e9 if original else None
    file_mode = next((m for m in ("disk", "tmpfs") if m in runs), None)
    if file_mode:
        for what in ("compress", "decompress"):
            out[f"{what}_s"] = runs[file_mode][f"{what}_s"]
            out[f"{what}_mb_s"] = out[f"{what}_mb_s_{file_mode}"]
            out[f"{what}_peak_mib"] = runs[file_mode][f"{what}_peak_mib"]
    return out


# ---------------------------------------------------------------- the whole run

def overall(items: list[dict], codec: str, only: list[dict] | None = None) -> dict:
    """Byte-weighted totals of a codec over the items it ran on (or over `only`)."""
    runs = [it["results"][codec] for it in (items if only is None else only)]
    ok = [r for r in runs if r["status"] == "ok"]
    out = {"items": len(ok), "of": len(runs), "failed": sum(r["status"] == "FAILED" for r in runs)}
    if only is None and 0 < len(ok) < len(runs):  # the others on the same items, to compare like with like
        same = [it for it in items if it["results"][codec]["status"] == "ok"]
        keys = ("ratio", "compress_mb_s_memory", "decompress_mb_s_memory", "decompress_mb_s_disk")
        out["same_items"] = {c: {k: v for k, v in overall(items, c, same).items() if k in keys}
                             for c in items[0]["results"]}
    if ok:
        orig = sum(r["original_bytes"] for r in ok)
        out.update({
            "original_bytes": orig,
            "compressed_bytes": sum(r["compressed_bytes"] for r in ok),
            "ratio": sum(r["compressed_bytes"] for r in ok) / orig,
        })
        for mode in MODES:
            if not all(mode in r["runs"] for r in ok):
                continue
            for what in ("compress", "decompress"):
                s = sum(r["runs"][mode][f"{what}_s"] for r in ok)
                out[f"{what}_mb_s_{mode}"] = orig / s / 1e6 if s > 0 else None
                for stat in ("median", "mean"):
                    s = sum(r["runs"][mode].get(f"{what}_s_{stat}", r["runs"][mode][f"{what}_s"]) for r in ok)
                    out[f"{what}_mb_s_{mode}_{stat}"] = orig / s / 1e6 if s > 0 else None
                out[f"{what}_peak_mib_{mode}"] = max(r["runs"][mode][f"{what}_peak_mib"] for r in ok)
                if mode == "cpu":
                    out[f"{what}_cpu_s_per_gb"] = sum(r["runs"][mode][f"{what}_cpu_s"] for r in ok) / orig * 1e9
        file_mode = next((m for m in ("disk", "tmpfs") if f"compress_mb_s_{m}" in out), None)
        if file_mode:
            for what in ("compress", "decompress"):
                out[f"{what}_mb_s"] = out[f"{what}_mb_s_{file_mode}"]
                out[f"{what}_peak_mib"] = out[f"{what}_peak_mib_{file_mode}"]
    return out


def fs_type(path: Path) -> str:
    """The file system a folder is on (Linux: from /proc/mounts), or '?'."""
    try:
        target, best = str(path.resolve()), ("", "?")
        for line in Path("/proc/mounts").read_text().splitlines():
            _, mount, kind, *_ = line.split()
            mount = mount.replace("\\040", " ")
            if (target == mount or target.startswith(mount.rstrip("/") + "/")) and len(mount) >= len(best[0]):
                best = (mount, kind)
        return best[1]
    except OSError:
        return "?"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("corpus", nargs="?", type=Path, default=None)
    ap.add_argument("--corpus", dest="corpus_opt", type=Path, metavar="PATH",
                    help=f"the corpus folder, as the positional argument (default {DEFAULT_CORPUS}; "
                         "fetch-own-corpus.sh builds ~/.cache/brevis-own-corpus)")
    ap.add_argument("--items", help="comma-separated item names (default: all)")
    ap.add_argument("--codecs", help=f"comma-separated, from {','.join(BY_NAME)}, or 'all' "
                                     f"(default: all but the slow {', '.join(sorted(SLOW))})")
    ap.add_argument("--modes", default=",".join(MODES),
                    help=f"the timed passes, comma-separated, from {','.join(MODES)} (default: all)")
    ap.add_argument("--threads", type=int, default=threads_available())
    ap.add_argument("--repeat", type=int, default=1,
                    help="run each compression and decompression this many times, keep the best (default 1)")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    ap.add_argument("--tmp", type=Path, default=None,
                    help="scratch folder on disk: the 'disk' pass's outputs (default: the system's)")
    ap.add_argument("--no-startup", dest="startup", action="store_false",
                    help="skip the startup table (benchmarks/startup.py: fresh `brevis` processes, about 10 s)")
    ap.add_argument("--tmpfs", type=Path, default=Path("/dev/shm"),
                    help="a folder on tmpfs: the 'memory', 'tmpfs' and 'cpu' passes' outputs (default /dev/shm)")
    args = ap.parse_args(argv)
    if args.corpus and args.corpus_opt and args.corpus != args.corpus_opt:
        ap.error("give the corpus once: as CORPUS or as --corpus")
    args.corpus = args.corpus_opt or args.corpus or DEFAULT_CORPUS
    modes = [m for m in args.modes.split(",") if m]
    if not modes or any(m not in MODES for m in modes):
        ap.error(f"--modes: from {','.join(MODES)}")
    modes = [m for m in MODES if m in modes]  # in their order: cpu reuses memory's pass at one thread

    if args.codecs == "all":
        wanted = list(BY_NAME)
    else:
        wanted = [c for c in args.codecs.split(",") if c] if args.codecs else list(DEFAULT)
    unknown = [c for c in wanted if c not in BY_NAME]
    if unknown:
        raise SystemExit(f"unknown codec(s): {', '.join(unknown)}; known: {', '.join(BY_NAME)}")
    items = load_items(args.corpus.expanduser(), [i for i in args.items.split(",") if i] if args.items else None)

    codecs, skipped = [], {}
    for c in (BY_NAME[n] for n in wanted):
        why = c.available()
        if why:
            skipped[c.name] = why
            log(f"skipping {c.name}: {why}")
        else:
            codecs.append(c)

    args.out.mkdir(parents=True, exist_ok=True)
    if not args.tmpfs.is_dir():
        raise SystemExit(f"--tmpfs {args.tmpfs}: no such folder")
    scratch = Path(tempfile.mkdtemp(prefix="brevis-bench-", dir=args.tmp))
    shm = Path(tempfile.mkdtemp(prefix="brevis-bench-", dir=args.tmpfs))
    places = {"disk": scratch, "tmpfs": shm}
    filesystems = {k: fs_type(v) for k, v in places.items()}
    if filesystems["tmpfs"] != "tmpfs":
        log(f"warning: --tmpfs {args.tmpfs} is on {filesystems['tmpfs']}, not tmpfs")
    if filesystems["disk"] in ("tmpfs", "ramfs"):
        log(f"warning: the disk pass writes to {scratch}, on {filesystems['disk']}: give --tmp a folder on disk")
    failures = []
    loads = [os.getloadavg()[0]]  # sampled before every codec run
    try:
        baseline = {}
        for c in codecs:
            try:
                baseline[c.name] = run_worker({"codec": c.name, "action": "idle", "threads": args.threads,
                                               "files": [], "names": [], "dtypes": [], "work": str(shm),
                                               "out": ""}, shm)["peak_mib"]
            except WorkerError as e:
                baseline[c.name] = None
                log(f"{c.name}: idle run failed: {e}")
        for item in items:
            hashes = [sha256(f) for f in item["files"]]  # also warms the page cache
            ent = [file_entropy(f) for f in item["files"]]
            orig = sum(e["bytes"] for e in ent)
            item.update(original_bytes=orig, entropy_bytes=sum(e["entropy_bytes"] for e in ent),
                        float_tensor_bytes=sum(e["float_tensor_bytes"] for e in ent),
                        formats=sorted({e["format"] for e in ent}), results={})
            item["entropy_ratio"] = item["entropy_bytes"] / orig if orig else None
            log(f"{item['name']}: {orig / 1e6:.1f} MB, order-0 per-field entropy {item['entropy_ratio']:.4f}")
            for c in codecs:
                loads.append(os.getloadavg()[0])
                r = bench_codec(c, item, hashes, args.threads, places, modes, max(1, args.repeat))
                item["results"][c.name] = r
                if r["status"] == "ok":
                    log(f"  {c.name:10} ratio {r['ratio']:.4f}  " + "  ".join(
                        f"{m} c/d {r[f'compress_mb_s_{m}']:.1f}/{r[f'decompress_mb_s_{m}']:.1f}"
                        for m in modes if m != "cpu") +
                        (f"  cpu s/GB c/d {r['compress_cpu_s_per_gb']:.2f}/{r['decompress_cpu_s_per_gb']:.2f}"
                         if "cpu" in modes else ""))
                else:
                    log(f"  {c.name:10} {r['status']}: {r['note']}")
                    if r["status"] == "FAILED":
                        failures.append(f"{item['name']} / {c.name}: {r['note']}")
        if args.startup:
            log("startup: fresh brevis processes (benchmarks/startup.py)")
            startup_rows = startup.measure(5, args.tmpfs)
            for r in startup_rows:
                log(f"  {r['what']}: best {r['best_s']:.2f} s, median {r['median_s']:.2f} s")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
        shutil.rmtree(shm, ignore_errors=True)

    total = sum(it["original_bytes"] for it in items)
    result = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": {"arch": platform.machine(), "cpu": cpu_model(), "nproc": threads_available(),
                    "python": platform.python_version(),
                    "loadavg_1min": {"min": round(min(loads), 2), "mean": round(sum(loads) / len(loads), 2),
                                     "max": round(max(loads), 2)}},
        "threads": args.threads,
        "modes": modes,
        "repeat": max(1, args.repeat),
        "filesystems": {"tmpfs": f"{args.tmpfs} ({filesystems['tmpfs']})",
                        "disk": f"{scratch.parent} ({filesystems['disk']})"},
        "brevis_revision": revision(),
        "corpus": str(args.corpus),
        "codecs": [{"name": c.name, "label": c.label, "threads_note": c.threads_note,
                    "baseline_peak_mib": baseline.get(c.name)} for c in codecs],
        "skipped": skipped,
        "items": [{k: (v if k != "files" else [str(f) for f in v]) for k, v in it.items()} for it in items],
        "overall": {c.name: overall(items, c.name) for c in codecs},
        "entropy": {"original_bytes": total, "entropy_bytes": sum(it["entropy_bytes"] for it in items),
                    "ratio": sum(it["entropy_bytes"] for it in items) / total if total else None},
        "failures": failures,
        "startup": startup_rows if args.startup else None,
    }
    (args.out / "latest.json").write_text(json.dumps(result, indent=1) + "\n")
    (args.out / "latest.md").write_text(report.markdown(result))
    note = report.plot(result, args.out / "plot.png")
    if note:
        log(note)
    log(f"wrote {args.out / 'latest.md'}, latest.json" + ("" if note else ", plot.png"))
    if failures:
        log("\n!!! ROUND-TRIP FAILURES !!!\n" + "\n".join(failures))
        return 1
    return 0


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


if __name__ == "__main__":
    sys.exit(main())
