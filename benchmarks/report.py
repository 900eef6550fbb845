"""The results as a markdown page and a plot."""

from __future__ import annotations

from pathlib import Path

from . import startup

DASH = "–"
BREVIS_COLOR = "#d62728"
PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf",
           "#393b79", "#637939", "#8c6d31"]


def _table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" if i == 0 else "---:" for i in range(len(header))) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def _cell(r: dict | None, key: str, fmt: str) -> str:
    if r is None or r.get("status", "ok") != "ok" or r.get(key) is None:
        return "FAILED" if r and r.get("status") == "FAILED" else DASH
    return format(r[key], fmt)


MODE_TITLES = {"memory": "in memory", "tmpfs": "file to file, tmpfs", "disk": "file to file, disk",
               "cpu": "in memory, one thread"}


def _num(v, fmt: str) -> str:
    return DASH if v is None else format(v, fmt)


def _speed(v) -> str:
    """MB/s with three significant figures or so."""
    if v is None:
        return DASH
    return f"{v:.0f}" if v >= 100 else f"{v:.1f}" if v >= 1 else f"{v:.2f}"


def _slash(r: dict | None, keys: list[str], fmt) -> str:
    """Several figures of one result in one cell, a / b / c; FAILED or – where there is no result."""
    if r is None or r.get("status", "ok") != "ok":
        return "FAILED" if r and r.get("status") == "FAILED" else DASH
    return " / ".join(fmt(r.get(k)) for k in keys)


