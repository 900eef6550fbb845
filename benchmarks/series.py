"""A training run's checkpoints archived as a series, against the deltas users have.

    python benchmarks/series.py [--run DIR] [--keyframes 1,2,3,4,6,8] [--threads N] [--repeats 3]
                                [--work DIR] [--keep] [--output FILE]

Two series of the run made by make_training_run.py (default
~/.cache/brevis-training-run): the full run (weights, optimizer state,
small files) and weights only (a run folder of symlinks to each
checkpoint's model.safetensors, made under the work folder). For each:

- the checkpoints' bytes; `zstd -3` of each file alone; `zstd -3
  --patch-from=PREV` of each file against the same file of the previous
  checkpoint (the CLI, -T N); ZipNN (float byte mode) of each file alone
  and of its XOR with the previous checkpoint's (ZipNN's delta recipe);
  files that are not mostly float count at their zstd -3 size in both;
- Brevis, `compress_run` with keyframe_every=1 (no chaining) and with each
  K of --keyframes (and the default K): archive bytes, compress seconds;
- decode time of every member of each chained run, and of the standalone
  (K=1) archive of the same checkpoint, in-process through brevis.decompress
  to tmpfs, best of --repeats; the runs of one checkpoint alternate, so
  load on the machine reaches them alike.

Checked: a round trip of the last checkpoint's patch-from and ZipNN XOR
files, and every member of the default K decoded and compared with its
checkpoint byte for byte. The peers' per-file figures are measured once,
on the full run: the weights series sums the model.safetensors files'.
Writes a Markdown report (default results/series-<rev>.md) and prints it.
Work files go in a fresh folder under --work (default: the system's temp
folder), removed at the end unless --keep.
"""

from __future__ import annotations

import argparse
import datetime
import filecmp
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if __name__ == "__main__":  # run as a script: import this folder as the package it is
    sys.path[0] = str(ROOT)

import numpy as np  # noqa: E402

from benchmarks.codecs import ZipNN, read_all  # noqa: E402
from benchmarks.entropy import file_dtypes  # noqa: E402
from benchmarks.run import fs_type, log, revision, threads_available  # noqa: E402
import brevis  # noqa: E402
from brevis.series import DEFAULT_KEYFRAME_EVERY, checkpoints  # noqa: E402

DEFAULT_RUN = Path.home() / ".cache" / "brevis-training-run"
WEIGHTS = "model.safetensors"
PEERS = ["zstd", "patch", "zipnn", "zipnn_xor"]
LABELS = {"raw": "checkpoints (sum of bytes)", "zstd": "zstd -3, each file alone",
          "patch": "zstd -3 --patch-from=previous", "zipnn": "ZipNN, each file alone",
          "zipnn_xor": "ZipNN of XOR with previous"}


def files_of(ckpt: Path) -> list[str]:
    """A checkpoint's files, relative to its folder (a file checkpoint: itself)."""
    if ckpt.is_file():
        return [""]
    return sorted(str(p.relative_to(ckpt)) for p in ckpt.rglob("*") if p.is_file())


def weights_run(run: Path, work: Path) -> Path:
    """A run folder of symlinks checkpoint-N/model.safetensors -> the real files."""
    out = work / "weights-run"
    for c in checkpoints(run):
        (out / c.name).mkdir(parents=True)
        (out / c.name / WEIGHTS).symlink_to((c.path / WEIGHTS).resolve())
    return out


def zstd_cli(args: list, threads: int) -> float:
    t = time.perf_counter()
    subprocess.run(["zstd", "-q", "-f", f"-T{threads}", *map(str, args)], check=True, capture_output=True)
    return time.perf_counter() - t


