"""Two revisions of Brevis raced on the same archives, in fresh processes
taking turns (A, B, A, B, ...): what a one-shot decompression (or
compression) costs each, on a host whose speed moves by a fifth within
minutes, where runs made apart cannot be compared (issues 14 and 18).

    python benchmarks/ab.py REV_A REV_B [CORPUS] --items a,b [--runs 10] [--threads 2] [--mode unpack] [--own-archives]
                                                             [--mode decompress | compress]

A revision is a git revision of this repository, checked out into a
temporary worktree with its extensions built there (`setup.py build_ext
--inplace`, a minute or so), or `.`: this checkout as it is. Each item's
archive is made once, by REV_A (B must read A's archives), or, with
--own-archives, by each side for itself (a change of format, which an older
revision cannot read or a newer one would not write). A run is a fresh
Python in the revision's tree, importing what the harness's worker imports
before its clock (benchmarks/worker.py), then timing one call: `unpack`,
brevis.unpack on the archive read into memory beforehand, as the harness's
in-memory decompression; `decompress`, brevis.decompress into a new folder
on tmpfs (--out-dir), as its file-to-file pass (without its fsync, which
costs nothing on tmpfs); `compress`, brevis.compress of the item into an
archive on tmpfs, as its compression (no archive made first), each side's
archives compared too. Prints, per item, the mean, median and best of each
side in ms and B's mean over A's (compress: whether every archive of
both sides has the same bytes, else each side's size and B's over A's);
the worktrees are removed at the end.
Compare two worktrees where the effect is a few per cent: a fresh
worktree compressed the same code about 8 % slower than this checkout
(2026-12-05), where unpack ran alike.
"""

from __future__ import annotations

import argparse
import hashlib
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.unpack_profile import one_shot, one_shot_options, window  # noqa: E402

COMPRESS = "import sys; sys.path.insert(0, sys.argv[1]); import brevis; brevis.compress([sys.argv[2]], sys.argv[3], force=True)"


class Failed(Exception):
    """A revision that cannot be checked out or built, or a run that failed: the message says which."""


def checkout(rev: str, tmp: Path) -> Path:
    """The tree of revision `rev`: this checkout for `.`, else a worktree
    under tmp with its extensions built."""
    if rev == ".":
        return ROOT
    p = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}"],
                       capture_output=True, text=True)
    if p.returncode:
        raise Failed(f"{rev!r} is not a revision of {ROOT}")
    tree = tmp / f"rev-{p.stdout.strip()[:12]}"
    p = subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tree), rev],
                       capture_output=True, text=True)
    if p.returncode:
        raise Failed(f"cannot check out {rev}: {p.stderr.strip()}")
    p = subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--inplace"], cwd=tree,
                       capture_output=True, text=True)
    if p.returncode:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)], capture_output=True)
        raise Failed(f"{rev}'s extensions do not build: {p.stderr.strip()[-500:]}")
    # Bytecode, as this checkout has it (scripts/setup) and an installed
    # package does: where each process compiled the tree from source, the
    # compiler's garbage left the heap faulted in before the clock, and a
    # worktree's unpack ran 2-9 % faster than the same code here (fracast,
    # silero, 25-30 runs each, either side first).
    subprocess.run([sys.executable, "-m", "compileall", "-q", "brevis", "benchmarks"], cwd=tree, capture_output=True)
    return tree


def run_once(tree: Path, mode: str, archive: Path, threads: int, out: Path) -> tuple[float, tuple | None]:
    """Seconds of one call in a fresh process of `tree`'s revision
    (unpack_profile's one-shot run, the same as it profiles), and for a
    compression the SHA-256 and size of the archive it wrote (`archive`: the item)."""
    shutil.rmtree(out, ignore_errors=True)
    p = subprocess.run(one_shot(archive, threads, mode, out), capture_output=True, text=True, cwd=tree)
    digest = None
    if mode == "compress" and (out / "item.brv").exists():
        data = (out / "item.brv").read_bytes()
        digest = (hashlib.sha256(data).hexdigest(), len(data))
    shutil.rmtree(out, ignore_errors=True)
    found = window(p.stderr)
    if p.returncode or found is None:
        raise Failed(f"{tree.name}: {mode} of {archive.name} failed: {p.stderr.strip()[-500:]}")
    return found[1] - found[0], digest


