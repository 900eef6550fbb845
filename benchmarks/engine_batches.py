"""Whether more narrow streams in one decode call would pay (issue 18).

    python benchmarks/engine_batches.py [CORPUS] --items a,b [--merge 1,2,4,8] [--repeat 7]

The engine of narrow blocks (brevis/native/_rans.c, multi_run)
interleaves up to eight blocks in a call; a call given fewer runs the
kernel of four slots, and the last two blocks of a call finish alone.
A partition's classes are decoded in a call of their own, one chunk's at
a time (their counts come from the decoded context), so partitioned
weights hand the engine three or four blocks a call. Before the
interpreter is changed to gather more of them, this measures what that
would gain: each item's archive is made (brevis.compress, into a
temporary folder) and unpacked once on one thread with every
_rans.decode_streams call recorded, then the calls whose streams are all
narrow are replayed on this thread as they came and merged --merge calls
at a time, best of --repeat taking turns, in ns a value (streams and counts as
recorded, fresh outputs; the checks and digests the calls made are left
out: decoding only). Prints Markdown; nothing is written.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import brevis  # noqa: E402
from benchmarks.run import load_items  # noqa: E402
from brevis.dsl.entropy import narrow  # noqa: E402
from brevis.native import _rans  # noqa: E402

DEFAULT_CORPUS = Path.home() / ".cache" / "brevis-corpus"


def recorded_calls(archive: bytes) -> list[list[tuple]]:
    """Each decode_streams call of a one-thread unpack of `archive`, as
    (stream bytes, n, width, bits, a fresh output like the call's) a stream."""
    calls: list[list[tuple]] = []
    original = _rans.decode_streams

    def record(items, *rest):
        calls.append([(bytes(it[0]), it[1], it[2], it[3], np.empty_like(np.asarray(it[4]))) for it in items])
        return original(items, *rest)

    _rans.decode_streams = record
    try:
        brevis.unpack(archive, threads=1)
    finally:
        _rans.decode_streams = original
    return calls


def replay(calls: list[list[tuple]], merges: list[int], repeat: int) -> dict[int, float]:
    """Seconds to decode the calls' streams, `k` calls to a call for each k
    of `merges`: the best of `repeat`, the merges taking turns (this host's
    speed drifts)."""
    groups = {k: [[s for call in calls[i:i + k] for s in call] for i in range(0, len(calls), k)] for k in merges}
    best = dict.fromkeys(merges, float("inf"))
    for _ in range(repeat):
        for k in merges:
            start = time.perf_counter()
            for group in groups[k]:
                if _rans.decode_streams(group) is not None:
                    raise RuntimeError("a recorded stream did not decode again")
            best[k] = min(best[k], time.perf_counter() - start)
    return best


def measure(corpus: Path, name: str, merges: list[int], repeat: int) -> dict:
    [item] = load_items(corpus, [name])  # the item's files as the harness takes them
    with tempfile.TemporaryDirectory() as tmp:
        archive = Path(tmp) / "item.brv"
        brevis.compress([str(p) for p in item["files"]], archive, force=True)
        calls = recorded_calls(archive.read_bytes())
    engine = [c for c in calls if all(narrow(s[0]) for s in c)]
    values = sum(s[1] for c in engine for s in c)
    row = {"calls": len(calls), "narrow_calls": len(engine), "streams": sum(len(c) for c in engine),
           "values": values, "ns": {}}
    if values:
        row["ns"] = {k: seconds / values * 1e9 for k, seconds in replay(engine, merges, repeat).items()}
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("corpus", nargs="?", type=Path, default=DEFAULT_CORPUS)
    ap.add_argument("--items", required=True, help="comma-separated item folders of the corpus")
    ap.add_argument("--merge", default="1,2,4,8", help="calls merged into one, comma-separated (1: as recorded)")
    ap.add_argument("--repeat", type=int, default=7)
    args = ap.parse_args(argv)
    merges = [int(k) for k in args.merge.split(",")]
    if not merges or min(merges) < 1 or args.repeat < 1:
        ap.error("--merge takes counts of 1 or more, --repeat 1 or more")
    print(f"# Narrow streams a decode call, one thread, best of {args.repeat}\n")
    print("| item | calls | of narrow streams only | streams in them | values | "
          + " | ".join(f"ns a value, {k} merged" for k in merges) + " |")
    print("|---|---:|---:|---:|---:|" + "---:|" * len(merges))
    for name in args.items.split(","):
        item = args.corpus / name
        if not item.is_dir():
            print(f"{item}: no such item", file=sys.stderr)
            return 2
        r = measure(args.corpus, name, merges, args.repeat)
        cells = [f"{r['ns'][k]:.2f}" if k in r["ns"] else "–" for k in merges]
        print(f"| {name} | {r['calls']} | {r['narrow_calls']} | {r['streams']} | {r['values']} | "
              + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