def measure_zstd(files: list[tuple], work: Path, threads: int) -> dict:
    """zstd -3 of each file alone, and --patch-from the previous checkpoint's
    file (the first checkpoint's, or a file new in its checkpoint: alone)."""
    out, tmp = {}, work / "zstd.tmp"
    for key, path, prev in files:
        s = zstd_cli(["-3", path, "-o", tmp], threads)
        alone = tmp.stat().st_size
        patch, ps = alone, s
        if prev is not None:
            ps = zstd_cli(["-3", f"--patch-from={prev}", path, "-o", tmp], threads)
            patch = tmp.stat().st_size
        out[key] = {"zstd": (alone, s), "patch": (patch, ps)}
        if prev is not None and key[0] == files[-1][0][0]:  # the last checkpoint's files
            check_patch(tmp, prev, path, work, threads)
    tmp.unlink(missing_ok=True)
    return out


def check_patch(patch: Path, prev: Path, path: Path, work: Path, threads: int) -> None:
    back = work / "zstd.back"
    zstd_cli(["-d", f"--patch-from={prev}", patch, "-o", back], threads)
    if not filecmp.cmp(back, path, shallow=False):
        raise SystemExit(f"zstd --patch-from round trip of {path} FAILED")
    back.unlink()
    log(f"  zstd --patch-from round trip of {path}: ok")


def measure_zipnn(files: list[tuple], zstd: dict, threads: int) -> dict:
    """ZipNN of each file alone and of its XOR with the previous checkpoint's
    (equal lengths only, else alone). Files not mostly float: their zstd -3."""
    with warnings.catch_warnings():  # zipnn imports torch, which warns about torch.jit
        warnings.simplefilter("ignore", FutureWarning)
        z = ZipNN()
        z.begin(threads)
    out = {}
    for key, path, prev in files:
        dt = ZipNN.float_dtype(file_dtypes(path))
        if dt is None:
            out[key] = {"zipnn": zstd[key]["zstd"], "zipnn_xor": zstd[key]["zstd"]}
            continue
        # ZipNN rewrites its input (and may write past its end): a fresh buffer per call.
        t = time.perf_counter()
        parts = z.compress_bytes(read_all(path), threads, dt)
        s = time.perf_counter() - t
        alone, d = sum(map(len, parts)), decode_seconds(z, parts, threads)
        xor, xs, xd = alone, s, d
        if prev is not None and prev.stat().st_size == path.stat().st_size:
            t = time.perf_counter()
            buf = xor_of(path, prev)
            parts = z.compress_bytes(buf, threads, dt)
            xs = time.perf_counter() - t
            xor = sum(map(len, parts))
            # Decoding a file from its XOR: ZipNN, then the XOR with the previous file's bytes.
            xd = decode_seconds(z, parts, threads) + xor_seconds(path)
            if key[0] == files[-1][0][0]:  # the last checkpoint's files
                check_xor(z, parts, path, prev, threads)
        out[key] = {"zipnn": (alone, s), "zipnn_xor": (xor, xs), "zipnn_decode": d, "zipnn_xor_decode": xd}
    return out


def decode_seconds(z: ZipNN, parts: list, threads: int) -> float:
    """ZipNN's decompression of one file's parts, in memory."""
    blob = memoryview(b"".join(parts))
    t = time.perf_counter()
    z.decompress_bytes(blob, threads)
    return time.perf_counter() - t


def xor_seconds(path: Path) -> float:
    """The XOR that turns a decoded difference back into the file (numpy, in place)."""
    a, b = np.frombuffer(read_all(path), np.uint8).copy(), np.frombuffer(read_all(path), np.uint8)
    t = time.perf_counter()
    np.bitwise_xor(a, b, out=a)
    return time.perf_counter() - t


def xor_of(path: Path, prev: Path, buf: bytearray | None = None) -> bytearray:
    """`buf` (default: the file read) XORed in place with the previous file."""
    buf = read_all(path) if buf is None else buf
    np.bitwise_xor(np.frombuffer(buf, np.uint8), np.frombuffer(read_all(prev), np.uint8),
                   out=np.frombuffer(buf, np.uint8))
    return buf


def check_xor(z: ZipNN, parts: list, path: Path, prev: Path, threads: int) -> None:
    back = bytearray(b"".join(z.decompress_bytes(memoryview(b"".join(parts)), threads)))
    if len(back) != path.stat().st_size or xor_of(path, prev, back) != read_all(path):
        raise SystemExit(f"ZipNN XOR round trip of {path} FAILED")
    log(f"  ZipNN XOR round trip of {path}: ok")


