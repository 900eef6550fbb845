"""What the learned production prior buys: search cost and archive size.

    python benchmarks/prior_effect.py [CORPUS] [--items a,b] [--threads N] [--out DIR]

Compresses every item twice at the default effort: with the prior learned
on the item (the default) and with a uniform prior (no learning), and
reports archive bytes, nodes expanded by the A* searches (summed over the
segments searched; the learning phase's own expansions are counted for the
learned prior), how many segments were searched and how many took a
program learned on the sample instead (a uniform prior has none), and
wall time. Writes prior_effect.md and .json to DIR.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if __name__ == "__main__":
    sys.path[0] = str(ROOT)

import brevis  # noqa: E402
from brevis.synth import planner as planner_module  # noqa: E402
from brevis.synth.prior import Prior  # noqa: E402

DEFAULT_CORPUS = Path.home() / ".cache" / "brevis-corpus"


def expansions(archive: Path) -> tuple[int, int, int]:
    """Nodes expanded by the searches recorded in an archive, how many
    searches, and how many segments took a learned program instead."""
    total = searches = learned = 0
    for f in brevis.inspect(archive)["files"]:
        for s in f["segments"]:
            st = s.get("search") or {}
            if st.get("search") == "a*":
                total += st["expanded"]
                searches += 1
            learned += st.get("search") == "learned"
    return total, searches, learned


def learning_expansions(item: Path, threads: int) -> int:
    """Expansions the learning phase spends (it searches with a uniform prior)."""
    spent = [0]
    original = planner_module.Planner.learn_one

    def counting(self, seg):
        result, relative = original(self, seg)
        spent[0] += result.expanded
        return result, relative

    planner_module.Planner.learn_one = counting
    try:
        brevis.learn_prior([item], threads=threads)
    finally:
        planner_module.Planner.learn_one = original
    return spent[0]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("corpus", nargs="?", type=Path, default=DEFAULT_CORPUS)
    ap.add_argument("--items", default=None, help="comma-separated item names (default: all)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = ap.parse_args()
    items = sorted(p for p in args.corpus.iterdir() if p.is_dir() and not p.name.startswith("."))
    if args.items:
        wanted = set(args.items.split(","))
        items = [p for p in items if p.name in wanted]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for item in items:
            row = {"item": item.name}
            for label, prior in (("learned", None), ("uniform", Prior())):
                out = Path(tmp) / f"{item.name}.{label}.brv"
                t = time.perf_counter()
                s = brevis.compress([item], out, threads=args.threads, force=True, prior=prior)
                row[label] = {"archive_bytes": s["archive_bytes"], "seconds": time.perf_counter() - t}
                row[label]["expanded"], row[label]["searches"], row[label]["learned"] = expansions(out)
            row["learned"]["learning_expanded"] = learning_expansions(item, args.threads)
            row["original_bytes"] = s["original_bytes"]
            rows.append(row)
            print(json.dumps(row), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "prior_effect.json").write_text(json.dumps(rows, indent=1) + "\n")
    lines = ["| item | MB | bytes, learned / uniform | expanded, learned (+ learning) | expanded, uniform "
             "| searches, learned / uniform | learned programs taken | seconds, learned / uniform |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    tot = {"l": 0, "u": 0, "el": 0, "ell": 0, "eu": 0, "o": 0, "sl": 0, "su": 0, "lt": 0}
    for r in rows:
        lr, un = r["learned"], r["uniform"]
        lines.append(f"| {r['item']} | {r['original_bytes'] / 1e6:.1f} | {lr['archive_bytes'] / un['archive_bytes']:.4f} "
                     f"| {lr['expanded']} (+ {lr['learning_expanded']}) | {un['expanded']} | {lr['searches']} / {un['searches']} "
                     f"| {lr['learned']} "
                     f"| {lr['seconds']:.1f} / {un['seconds']:.1f} |")
        tot["l"] += lr["archive_bytes"]; tot["u"] += un["archive_bytes"]
        tot["el"] += lr["expanded"]; tot["ell"] += lr["learning_expanded"]; tot["eu"] += un["expanded"]
        tot["o"] += r["original_bytes"]
        tot["sl"] += lr["searches"]; tot["su"] += un["searches"]; tot["lt"] += lr["learned"]
    lines.append(f"| all | {tot['o'] / 1e6:.1f} | {tot['l'] / max(1, tot['u']):.4f} | {tot['el']} (+ {tot['ell']}) "
                 f"| {tot['eu']} | {tot['sl']} / {tot['su']} | {tot['lt']} | |")
    (args.out / "prior_effect.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
