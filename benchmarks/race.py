"""Brevis's decompression against its fastest peer, item by item, from a harness run.

    python benchmarks/race.py RESULTS.json [--peers pcodec-8,zipnn] [--modes memory,tmpfs]

Reads the JSON that benchmarks/run.py wrote (nothing is measured here).
For each item and overall, in each mode: decompression MB/s at the best,
the median and the mean of the run's repeats, Brevis / the fastest of
--peers on that item (default: every other codec of the run; a peer
that skipped an item does not race on it, nor overall), the faster in
bold, the peer named where more than one races. Then, per column, on how many
items Brevis is ahead and the items where it is behind: the figures of
issues 14 and 18, and the README's race tables.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

STATS = (("best", ""), ("median", "_median"), ("mean", "_mean"))


def speed(v: float) -> str:
    return f"{v:.0f}" if v >= 100 else f"{v:.1f}"


def race(run: dict, peers: list[str], modes: list[str]) -> tuple[list[str], list[str]]:
    """The table's lines and the tally's lines."""
    codecs = [c["name"] for c in run["codecs"]]
    peers = peers or [c for c in codecs if c != "brevis"]
    rows = [(it["name"], it["results"]) for it in run["items"]] + [("overall", run["overall"])]
    columns = [(mode, stat, suffix) for mode in modes for stat, suffix in STATS]
    lines = ["| item | " + " | ".join(f"{mode}: {stat}" for mode, stat, _ in columns) + " |",
             "|---|" + "---|" * len(columns)]
    behind: dict[tuple, list[str]] = {c: [] for c in columns}
    raced = 0
    for name, results in rows:
        mine = results.get("brevis") or {}
        cells = []
        for column in columns:
            mode, _, suffix = column
            key = f"decompress_mb_s_{mode}{suffix}"
            # overall: a peer whose figure covers fewer items (ZipNN's: the float ones) does not race
            theirs = [(results[p][key], p) for p in peers if (results.get(p) or {}).get(key) is not None
                      and (name != "overall" or results[p].get("items") == mine.get("items"))]
            if mine.get(key) is None or not theirs:
                cells.append("–")
                continue
            best, who = max(theirs)
            b, p = speed(mine[key]), speed(best) + (f" ({who})" if len(peers) > 1 else "")
            ahead = mine[key] >= best
            cells.append(f"**{b}** / {p}" if ahead else f"{b} / **{p}**")
            if not ahead and name != "overall":
                behind[column].append(f"{name} {b} / {speed(best)}")
        raced += name != "overall" and any(c != "–" for c in cells)
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    tally = [f"{mode}, {stat}: ahead on {raced - len(behind[(mode, stat, s)])} of {raced}"
             + (f"; behind on {', '.join(behind[(mode, stat, s)])}" if behind[(mode, stat, s)] else "")
             for mode, stat, s in columns]
    return lines, tally


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("results", type=Path, help="a run's JSON (benchmarks/results/run-*.json)")
    ap.add_argument("--peers", default="", help="comma-separated codec names (default: every other codec)")
    ap.add_argument("--modes", default="memory,tmpfs")
    args = ap.parse_args(argv)
    run = json.loads(args.results.read_text())
    modes = [m for m in args.modes.split(",") if m in run["modes"]]
    if not modes:
        print(f"race: the run has none of the modes {args.modes} (it has {', '.join(run['modes'])})", file=sys.stderr)
        return 2
    peers = [p for p in args.peers.split(",") if p]
    unknown = [p for p in peers if p not in {c["name"] for c in run["codecs"]}]
    if unknown:
        print(f"race: the run has no codec {', '.join(unknown)}", file=sys.stderr)
        return 2
    lines, tally = race(run, peers, modes)
    print(f"Decompression MB/s, Brevis / the fastest peer ({run['brevis_revision']}, {run['date']}, "
          f"{run['threads']} threads, {run['repeat']} runs each)\n")
    print("\n".join(lines) + "\n")
    print("\n".join(f"- {t}" for t in tally))
    return 0


if __name__ == "__main__":
    sys.exit(main())
