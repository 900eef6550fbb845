"""The results as a markdown page and a plot."""

from __future__ import annotations

from pathlib import Path

DASH = "–"
BREVIS_COLOR = "#d62728"
PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"]


def _table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" if i == 0 else "---:" for i in range(len(header))) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def _cell(r: dict | None, key: str, fmt: str) -> str:
    if r is None or r.get("status", "ok") != "ok" or r.get(key) is None:
        return "FAILED" if r and r.get("status") == "FAILED" else DASH
    return format(r[key], fmt)


def markdown(res: dict) -> str:
    codecs = res["codecs"]
    labels = [c["label"] for c in codecs]
    names = [c["name"] for c in codecs]
    items = res["items"]
    m = res["machine"]
    total = res["entropy"]["original_bytes"]
    out = [
        "# Brevis benchmark\n",
        f"{res['date']} · brevis {res.get('brevis_revision') or '?'} · `uname -m` {m['arch']} · nproc {m['nproc']} · threads {res['threads']} · "
        f"Python {m['python']} · {_load(m.get('loadavg_1min'))} · {len(items)} items, {total / 1e6:.1f} MB ({res['corpus']})\n",
        "Ratio = compressed / original (lower is better). Throughput = MB (10^6 bytes) of original data "
        "per second of wall clock, file reads and writes included. Peak = peak RSS of the process that "
        "ran the codec, in MiB, plus, where it started worker processes (Brevis from 2 threads on inputs of "
        "32 MiB or more), threads x the largest worker's peak (an upper bound); baseline = the same process after importing the codec's library only. "
        "Every output was decompressed and compared with its input by SHA-256. Brevis's decompression "
        "includes its checksum checks. Brevis, zstd, xz (24 MiB blocks in parallel, like `xz -T`) and "
        "ZipNN use the threads given; gzip, brotli (quality 9) and lz4 (default level) are single-threaded. ZipNN runs only on items whose every "
        "file is mostly BF16/F16/F32; its overall figures cover those items only. "
        "Entropy = order-0 per-field entropy (benchmarks/README.md).\n",
    ]
    if res["skipped"]:
        out.append("Skipped: " + "; ".join(f"{k} ({v})" for k, v in res["skipped"].items()) + "\n")
    if res["failures"]:
        out.append("**ROUND-TRIP FAILURES:** " + "; ".join(res["failures"]) + "\n")

    out.append("## Overall (byte-weighted)\n")
    rows = []
    for c in codecs:
        o = res["overall"][c["name"]]
        base = c.get("baseline_peak_mib")
        rows.append([c["label"], _cell(o, "ratio", ".4f"), _cell(o, "compress_mb_s", ".1f"),
                     _cell(o, "decompress_mb_s", ".1f"), _cell(o, "compress_peak_mib", ".0f"),
                     _cell(o, "decompress_peak_mib", ".0f"), DASH if base is None else f"{base:.0f}",
                     f"{o['items']}/{o['of']}"])
    rows.append(["order-0 per-field entropy", f"{res['entropy']['ratio']:.4f}"] + [DASH] * 5 + [f"{len(items)}/{len(items)}"])
    out.append(_table(["codec", "ratio", "compress MB/s", "decompress MB/s", "peak MiB (c)",
                       "peak MiB (d)", "baseline MiB", "items"], rows))

    for c in codecs:
        same = res["overall"][c["name"]].get("same_items")
        if same:
            o = res["overall"][c["name"]]
            shown = ", ".join(f"{_label(codecs, n)} {r:.4f}" for n, r in same.items() if r is not None)
            out.append(f"\nOn the {o['items']} items {c['label']} ran on, ratios: {shown}.\n")

    def per_item(title: str, key: str, fmt: str, best=None, extra=None) -> None:
        out.append(f"\n## {title}\n")
        rows = []
        for it in items:
            cells = [_cell(it["results"].get(n), key, fmt) for n in names]
            if best:
                vals = [it["results"][n][key] for n in names if it["results"].get(n, {}).get("status") == "ok"]
                if vals:
                    top = format(best(vals), fmt)
                    cells = [f"**{v}**" if v == top else v for v in cells]
            rows.append([it["name"], f"{it['original_bytes'] / 1e6:.1f}"] + cells + ([extra(it)] if extra else []))
        rows.append(["overall", f"{total / 1e6:.1f}"] + [_cell(res["overall"][n], key, fmt) for n in names]
                    + ([f"{res['entropy']['ratio']:.4f}"] if extra else []))
        out.append(_table(["item", "MB"] + labels + (["entropy"] if extra else []), rows))

    per_item("Ratio per item (best in bold)", "ratio", ".4f", best=min,
             extra=lambda it: f"{it['entropy_ratio']:.4f}")
    per_item("Compression MB/s", "compress_mb_s", ".1f")
    per_item("Decompression MB/s", "decompress_mb_s", ".1f")

    out.append("\n## Peak RSS MiB (compress / decompress)\n")
    rows = []
    for it in items:
        rows.append([it["name"]] + [
            f"{r['compress_peak_mib']:.0f} / {r['decompress_peak_mib']:.0f}" if r.get("status") == "ok"
            else _cell(r, "ratio", "") for r in (it["results"].get(n) for n in names)])
    out.append(_table(["item"] + labels, rows))

    notes = [f"- {it['name']} / {_label(codecs, n)}: {r['note']}" for it in items
             for n, r in it["results"].items() if r["status"] != "ok"]
    if notes:
        out.append("\n## Notes\n\n" + "\n".join(notes) + "\n")
    return "\n".join(out)