def race(trees: tuple[Path, Path], mode: str, archives: tuple[Path, Path], runs: int, threads: int,
         out: Path) -> tuple[list[float], list[float], tuple[set, set]]:
    """Each side's seconds over `runs` turns, A then B in each (side k
    reading archives[k]), and each side's archives it wrote, as (SHA-256,
    size) (compress; else none)."""
    times: tuple[list[float], list[float]] = ([], [])
    digests: tuple[set, set] = (set(), set())
    for _ in range(runs):
        for side, tree in enumerate(trees):
            seconds, digest = run_once(tree, mode, archives[side], threads, out)
            times[side].append(seconds)
            if digest is not None:
                digests[side].add(digest)
    return times[0], times[1], digests


def row(item: str, a: list[float], b: list[float], digests: tuple[set, set] | None = None) -> str:
    def cells(t):
        return f"{statistics.mean(t) * 1e3:.2f} / {statistics.median(t) * 1e3:.2f} / {min(t) * 1e3:.2f}"

    return f"| {item} | {cells(a)} | {cells(b)} | {statistics.mean(b) / statistics.mean(a):.3f} |" + \
        ("" if digests is None else f" {archives_cell(*digests)} |")


def archives_cell(a: set, b: set) -> str:
    """`same bytes`, or each side's archive size in bytes (a range where a
    side's runs wrote more than one) and B's over A's (their largest)."""
    if len(a | b) == 1:
        return "same bytes"

    def size(s):
        lo, hi = min(n for _, n in s), max(n for _, n in s)
        return f"{lo:,}" if lo == hi else f"{lo:,}-{hi:,} ({len(s)} different)"

    most_a, most_b = max(n for _, n in a), max(n for _, n in b)
    return f"{size(a)} / {size(b)} ({(most_b / most_a - 1) * 100:+.4f} %)"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("rev_a")
    ap.add_argument("rev_b")
    ap.add_argument("--own-archives", action="store_true",
                    help="unpack/decompress: each side reads the archive its own revision wrote (a change of "
                         "format), not A's")
    one_shot_options(ap)
    args = ap.parse_args(argv)
    if args.runs < 1:
        ap.error("--runs must be at least 1")
    items = args.items.split(",")
    missing = [i for i in items if not (args.corpus / i).exists()]
    if missing:
        print(f"ab: not in {args.corpus}: {', '.join(missing)}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="brevis-ab-") as tmp:
        tmp = Path(tmp)
        trees: list[Path] = []
        try:
            for rev in (args.rev_a, args.rev_b):
                trees.append(trees[0] if trees and rev == args.rev_a else checkout(rev, tmp))
            print(f"# {args.mode}, {args.rev_a} (A) against {args.rev_b} (B): {args.runs} fresh processes each, "
                  f"taking turns, {args.threads} threads\n")
            compressing = args.mode == "compress"
            print("| item | A ms: mean / median / best | B ms: mean / median / best | B / A (means) |"
                  + (" archives: A / B bytes |" if compressing else ""))
            print("|---|---|---|---|" + ("---|" if compressing else ""))
            for item in items:
                # What each side's runs read: the item, A's archive of it, or (--own-archives) each its own.
                if compressing:
                    archives = (args.corpus / item,) * 2
                elif args.own_archives:
                    archives = (tmp / f"{item}-a.brv", tmp / f"{item}-b.brv")
                else:
                    archives = (tmp / f"{item}.brv",) * 2
                for rev, tree, archive in zip((args.rev_a, args.rev_b), trees, archives):
                    if compressing or archive.exists():
                        continue
                    p = subprocess.run([sys.executable, "-c", COMPRESS, str(tree), str(args.corpus / item),
                                        str(archive)], capture_output=True, text=True, cwd=tree)
                    if p.returncode:
                        raise Failed(f"{rev} cannot compress {item}: {p.stderr.strip()[-500:]}")
                out = Path(tempfile.mkdtemp(prefix="brevis-ab-out-", dir=args.out_dir))
                try:
                    a, b, digests = race((trees[0], trees[1]), args.mode, archives, args.runs, args.threads, out)
                finally:
                    shutil.rmtree(out, ignore_errors=True)
                print(row(item, a, b, digests if compressing else None), flush=True)
                if not compressing:
                    for archive in set(archives):
                        archive.unlink()
        except Failed as e:
            print(f"ab: {e}", file=sys.stderr)
            return 2
        finally:
            for tree in {t for t in trees if t != ROOT}:
                subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)],
                               capture_output=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