def peer_files(run: Path) -> list[tuple]:
    """(key, file, the previous checkpoint's same file or None) for every file of the run."""
    rows, prev_ckpt = [], None
    for c in checkpoints(run):
        for rel in files_of(c.path):
            path = c.path / rel
            prev = prev_ckpt / rel if prev_ckpt is not None else None
            rows.append(((c.name, rel), path, prev if prev is not None and prev.is_file() else None))
        prev_ckpt = c.path
    return rows


def measure_brevis(run: Path, ks: list[int], work: Path, threads: int, tag: str) -> dict:
    """compress_run at each K, each into its own folder: bytes, seconds, members."""
    out = {}
    for k in ks:
        t = time.perf_counter()
        r = brevis.compress_run(run, work / f"{tag}-k{k}", keyframe_every=k, threads=threads, order="name")
        s = time.perf_counter() - t
        members = {w["name"]: Path(w["archive"]) for w in r["written"]}
        chains = {n: brevis.inspect(p)["series"]["chain"] for n, p in members.items()}
        bad = [n for n, c in chains.items() if len(c) > k]
        if bad:
            raise SystemExit(f"{tag} K={k}: chains longer than K: {bad}")
        out[k] = {"bytes": r["archive_bytes"], "seconds": s, "members": members, "chains": chains}
        log(f"  {tag} K={k}: {r['archive_bytes']:,} bytes in {s:.1f} s")
    return out


def tensor_kind(path: str, name: str, dtype: str) -> str:
    """What a segment of a checkpoint holds: weights, each part of Adam's state, or the rest."""
    if dtype == "bytes":
        return "other (headers, small files)"
    if path.endswith(WEIGHTS):
        return "weights"
    for kind in ("exp_avg_sq", "exp_avg", "step"):
        if name == kind or name.endswith("." + kind):
            return f"optimizer {kind}"
    return "other tensors"


def kinds_table(runs: dict, k: int) -> list[str]:
    """Per kind of tensor, over the members of K coded against a predecessor:
    their stored bytes against the same checkpoints' standalone (K=1)
    archives, and the programs that hold most of the chained bytes."""
    rows: dict[str, list] = {}
    for name, member in runs[k]["members"].items():
        if len(runs[k]["chains"][name]) == 1:
            continue  # a keyframe: the same as standalone
        for which, path in (("chain", member), ("alone", runs[1]["members"][name])):
            for f in brevis.inspect(path)["files"]:
                for seg in f["segments"]:
                    row = rows.setdefault(tensor_kind(f["path"], seg["name"], seg["dtype"]),
                                          {"original": 0, "alone": 0, "chain": 0, "programs": {}})
                    row[which] += seg["stored_bytes"]
                    if which == "chain":
                        row["original"] += seg["original_bytes"]
                        for prog in seg["programs"]:
                            key = prog["program"] if len(prog["program"]) < 90 else prog["program"][:87] + "..."
                            row["programs"][key] = row["programs"].get(key, 0) + seg["stored_bytes"] / len(seg["programs"])
    out = [f"### full run: what the chain does to each kind of tensor (K={k}, its {sum(len(c) > 1 for c in runs[k]['chains'].values())} "
           "members coded against a predecessor)\n",
           "| kind | original bytes | standalone ratio | chained ratio | programs holding most chained bytes |",
           "|---|---:|---:|---:|---|"]
    for kind, r in sorted(rows.items(), key=lambda x: -x[1]["original"]):
        top = sorted(r["programs"].items(), key=lambda x: -x[1])[:2]
        shown = "; ".join(f"`{p}` ({100 * b / max(1, r['chain']):.0f} %)" for p, b in top)
        out.append(f"| {kind} | {r['original']:,} | {r['alone'] / r['original']:.4f} | "
                   f"{r['chain'] / r['original']:.4f} | {shown} |")
    return out + [""]


