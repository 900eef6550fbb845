"""Check that this tree cuts files into the same segments as another commit does.

    python tests/formats/compare_layouts.py [REF] [--mutations N] [--seed S]

REF (default main) is exported with `git archive` into a temporary folder.
For every file of the corpus (BREVIS_CORPUS, default ~/.cache/brevis-corpus)
and N copies of each parsed one with bytes changed or cut where there are no
tensors (headers, graphs, pickles, directories: where the parsers look),
layout() runs under each tree in its own process; the results must be equal:
same format, same segments (offsets, lengths, names, dtypes, shapes, records).
Exits 1 and prints the first differences otherwise. Not a test: it needs git
and the corpus, and takes minutes.
"""

from __future__ import annotations

import argparse
import io
import os
import pickle
import random
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def corpus_files(root: Path) -> list[Path]:
    return sorted(p for p in root.glob("*/*") if p.is_file() and not p.name.startswith(".")
                  and not p.parent.name.startswith("."))


def mutated(data: bytes, spans: list[tuple[int, int]], rng: random.Random) -> bytes:
    """A copy with one to three bytes changed, or cut short, within the given spans."""
    b = bytearray(data)
    cut = rng.random() < 0.2
    for _ in range(1 if cut else rng.choice((1, 1, 2, 3))):
        off, length = rng.choices(spans, [n for _, n in spans])[0]
        j = off + rng.randrange(length)
        if cut:
            return bytes(b[:j])
        b[j] = rng.randrange(256) if rng.random() < 0.5 else b[j] ^ (1 << rng.randrange(8))
    return bytes(b)


def layouts(root: Path, mutations: int, seed: int) -> dict[str, object]:
    """Run in the tree under test (PYTHONPATH): every layout, by file name and copy number."""
    from brevis.formats import layout

    rng = random.Random(seed)
    out: dict[str, object] = {}
    for p in corpus_files(root):
        data = p.read_bytes()
        out[str(p)] = fmt, segs = layout(io.BytesIO(data), len(data), p.name)
        spans = [(s.offset, s.length) for s in segs if s.dtype is None and s.records is None and s.length]
        if fmt in ("bytes", "safetensors") or not spans:
            continue
        for k in range(mutations):
            copy = mutated(data, spans, rng)
            try:
                out[f"{p}#{k}"] = layout(io.BytesIO(copy), len(copy), p.name)
            except Exception as e:  # a crash is a difference too
                out[f"{p}#{k}"] = f"{type(e).__name__}: {e}"
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("ref", nargs="?", default="main")
    ap.add_argument("--mutations", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--emit", help=argparse.SUPPRESS)  # internal: write this tree's layouts here
    args = ap.parse_args()
    root = Path(os.environ.get("BREVIS_CORPUS", "~/.cache/brevis-corpus")).expanduser()
    if args.emit:
        with open(args.emit, "wb") as f:
            pickle.dump(layouts(root, args.mutations, args.seed), f)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp) / "base"
        base.mkdir()
        archive = subprocess.run(["git", "-C", str(REPO), "archive", args.ref, "brevis"],
                                 check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(base)], input=archive, check=True)
        results = []
        for tree in (base, REPO):
            dump = Path(tmp) / f"{len(results)}.pkl"
            env = {**os.environ, "PYTHONPATH": str(tree)}
            subprocess.run([sys.executable, __file__, "--emit", str(dump), "--mutations", str(args.mutations),
                            "--seed", str(args.seed)], env=env, check=True)
            results.append(pickle.loads(dump.read_bytes()))
    old, new = results
    differ = [k for k in old if old[k] != new.get(k)]
    print(f"{len(old)} layouts ({len(corpus_files(root))} corpus files), {len(differ)} differ from {args.ref}")
    for k in differ[:10]:
        a, b = old[k], new.get(k)
        if isinstance(a, tuple) and isinstance(b, tuple) and a[0] == b[0]:  # show the first segment apart
            i = next((i for i, (x, y) in enumerate(zip(a[1], b[1])) if x != y), min(len(a[1]), len(b[1])))
            a, b = a[1][i:i + 1] or "(no more segments)", b[1][i:i + 1] or "(no more segments)"
        print(f"  {k}:\n    {args.ref}: {str(a)[:300]}\n    here: {str(b)[:300]}")
    return 1 if differ or old.keys() != new.keys() else 0


if __name__ == "__main__":
    sys.exit(main())