def markdown(res: dict) -> str:
    codecs = res["codecs"]
    labels = [c["label"] for c in codecs]
    names = [c["name"] for c in codecs]
    items = res["items"]
    m = res["machine"]
    total = res["entropy"]["original_bytes"]
    modes = res.get("modes", ["disk"])
    fs = res.get("filesystems", {})
    speed_modes = [x for x in ("memory", "tmpfs", "disk") if x in modes]
    out = [
        "# Brevis benchmark\n",
        f"{res['date']} · brevis {res.get('brevis_revision') or '?'} · `uname -m` {m['arch']}"
        + (f" · {m['cpu']}" if m.get("cpu") else "") + f" · nproc {m['nproc']} · "
        f"threads {res['threads']} · Python {m['python']} · {_load(m.get('loadavg_1min'))} · {len(items)} items, "
        f"{total / 1e6:.1f} MB ({res['corpus']})" + (f" · tmpfs {fs['tmpfs']}, disk {fs['disk']}" if fs else "") + "\n",
        "Ratio = compressed / original (lower is better), of the file-to-file output. Throughput = MB (10^6 "
        f"bytes) of original data per second of wall clock at {res['threads']} thread(s), for the codec's work "
        "alone (the interpreter's start, the library's import, making the codec's objects and telling a peer its "
        "files' dtypes and tensor boundaries come before the clock starts), " +
        ("one run each" if res.get("repeat", 1) == 1 else
         f"best of {res['repeat']} runs each (decompression also as the median and the mean of the runs, below)") + ":\n",
        "- **in memory** (mem): codec calls only. Peers: the input already in memory (read before the clock), "
        "the output kept in memory (a list of buffers per file), the codec's in-memory API with its objects "
        "reused. Brevis, which has no bytes-in API for compression: compression is `brevis.compress` from the "
        "files (in the page cache) to an archive on tmpfs, fsync included (so it equals file to file on "
        "tmpfs); decompression is `brevis.unpack` on the archive's bytes (read into memory before the clock): "
        "one buffer per file, on N threads, every chunk's digest checked (XXH3-128 from format "
        "version 7 on) and its streams' checks (XXH3-64) where it fails, to name the damaged stream (from "
        "7e633dc on; before it, every stream's check too), no file written.",
        "- **file to file** on tmpfs and on disk: inputs read from the files (in the page cache), outputs "
        "written as files and fsync'ed before the clock stops (every codec; Brevis's compress fsyncs "
        "its archive itself), the way the codec's documentation does it for files (streaming for zstd, gzip, "
        "xz, brotli, lz4; ZipNN, pcodec and blosc2 have no streaming API and read and write whole files); "
        "Brevis through `brevis.compress` / `brevis.decompress` (checksums checked).",
        "- **CPU s/GB**: CPU seconds (user + system, getrusage RUSAGE_SELF + RUSAGE_CHILDREN around the timed "
        "part) per GB (10^9 bytes) of original data, in memory on one thread (`threads=1`): independent of "
        "the number of cores.",
        "- **Peak** = peak RSS of the process that ran the codec, in MiB, plus, where it started worker "
        "processes (Brevis from 2 threads on inputs of 32 MiB or more), threads x the largest worker's peak "
        "(an upper bound); baseline = the same process after importing the codec's library and making its "
        "objects. In memory the peak holds the input and the output.\n",
        "Every output (each pass's) was decompressed and compared with its input by SHA-256 (in memory: the "
        "buffers, hashed after the clock stopped). Threads: " +
        "; ".join(f"{c['label']}: {c['threads_note']}" for c in codecs if c.get("threads_note")) + ". "
        "ZipNN runs only on items whose every file is mostly BF16/F16/F32; its overall figures cover those "
        "items only. Entropy = order-0 per-field entropy (benchmarks/README.md).\n",
    ]
    if res["skipped"]:
        out.append("Skipped: " + "; ".join(f"{k} ({v})" for k, v in res["skipped"].items()) + "\n")
    if res["failures"]:
        out.append("**ROUND-TRIP FAILURES:** " + "; ".join(res["failures"]) + "\n")

    out.append("## Overall (byte-weighted)\n")
    short = {"memory": "mem", "tmpfs": "tmpfs", "disk": "disk"}
    header = (["codec", "ratio"] + [f"c MB/s {short[x]}" for x in speed_modes]
              + [f"d MB/s {short[x]}" for x in speed_modes]
              + (["c CPU s/GB", "d CPU s/GB"] if "cpu" in modes else [])
              + (["peak MiB c/d mem"] if "memory" in modes else [])
              + (["peak MiB c/d file"] if any(x in modes for x in ("disk", "tmpfs")) else [])
              + ["baseline MiB", "items"])
    rows = []
    for c in codecs:
        o = res["overall"][c["name"]]
        base = c.get("baseline_peak_mib")
        row = [c["label"], _cell(o, "ratio", ".4f")]
        row += [_speed(o.get(f"compress_mb_s_{x}")) if "ratio" in o else DASH for x in speed_modes]
        row += [_speed(o.get(f"decompress_mb_s_{x}")) if "ratio" in o else DASH for x in speed_modes]
        if "cpu" in modes:
            row += [_cell(o, "compress_cpu_s_per_gb", ".2f"), _cell(o, "decompress_cpu_s_per_gb", ".2f")]
        if "memory" in modes:
            row.append(_pair(o, "memory"))
        if any(x in modes for x in ("disk", "tmpfs")):
            row.append(_pair(o, "disk" if "disk" in modes else "tmpfs"))
        row += [DASH if base is None else f"{base:.0f}", f"{o['items']}/{o['of']}"]
        rows.append(row)
    rows.append(["order-0 per-field entropy", f"{res['entropy']['ratio']:.4f}"] + [DASH] * (len(header) - 3)
                + [f"{len(items)}/{len(items)}"])
    out.append(_table(header, rows))

    for c in codecs:
        same = res["overall"][c["name"]].get("same_items")
        if same:
            o = res["overall"][c["name"]]
            shown = ", ".join(f"{_label(codecs, n)} {f['ratio']:.4f}" + (
                f" ({_speed(f.get('decompress_mb_s_memory'))})" if f.get("decompress_mb_s_memory") else "")
                for n, f in same.items() if isinstance(f, dict) and f.get("ratio") is not None)
            out.append(f"\nOn the {o['items']} items {c['label']} ran on, ratio (decompression MB/s in memory): "
                       f"{shown}.\n")

    def per_item(title: str, cell, best=None, extra=None, overall_cell=None) -> None:
        out.append(f"\n## {title}\n")
        rows = []
        for it in items:
            cells = [cell(it["results"].get(n)) for n in names]
            if best:
                vals = [best[1](it["results"][n]) for n in names if it["results"].get(n, {}).get("status") == "ok"]
                if vals:
                    top = best[0](vals)
                    cells = [f"**{v}**" if v == top else v for v in cells]
            rows.append([it["name"], f"{it['original_bytes'] / 1e6:.1f}"] + cells + ([extra(it)] if extra else []))
        rows.append(["overall", f"{total / 1e6:.1f}"] + [(overall_cell or cell)(res["overall"][n]) for n in names]
                    + ([f"{res['entropy']['ratio']:.4f}"] if extra else []))
        out.append(_table(["item", "MB"] + labels + (["entropy"] if extra else []), rows))

    def ratio_cell(r):
        return _cell(r, "ratio", ".4f")

    def overall_ratio(o):
        return _cell(o, "ratio", ".4f") if "ratio" in o else DASH

    per_item("Ratio per item (best in bold)", ratio_cell, best=(min, ratio_cell),
             extra=lambda it: f"{it['entropy_ratio']:.4f}", overall_cell=overall_ratio)
    which = " / ".join(MODE_TITLES[x] for x in speed_modes)
    if speed_modes:
        for what, title in (("compress", "Compression"), ("decompress", "Decompression")):
            keys = [f"{what}_mb_s_{x}" for x in speed_modes]
            per_item(f"{title} MB/s per item ({which})",
                     lambda r, keys=keys: _slash(r, keys, _speed),
                     overall_cell=lambda o, keys=keys: _slash(o, keys, _speed) if "ratio" in o else DASH)
        if res.get("repeat", 1) > 2:  # the typical run too, and the average wait: the best one hides slow ones
            for stat in ("median", "mean"):
                keys = [f"decompress_mb_s_{x}_{stat}" for x in speed_modes]
                per_item(f"Decompression MB/s per item, {stat} of {res['repeat']} runs ({which})",
                         lambda r, keys=keys: _slash(r, keys, _speed),
                         overall_cell=lambda o, keys=keys: _slash(o, keys, _speed) if "ratio" in o else DASH)
    if "cpu" in modes:
        keys = ["compress_cpu_s_per_gb", "decompress_cpu_s_per_gb"]
        per_item("CPU seconds per GB, one thread, in memory (compress / decompress)",
                 lambda r: _slash(r, keys, lambda v: _num(v, ".2f")),
                 overall_cell=lambda o: _slash(o, keys, lambda v: _num(v, ".2f")) if "ratio" in o else DASH)

    file_mode = "disk" if "disk" in modes else "tmpfs" if "tmpfs" in modes else "memory" if "memory" in modes else None
    if file_mode:
        out.append(f"\n## Peak RSS MiB, {MODE_TITLES[file_mode]} (compress / decompress)\n")
        rows = []
        for it in items:
            rows.append([it["name"]] + [_pair(r, file_mode) if r.get("status") == "ok" else _cell(r, "ratio", "")
                                        for r in (it["results"].get(n) for n in names)])
        out.append(_table(["item"] + labels, rows))

    if res.get("startup"):
        out.append("\n## Startup (benchmarks/startup.py)\n")
        out.append(startup.markdown(res["startup"]))

    notes = [f"- {it['name']} / {_label(codecs, n)}: {r['note']}" for it in items
             for n, r in it["results"].items() if r["status"] != "ok"]
    if notes:
        out.append("\n## Notes\n\n" + "\n".join(notes) + "\n")
    return "\n".join(out)