def same_tree(src: Path, got: Path) -> bool:
    """The decoded checkpoint equals its source byte for byte (symlinks followed)."""
    files = files_of(src)
    if files == [""]:
        got = next(got.iterdir()) if got.is_dir() else got
        return filecmp.cmp(src, got, shallow=False)
    return files == files_of(got) and all(filecmp.cmp(src / f, got / f, shallow=False) for f in files)


def remove(path: Path) -> None:
    """A decoded checkpoint: a folder, or one file."""
    if path.is_dir():
        shutil.rmtree(path)
    else:
        path.unlink()


def measure_decode(run: Path, runs: dict, ks: list[int], shm: Path, threads: int, repeats: int,
                   check_k: int) -> dict:
    """Best decode seconds per K (1 = standalone) per checkpoint; K=check_k's verified."""
    best = {k: {} for k in [1] + ks}
    target = shm / "out"
    # One untimed decode first: the decoder's imports and first allocations are not a member's cost.
    brevis.decompress(next(iter(runs[1]["members"].values())), target, threads=threads, force=True)
    remove(target)
    for c in checkpoints(run):
        for rep in range(repeats):
            for k in best:  # alternate: drift in the machine's load reaches every K alike
                t = time.perf_counter()
                brevis.decompress(runs[k]["members"][c.name], target, threads=threads, force=True)
                s = time.perf_counter() - t
                best[k][c.name] = min(s, best[k].get(c.name, s))
                if rep == 0 and k == check_k and not same_tree(c.path, target):
                    raise SystemExit(f"K={k}: {c.name} decoded differs from its source")
                remove(target)
    log(f"  every member of K={check_k} decoded equal to its checkpoint")
    return best


def series_table(name: str, raw: int, peers: dict, runs: dict, default_k: int, peer_decode: dict,
                 brevis_decode: dict) -> list[str]:
    best_peer = min(peers[p][0] for p in PEERS)
    rows = [(LABELS["raw"], raw, None, None)] + [(LABELS[p], *peers[p], peer_decode.get(p)) for p in PEERS]
    rows += [("Brevis, no chaining (K=1)" if k == 1 else
              f"Brevis chain, keyframe every {k}" + (" (default)" if k == default_k else ""),
              b["bytes"], b["seconds"], brevis_decode.get(k)) for k, b in runs.items()]
    out = [f"### {name}\n", "Decode last s: the last checkpoint, from what its decode needs (ZipNN: in memory; "
           "Brevis: file to /dev/shm); blank: not timed.\n",
           "| codec | bytes | ratio to raw | to best peer | compress s | decode last s |",
           "|---|---:|---:|---:|---:|---:|"]
    for label, size, secs, dec in rows:
        out.append(f"| {label} | {size:,} | {size / raw:.4f} | {size / best_peer:.3f} | "
                   f"{'' if secs is None else f'{secs:.1f}'} | {'' if dec is None else f'{dec:.2f}'} |")
    return out + [""]


def decode_table(name: str, raw: int, runs: dict, best: dict, last: str, default_k: int,
                 odd: list[str]) -> list[str]:
    """K against size and decode time; then every member's ratio and chain length."""
    names = list(best[1])
    ratios = {k: {n: best[k][n] / best[1][n] for n in names} for k in best}
    out = [f"### {name}: decode\n", "Best of the repeats, seconds; ratio = a member's decode time / the "
           "standalone (K=1) archive's of the same checkpoint; per archive read = the ratio / the number of "
           "archives its decode reads (its chain, the member included).\n",
           "| K | archive bytes | ratio to raw | worst decode ratio (checkpoint) | worst per archive read "
           "| last checkpoint s | its ratio | last's chain |", "|---:|---:|---:|---|---:|---:|---:|---:|"]
    for k in best:
        r, chains = ratios[k], runs[k]["chains"]
        worst = max(r, key=r.get)
        slow = [n for n in names if r[n] > 1.5]
        if slow:
            odd.append(f"{name}, K={k}: {len(slow)} of {len(names)} ({', '.join(slow)})")
        out.append(f"| {k}{' (default)' if k == default_k else ''} | {runs[k]['bytes']:,} | "
                   f"{runs[k]['bytes'] / raw:.4f} | {r[worst]:.2f} ({worst}) | "
                   f"{max(r[n] / len(chains[n]) for n in names):.2f} | {best[k][last]:.2f} | "
                   f"{r[last]:.2f} | {len(chains[last])} |")
    # Every member: whether its decode time follows the archives it reads.
    out += ["", "Every member: decode ratio (chain length); K=1: standalone seconds.\n",
            "| K | " + " | ".join(names) + " |", "|---:|" + "---:|" * len(names)]
    out.append("| 1 | " + " | ".join(f"{best[1][n]:.2f} s" for n in names) + " |")
    out += [f"| {k} | " + " | ".join(f"{ratios[k][n]:.2f} ({len(runs[k]['chains'][n])})" for n in names) + " |"
            for k in best if k != 1]
    return out + [""]