def _load(load) -> str:
    if isinstance(load, dict):
        return f"1-min load average {load['min']}-{load['max']} (mean {load['mean']}) over the run"
    if isinstance(load, list):  # older results: at the start and the end
        return f"load average {load[0]} at start, {load[1]} at end"
    return "load average not recorded"


def _label(codecs: list[dict], name: str) -> str:
    return next((c["label"] for c in codecs if c["name"] == name), name)


def plot(res: dict, path: Path) -> str | None:
    """Ratio against compression throughput, one point per codec; None, or why not drawn."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib not installed: no plot"
    fig, ax = plt.subplots(figsize=(8, 5.5), dpi=120)
    n_items = len(res["items"])
    points = []
    others = iter(PALETTE)
    for c in res["codecs"]:
        o = res["overall"][c["name"]]
        if "ratio" not in o:
            continue
        label = c["label"]
        if o["items"] < n_items:
            label += f" ({o['items']}/{n_items} items"
            brevis_same = o.get("same_items", {}).get("brevis")
            label += f"; Brevis {brevis_same:.3f} on them)" if brevis_same and c["name"] != "brevis" else ")"
        brevis = c["name"] == "brevis"
        color = BREVIS_COLOR if brevis else next(others, "black")
        ax.scatter(o["compress_mb_s"], o["ratio"], s=90 if brevis else 50, color=color, zorder=3)
        points.append((o["compress_mb_s"], o["ratio"], label, brevis))
    ent = res["entropy"]["ratio"]
    if ent is not None:
        ax.axhline(ent, color="gray", linestyle="--", linewidth=1)
        ax.annotate(f"order-0 per-field entropy {ent:.3f}", (0.01, ent), xycoords=("axes fraction", "data"),
                    xytext=(0, -12), textcoords="offset points", fontsize=8, color="gray")
    ax.set_xscale("log")
    # Plain numbers at 1, 2 and 5 per decade, none on the other ticks (their 3x10^1, 4x10^1 labels collide).
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter
    ax.xaxis.set_major_locator(LogLocator(base=10, subs=(1, 2, 5)))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("compression throughput, MB/s of original data (log scale)")
    ax.set_ylabel("compressed / original (lower is better)")
    m = res["machine"]
    ax.set_title(f"Overall, byte-weighted: {n_items} items, {res['entropy']['original_bytes'] / 1e6:.0f} MB · "
                 f"{m['arch']}, nproc {m['nproc']}, threads {res['threads']}", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.margins(x=0.2, y=0.12)
    _label_points(fig, ax, points)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return None


def _label_points(fig, ax, points) -> None:
    """Name each point, moving a name around its point until it overlaps no other name or point."""
    from matplotlib.transforms import Bbox

    offsets = [(6, 5, "left"), (6, -14, "left"), (-6, 5, "right"), (-6, -14, "right"), (6, 16, "left"),
               (6, -25, "left")]
    fig.canvas.draw()
    frame = ax.get_window_extent()
    r = 5  # a marker's half-size in pixels, roughly
    placed = [Bbox.from_extents(px - r, py - r, px + r, py + r)
              for px, py in ax.transData.transform([(x, y) for x, y, *_ in points])]
    for x, y, label, bold in sorted(points, key=lambda p: p[1]):
        for dx, dy, ha in offsets:
            t = ax.annotate(label, (x, y), xytext=(dx, dy), textcoords="offset points", ha=ha, fontsize=9,
                            fontweight="bold" if bold else "normal")
            box = t.get_window_extent(fig.canvas.get_renderer())
            inside = frame.x0 <= box.x0 and box.x1 <= frame.x1 and frame.y0 <= box.y0 and box.y1 <= frame.y1
            if inside and not any(box.overlaps(b) for b in placed):
                break
            t.remove()
        else:
            t = ax.annotate(label, (x, y), xytext=offsets[0][:2], textcoords="offset points", fontsize=9)
            box = t.get_window_extent(fig.canvas.get_renderer())
        placed.append(box)
