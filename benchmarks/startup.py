"""Startup (issue 14): how long the `brevis` command takes from a fresh
interpreter to its exit, for work whose cost is mostly fixed.

    python benchmarks/startup.py [--repeat 5]

Times, wall clock of the whole process (interpreter start and imports
included, as a user waits for them), best and median of --repeat runs:
`brevis --help`; compressing the checkpoint that ships with the project
(examples/taesd, 2.7 MB, F16 PyTorch) to an archive on tmpfs; decompressing
that archive; and compressing the same checkpoint's bytes less its first
4 KiB, a file no parser knows (discovery, LZMA's trial and the search run
on its bytes). benchmarks/run.py adds the table to its report.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "taesd" / "taef2_decoder.pth"
HEAD_BYTES = 4096  # cut off: the zip's first header, by which the PyTorch parser knows the file


def _time(args: list[str]) -> float:
    t = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "brevis", *args], capture_output=True, text=True, cwd=ROOT,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    seconds = time.perf_counter() - t
    if p.returncode != 0:
        raise RuntimeError(f"brevis {' '.join(args)}: exit {p.returncode}: {p.stderr.strip()[-500:]}")
    return seconds


def measure(repeat: int = 5, tmpfs: Path = Path("/dev/shm")) -> list[dict]:
    """[{what, best_s, median_s, runs}] for each command."""
    folder = Path(tempfile.mkdtemp(prefix="brevis-startup-", dir=tmpfs if tmpfs.is_dir() else None))
    try:
        data = EXAMPLE.read_bytes()
        raw = folder / "weights.bin"
        raw.write_bytes(data[HEAD_BYTES:])
        archive, out = folder / "example.brv", folder / "example.pth"
        commands = [
            ("brevis --help", ["--help"]),
            (f"compress {EXAMPLE.name} ({EXAMPLE.stat().st_size / 1e6:.1f} MB, parsed)",
             ["compress", str(EXAMPLE), "-o", str(archive), "-f", "-q"]),
            ("decompress its archive", ["decompress", str(archive), "-o", str(out), "-f", "-q"]),
            (f"compress its bytes less the first 4 KiB ({(len(data) - HEAD_BYTES) / 1e6:.1f} MB, no parser)",
             ["compress", str(raw), "-o", str(folder / "raw.brv"), "-f", "-q"]),
        ]
        rows = []
        for what, args in commands:
            runs = [_time(args) for _ in range(repeat)]
            rows.append({"what": what, "best_s": min(runs), "median_s": statistics.median(runs), "runs": repeat})
        return rows
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def markdown(rows: list[dict]) -> str:
    out = ["| command (fresh process, wall clock) | best s | median s | runs |", "|---|---:|---:|---:|"]
    out += [f"| {r['what']} | {r['best_s']:.2f} | {r['median_s']:.2f} | {r['runs']} |" for r in rows]
    return "\n".join(out) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    print(markdown(measure(max(1, args.repeat))))


if __name__ == "__main__":
    main()
