"""What the parsers and the default effort cost (issue 13): archive bytes per item
at the default effort, at effort 3, and with the parsers switched off.

    python benchmarks/discovery_effort.py [CORPUS | --corpus PATH] [--items a,b] [--threads N] [--out DIR]

Each item's files (those the harness takes: MANIFEST.json's, else the
regular files at its top level) are compressed into one archive three
times, each in a fresh process: at the default effort, at effort 3, and at
the default effort with BREVIS_PARSERS=off (every file read as bytes, so
its ratio comes from discovery alone). Every archive is verified against
its files. Reports, per item, the three ratios, the default against effort
3 (target: within 0.2 %) and parsers off against on (target: within 1 %).
Writes discovery_effort.md and .json to DIR (default benchmarks/results).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if __name__ == "__main__":
    sys.path[0] = str(ROOT)

from benchmarks.run import DEFAULT_CORPUS, load_items, revision  # noqa: E402

MODES = {"default": ({}, 2), "effort 3": ({}, 3), "parsers off": ({"BREVIS_PARSERS": "off"}, 2)}
EFFORT_SLACK = 0.002  # the default within 0.2 % of effort 3
PARSERS_SLACK = 0.01  # parsers off within 1 % of parsers on

# Run in a fresh process per archive, so that BREVIS_PARSERS is read as a user sets it.
ONE = r"""
import json, sys, time, brevis
files, out, effort, threads = json.loads(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
start = time.perf_counter()
summary = brevis.compress(files, out, threads=threads, effort=effort, force=True)
seconds = time.perf_counter() - start
assert brevis.verify(out, sources=files)["ok"], "verify failed"
print(json.dumps({"archive_bytes": summary["archive_bytes"], "seconds": seconds}))
"""


def measure(files: list[Path], env: dict, effort: int, threads: int, tmp: Path) -> dict:
    out = tmp / "archive.brv"
    r = subprocess.run([sys.executable, "-c", ONE, json.dumps([str(f) for f in files]), str(out), str(effort),
                        str(threads)], env={**os.environ, **env}, capture_output=True, text=True, cwd=ROOT)
    if r.returncode:
        raise SystemExit(f"compress failed: {r.stderr.strip().splitlines()[-1:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def report(rows: list[dict], meta: dict) -> str:
    lines = [f"# Parsers off and effort 3 against the default ({meta['corpus']})", "",
             f"{meta['date']} · brevis {meta['revision']} · threads {meta['threads']} · "
             "`python benchmarks/discovery_effort.py` (one archive of the item's files per mode, each verified)", "",
             "Ratio = archive bytes / original bytes. *default vs effort 3*: how much larger the default's archive "
             f"is (target: at most {EFFORT_SLACK:.1%}). *off vs on*: the archive with BREVIS_PARSERS=off against "
             f"the default (target: at most {PARSERS_SLACK:.0%}).", "",
             "| item | MB | default | effort 3 | parsers off | default vs effort 3 | off vs on |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        n, m = r["original_bytes"], r["modes"]
        a, b, c = (m[k]["archive_bytes"] for k in MODES)
        lines.append(f"| {r['name']} | {n / 1e6:.1f} | {a / n:.4f} | {b / n:.4f} | {c / n:.4f} | "
                     f"{a / b - 1:+.3%} | {c / a - 1:+.2%} |")
    effort_ok = sum(r["modes"]["default"]["archive_bytes"] <= r["modes"]["effort 3"]["archive_bytes"] * (1 + EFFORT_SLACK)
                    for r in rows)
    parsers_ok = sum(r["modes"]["parsers off"]["archive_bytes"] <= r["modes"]["default"]["archive_bytes"]
                     * (1 + PARSERS_SLACK) for r in rows)
    lines += ["", f"Default within {EFFORT_SLACK:.1%} of effort 3 on {effort_ok} of {len(rows)} items; "
              f"parsers off within {PARSERS_SLACK:.0%} of parsers on on {parsers_ok} of {len(rows)}.", ""]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("corpus_arg", nargs="?", type=Path)
    ap.add_argument("--corpus", type=Path)
    ap.add_argument("--items")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = ap.parse_args()
    corpus = (args.corpus or args.corpus_arg or DEFAULT_CORPUS).expanduser()
    items = load_items(corpus, args.items.split(",") if args.items else None)
    meta = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "revision": revision(), "corpus": str(corpus), "threads": args.threads}
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for item in items:
            row = {"name": item["name"], "original_bytes": sum(f.stat().st_size for f in item["files"]), "modes": {}}
            for mode, (env, effort) in MODES.items():
                row["modes"][mode] = measure(item["files"], env, effort, args.threads, Path(tmp))
            n = row["original_bytes"]
            print(item["name"], " ".join(f"{k} {v['archive_bytes'] / n:.4f}" for k, v in row["modes"].items()),
                  flush=True)
            rows.append(row)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "discovery_effort.json").write_text(json.dumps({**meta, "items": rows}, indent=1) + "\n")
    (args.out / "discovery_effort.md").write_text(report(rows, meta))
    print(f"wrote {args.out / 'discovery_effort.md'}")


if __name__ == "__main__":
    main()
