"""Benchmark Brevis against general and model-specific compressors.

    python benchmarks/run.py [CORPUS] [--items a,b] [--codecs c,d] [--threads N] [--out DIR]

CORPUS is a folder with one subfolder per item (default ~/.cache/brevis-corpus,
built by fetch-corpus.sh). An item's files are those its MANIFEST.json entry
lists, or else the regular files at its top level except SOURCE.json and
hidden ones. Every codec run is a separate process; every output is
decompressed and compared with the original by SHA-256. Writes latest.md,
latest.json and plot.png to DIR. Exits 1 if any round trip failed.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if __name__ == "__main__":  # run as a script: import this folder as the package it is
    sys.path[0] = str(ROOT)

from benchmarks import report  # noqa: E402
from benchmarks.codecs import BY_NAME, Codec  # noqa: E402
from benchmarks.entropy import file_dtypes, file_entropy  # noqa: E402

DEFAULT_CORPUS = Path.home() / ".cache" / "brevis-corpus"
SKIP_FILES = {"SOURCE.json"}


class WorkerError(Exception):
    pass


def threads_available() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


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
            dtypes = [{k: v["bytes"] for k, v in e.get("dtypes", {}).items()} for e in entries]
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

def run_worker(job: dict, scratch: Path) -> tuple[float, float]:
    """Run one job in a fresh process: (seconds, peak RSS in MiB)."""
    jobfile = scratch / "job.json"
    jobfile.write_text(json.dumps(job))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    p = subprocess.run([sys.executable, "-m", "benchmarks.worker", str(jobfile)],
                       cwd=ROOT, env=env, capture_output=True, text=True)
    if p.returncode != 0:
        raise WorkerError(f"{job['codec']} {job['action']} exited {p.returncode}: {p.stderr.strip()[-2000:]}")
    out = json.loads(p.stdout.strip().splitlines()[-1])
    return out["seconds"], out["peak_mib"]


def bench_codec(codec: Codec, item: dict, hashes: list[str], threads: int, scratch: Path) -> dict:
    why = codec.unsupported(item["files"], item["dtypes"])
    if why:
        return {"status": "unsupported", "note": why}
    work, out = scratch / "work", scratch / "out"
    for d in (work, out):
        shutil.rmtree(d, ignore_errors=True)
    work.mkdir()
    job = {"codec": codec.name, "threads": threads, "files": [str(f) for f in item["files"]],
           "names": item["names"], "dtypes": item["dtypes"], "work": str(work), "out": str(out)}
    original = sum(f.stat().st_size for f in item["files"])
    try:
        c_s, c_mem = run_worker(dict(job, action="compress"), scratch)
        stored = tree_bytes(work)
        d_s, d_mem = run_worker(dict(job, action="decompress"), scratch)
        bad = [n for n, h in zip(item["names"], hashes) if not (out / n).is_file() or sha256(out / n) != h]
        if bad:
            raise WorkerError(f"decompressed output differs from the input: {', '.join(bad)}")
    except WorkerError as e:
        return {"status": "FAILED", "note": str(e)}
    finally:
        for d in (work, out):
            shutil.rmtree(d, ignore_errors=True)
    return {"status": "ok", "original_bytes": original, "compressed_bytes": stored,
            "ratio": stored / original, "compress_s": c_s, "decompress_s": d_s,
            "compress_mb_s": original / c_s / 1e6, "decompress_mb_s": original / d_s / 1e6,
            "compress_peak_mib": c_mem, "decompress_peak_mib": d_mem}


# ---------------------------------------------------------------- the whole run

def overall(items: list[dict], codec: str, only: list[dict] | None = None) -> dict:
    """Byte-weighted totals of a codec over the items it ran on (or over `only`)."""
    runs = [it["results"][codec] for it in (items if only is None else only)]
    ok = [r for r in runs if r["status"] == "ok"]
    out = {"items": len(ok), "of": len(runs), "failed": sum(r["status"] == "FAILED" for r in runs)}
    if only is None and 0 < len(ok) < len(runs):  # the others on the same items, to compare like with like
        same = [it for it in items if it["results"][codec]["status"] == "ok"]
        out["same_items"] = {c: overall(items, c, same).get("ratio") for c in items[0]["results"]}
    if ok:
        orig = sum(r["original_bytes"] for r in ok)
        out.update({
            "original_bytes": orig,
            "compressed_bytes": sum(r["compressed_bytes"] for r in ok),
            "ratio": sum(r["compressed_bytes"] for r in ok) / orig,
            "compress_mb_s": orig / sum(r["compress_s"] for r in ok) / 1e6,
            "decompress_mb_s": orig / sum(r["decompress_s"] for r in ok) / 1e6,
            "compress_peak_mib": max(r["compress_peak_mib"] for r in ok),
            "decompress_peak_mib": max(r["decompress_peak_mib"] for r in ok),
        })
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("corpus", nargs="?", type=Path, default=DEFAULT_CORPUS)
    ap.add_argument("--items", help="comma-separated item names (default: all)")
    ap.add_argument("--codecs", help=f"comma-separated, from {','.join(BY_NAME)} (default: all)")
    ap.add_argument("--threads", type=int, default=threads_available())
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    ap.add_argument("--tmp", type=Path, default=None, help="scratch folder (default: the system's)")
    args = ap.parse_args(argv)

    wanted = [c for c in args.codecs.split(",") if c] if args.codecs else list(BY_NAME)
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
    scratch = Path(tempfile.mkdtemp(prefix="brevis-bench-", dir=args.tmp))
    failures = []
    loads = [os.getloadavg()[0]]  # sampled before every codec run
    try:
        baseline = {}
        for c in codecs:
            try:
                baseline[c.name] = run_worker({"codec": c.name, "action": "idle", "threads": args.threads,
                                               "files": [], "names": [], "dtypes": [], "work": str(scratch),
                                               "out": ""}, scratch)[1]
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
                r = bench_codec(c, item, hashes, args.threads, scratch)
                item["results"][c.name] = r
                if r["status"] == "ok":
                    log(f"  {c.name:10} ratio {r['ratio']:.4f}  c {r['compress_mb_s']:8.1f} MB/s  "
                        f"d {r['decompress_mb_s']:8.1f} MB/s  peak {r['compress_peak_mib']:.0f}/"
                        f"{r['decompress_peak_mib']:.0f} MiB")
                else:
                    log(f"  {c.name:10} {r['status']}: {r['note']}")
                    if r["status"] == "FAILED":
                        failures.append(f"{item['name']} / {c.name}: {r['note']}")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)

    total = sum(it["original_bytes"] for it in items)
    result = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": {"arch": platform.machine(), "nproc": threads_available(), "python": platform.python_version(),
                    "loadavg_1min": {"min": round(min(loads), 2), "mean": round(sum(loads) / len(loads), 2),
                                     "max": round(max(loads), 2)}},
        "threads": args.threads,
        "brevis_revision": revision(),
        "corpus": str(args.corpus),
        "codecs": [{"name": c.name, "label": c.label, "baseline_peak_mib": baseline.get(c.name)} for c in codecs],
        "skipped": skipped,
        "items": [{k: (v if k != "files" else [str(f) for f in v]) for k, v in it.items()} for it in items],
        "overall": {c.name: overall(items, c.name) for c in codecs},
        "entropy": {"original_bytes": total, "entropy_bytes": sum(it["entropy_bytes"] for it in items),
                    "ratio": sum(it["entropy_bytes"] for it in items) / total if total else None},
        "failures": failures,
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