def _pair(r: dict, mode: str) -> str:
    """Peak MiB, compress / decompress, of one pass (a result or an overall)."""
    c, d = r.get(f"compress_peak_mib_{mode}"), r.get(f"decompress_peak_mib_{mode}")
    if c is None or d is None:
        return DASH
    return f"{c:.0f} / {d:.0f}"


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
    modes = res.get("modes", [])
    # Compression throughput in memory (codec calls only) where measured, else file to file.
    mode = next((x for x in ("memory", "disk", "tmpfs") if x in modes), "disk")
    if not modes:  # older results: one file-to-file figure
        for o in res["overall"].values():
            o.setdefault("compress_mb_s_disk", o.get("compress_mb_s"))
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
            brevis_same = (o.get("same_items", {}).get("brevis") or {}).get("ratio")
            label += f"; Brevis {brevis_same:.3f} on them)" if brevis_same and c["name"] != "brevis" else ")"
        brevis = c["name"] == "brevis"
        color = BREVIS_COLOR if brevis else next(others, "black")
        x = o.get(f"compress_mb_s_{mode}")
        if x is None:
            continue
        ax.scatter(x, o["ratio"], s=90 if brevis else 50, color=color, zorder=3)
        points.append((x, o["ratio"], label, brevis))
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
    ax.set_xlabel(f"compression throughput ({MODE_TITLES.get(mode, mode)}), MB/s of original data (log scale)")
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
