#!/usr/bin/env python3
"""Compare the archives this tree writes with those another commit writes.

    .venv/bin/python scripts/compare_archives.py REV [--corpus DIR] [-j 1,2] [--items a,b]

Every item of the corpus (default ~/.cache/brevis-corpus, built by
../shared/corpus/fetch-corpus.sh) is compressed by this tree and by a git
worktree of REV (same Python, the other tree first on sys.path), once per
thread count, and the archives' SHA-256 digests are compared. The other
commit's archives are kept in a cache folder keyed by its commit id, so a
refactor can be checked again and again against one baseline. Exit 1 if
any archive differs.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "brevis-compare"


def commit_of(rev: str) -> str:
    return subprocess.run(["git", "rev-parse", rev], cwd=HERE, check=True, capture_output=True,
                          text=True).stdout.strip()


def worktree(commit: str) -> Path:
    tree = CACHE / "trees" / commit
    if not (tree / "brevis").is_dir():
        tree.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(["git", "worktree", "add", "--detach", "-f", str(tree), commit], cwd=HERE, check=True,
                       capture_output=True)
    # Its own compiled kernels, built from its sources: without them its
    # code takes the pure-Python fallbacks, whose estimates can choose
    # other programs, and every archive would differ.
    if (tree / "setup.py").is_file() and not list((tree / "brevis" / "native").glob("*.so")):
        subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--inplace"], cwd=tree, check=True,
                       capture_output=True)
    return tree


def compress(tree: Path, item: Path, out: Path, threads: int) -> str:
    """The SHA-256 of the archive `tree`'s code writes of `item`."""
    env = dict(os.environ, PYTHONPATH=str(tree))
    code = "import sys; from brevis.cli import main; main(sys.argv[1:])"
    subprocess.run([sys.executable, "-c", code, "compress", str(item), "-o", str(out), "-j", str(threads),
                    "-q", "-f"], env=env, check=True, cwd=tempfile.gettempdir())
    h = hashlib.sha256(out.read_bytes()).hexdigest()
    return h


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("rev")
    ap.add_argument("--corpus", default=str(Path.home() / ".cache" / "brevis-corpus"))
    ap.add_argument("-j", default="1,2", help="thread counts, comma-separated")
    ap.add_argument("--items", default="", help="comma-separated item names (default: all)")
    args = ap.parse_args()
    commit = commit_of(args.rev)
    other = worktree(commit)
    corpus = Path(args.corpus)
    items = [corpus / n for n in args.items.split(",")] if args.items else sorted(
        p for p in corpus.iterdir() if p.is_dir() and not p.name.startswith("."))
    if not items:
        print(f"no corpus items in {corpus}", file=sys.stderr)
        return 2
    differ = 0
    with tempfile.TemporaryDirectory(prefix="brevis-compare-") as tmp:
        for item in items:
            for threads in (int(t) for t in args.j.split(",")):
                cached = CACHE / "archives" / commit / f"{item.name}.j{threads}.sha256"
                if cached.exists():
                    theirs = cached.read_text().strip()
                else:
                    theirs = compress(other, item, Path(tmp) / "theirs.brv", threads)
                    cached.parent.mkdir(parents=True, exist_ok=True)
                    cached.write_text(theirs + "\n")
                ours = compress(HERE, item, Path(tmp) / "ours.brv", threads)
                same = ours == theirs
                differ += not same
                print(f"{item.name:28} -j{threads}  {'same' if same else 'DIFFERENT'}  {ours[:16]}", flush=True)
    print(f"{differ} of {len(items) * len(args.j.split(','))} archives differ from {commit[:12]}")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