def provenance(run: Path) -> str:
    try:
        s = json.loads((run / "SOURCE.json").read_text())
    except (OSError, ValueError) as e:
        return f"no SOURCE.json ({e})"
    h, m = s.get("hyperparameters", {}), s.get("model", {})
    return (f"{s.get('what', '?')}, made by `{s.get('made_by', '?')}`: {m.get('arch', '?')} "
            f"(wheel {m.get('wheel', {}).get('name', '?')} {m.get('wheel', {}).get('version', '?')}), "
            f"{h.get('steps', '?')} steps of AdamW (lr {h.get('lr', '?')}, {h.get('schedule', '?')}), "
            f"saved every {h.get('save_every', '?')}; torch {s.get('torch', '?')}.")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--run", type=Path, default=DEFAULT_RUN)
    ap.add_argument("--keyframes", default="1,2,3,4,6,8", help="the Ks of keyframe_every to measure")
    ap.add_argument("--threads", type=int, default=threads_available())
    ap.add_argument("--repeats", type=int, default=3, help="decode runs per archive; the best is kept")
    ap.add_argument("--work", type=Path, default=None, help="where the work folder is made (default: temp)")
    ap.add_argument("--keep", action="store_true", help="keep the work folder")
    ap.add_argument("--output", type=Path, default=None)
    args = ap.parse_args(argv)
    run = args.run.expanduser()
    if not run.is_dir():
        raise SystemExit(f"{run}: no such run (python benchmarks/make_training_run.py --out {run})")
    chained = sorted(({int(k) for k in args.keyframes.split(",") if k} | {DEFAULT_KEYFRAME_EVERY}) - {1})
    ks = [1] + chained  # K=1 is the standalone reference, always made
    rev = revision() or "unknown"
    output = args.output or ROOT / "benchmarks" / "results" / f"series-{rev.split('+')[0]}.md"
    started, loads = time.perf_counter(), [os.getloadavg()[0]]
    if args.work:
        args.work.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="brevis-series-", dir=args.work))
    shm = Path(tempfile.mkdtemp(prefix="brevis-series-", dir="/dev/shm"))
    try:
        cks = checkpoints(run)
        files = peer_files(run)
        log(f"{run}: {len(cks)} checkpoints, {len(files)} files; work {work} ({fs_type(work)})")
        log("zstd -3 and --patch-from:")
        zstd = measure_zstd(files, work, args.threads)
        log("ZipNN alone and XOR:")
        zipnn = measure_zipnn(files, zstd, args.threads)
        per_file = {key: {**zstd[key], **zipnn[key]} for key, _, _ in files}
        series = {"full run": (run, lambda rel: True),
                  "weights only": (weights_run(run, work), lambda rel: rel == WEIGHTS)}
        odd, text = [], []
        for name, (folder, wanted) in series.items():
            log(f"Brevis, {name}:")
            loads.append(os.getloadavg()[0])
            keys = [key for key, path, _ in files if wanted(key[1])]
            raw = sum(p.stat().st_size for key, p, _ in files if wanted(key[1]))
            peers = {p: [sum(per_file[k][p][i] for k in keys) for i in (0, 1)] for p in PEERS}
            runs = measure_brevis(folder, ks, work, args.threads, name.split()[0])
            log(f"decoding, {name}:")
            best = measure_decode(folder, runs, chained, shm, args.threads, args.repeats, DEFAULT_KEYFRAME_EVERY)
            # Decoding the last checkpoint: ZipNN alone decodes its files; ZipNN XOR, with no
            # keyframe, every checkpoint's XOR back to the first (non-float files: not timed).
            last = [key for key in keys if key[0] == cks[-1].name]
            peer_decode = {"zipnn": sum(per_file[k]["zipnn_decode"] for k in last if "zipnn_decode" in per_file[k]),
                           "zipnn_xor": sum(per_file[k]["zipnn_xor_decode"] for k in keys
                                            if "zipnn_xor_decode" in per_file[k])}
            brevis_decode = {k: best[k][cks[-1].name] for k in best}
            text += series_table(name, raw, peers, runs, DEFAULT_KEYFRAME_EVERY, peer_decode, brevis_decode)
            text += decode_table(name, raw, runs, best, cks[-1].name, DEFAULT_KEYFRAME_EVERY, odd)
            if name == "full run":
                text += kinds_table(runs, max(ks))
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(shm, ignore_errors=True)
    loads.append(os.getloadavg()[0])
    wall = time.perf_counter() - started
    head = [
        "# Brevis on a training run: series against per-file and delta peers\n",
        f"{datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds')} · brevis {rev} · "
        f"`uname -m` {platform.machine()} · nproc {threads_available()} · threads {args.threads} · Python "
        f"{platform.python_version()} · 1-min load average {min(loads):.2f}-{max(loads):.2f} · "
        f"`python benchmarks/series.py` · {wall / 60:.1f} min\n",
        f"Run: {run}, {len(cks)} checkpoints ({', '.join(c.name for c in cks)}). {provenance(run)}\n",
        "Peers: **zstd -3** is the CLI on each file alone (`-T N`); **--patch-from** is `zstd -3 "
        "--patch-from=PREV FILE`, each file against the same file of the previous checkpoint (the first "
        "checkpoint alone), the general-purpose delta users have; **ZipNN** is ZipNN 0.5.4's byte mode with "
        "float32 on each float file (benchmarks/codecs.py's wrapper); **ZipNN XOR** is ZipNN on the XOR of "
        "each file with the previous checkpoint's (the delta its documentation suggests). Both deltas chain "
        "with no keyframe: decoding a checkpoint needs every one before it (K = the run's length, "
        f"{len(cks)} here). trainer_state.json "
        "and scheduler.pt (not float) count at their zstd -3 size in both ZipNN rows. Brevis: "
        "`compress_run(run, keyframe_every=K)`, one member archive per checkpoint, each coded against the "
        "one before, a keyframe every K (K=1: every checkpoint alone). Compress seconds: wall clock, zstd's "
        "including its process start, ZipNN's the files' reads (and the XOR); peers measured once per "
        "file, the weights series summing the model.safetensors files'. Ratio to best peer = bytes / the "
        "smallest of the four peers' bytes. "
        f"Decoding: `brevis.decompress(member, /dev/shm/..., threads={args.threads})` in-process, best of "
        f"{args.repeats}, every member of each K and the K=1 archive of the same checkpoint alternating.\n",
        "Checked: the last checkpoint's --patch-from and ZipNN XOR files decoded and compared byte for byte; "
        f"every member of K={DEFAULT_KEYFRAME_EVERY} (the default) decoded and compared with its checkpoint; "
        "no member's chain longer than K.\n",
    ]
    tail = ["Members decoding slower than 1.5x their standalone archive: "
            + ("; ".join(odd) + "." if odd else "none.")]
    report = "\n".join(head + text + tail) + "\n"
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(report)
    print(report)
    log(f"wrote {output} ({wall:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
