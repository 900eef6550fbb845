"""Peak memory on a large file (issue 14: under 1.5 GiB compressing a 1.1 GB file).

    python benchmarks/peak_memory.py [--gb 1.14] [--threads 2] [--tmp /dev/shm]

Writes a BF16 safetensors file of about --gb GB (17 tensors of normal
weights, sd 0.02, from a fixed seed: what a trained layer's weights look
like to the coder) into a temporary folder under --tmp, then runs `brevis
compress -j N` and `brevis decompress -j N` on it, each in a fresh
process (benchmarks/scaling.py's launcher: peak RSS of the main process
and of its largest worker, CPU seconds), checks that the file comes back
byte for byte, and prints a Markdown table. Everything is removed at the
end. Needs about 3x the file's size free under --tmp.
"""

from __future__ import annotations

import argparse
import filecmp
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.scaling import launch  # noqa: E402

TENSORS = 17


def write_bf16_safetensors(path: Path, total_bytes: int, seed: int = 0) -> None:
    """TENSORS BF16 tensors of N(0, 0.02) (float32's top 16 bits), about
    total_bytes in all, as a safetensors file (written by hand: numpy has
    no bfloat16)."""
    per = total_bytes // TENSORS // 2
    rng = np.random.default_rng(seed)
    header, offset = {}, 0
    for i in range(TENSORS):
        header[f"layer{i}.weight"] = {"dtype": "BF16", "shape": [per], "data_offsets": [offset, offset + 2 * per]}
        offset += 2 * per
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(len(text).to_bytes(8, "little"))
        f.write(text)
        for _ in range(TENSORS):
            x = (rng.standard_normal(per, dtype=np.float32) * np.float32(0.02)).view(np.uint32) >> np.uint32(16)
            f.write(x.astype("<u2").tobytes())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gb", type=float, default=1.14, help="size of the file in GB (10^9 bytes)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tmp", default="/dev/shm" if Path("/dev/shm").is_dir() else None,
                    help="where the file, its archive and the decompressed copy go")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="brevis-peak-", dir=args.tmp))
    try:
        source = work / "model.safetensors"
        write_bf16_safetensors(source, int(args.gb * 1e9))
        archive, out = work / "model.brv", work / "out"
        j = str(args.threads)
        c = launch(["compress", str(source), "-o", str(archive), "-j", j], "default")
        d = launch(["decompress", str(archive), "-o", str(out), "-j", j], "default")
        same = filecmp.cmp(source, out / source.name, shallow=False)
        size = source.stat().st_size
        print(f"{time.strftime('%Y-%m-%d %H:%M')}, {size / 1e9:.2f} GB BF16 safetensors ({TENSORS} tensors of "
              f"N(0, 0.02)), -j {j}, under {args.tmp}\n")
        print("| command | seconds | MB/s | main peak RSS MiB | largest worker MiB | CPU s main / workers |")
        print("|---|---:|---:|---:|---:|---:|")
        for name, s in (("compress", c), ("decompress", d)):
            print(f"| {name} | {s['seconds']:.2f} | {size / s['seconds'] / 1e6:.0f} | {s['rss_kib'] / 1024:.1f} | "
                  f"{s['child_rss_kib'] / 1024:.1f} | {s['cpu_s']:.2f} / {s['child_cpu_s']:.2f} |")
        print(f"\nratio {c['ratio']:.4f}; decompressed byte for byte: {'yes' if same else 'NO'}")
        if not same:
            raise SystemExit(1)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
