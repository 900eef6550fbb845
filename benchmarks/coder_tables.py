"""Could coder statistics learned on the sample, or compact programs, pay?

    python benchmarks/coder_tables.py [CORPUS] [--items a,b] [--out DIR]

Measures, per corpus item, on the streams Brevis codes (issue 3):

1. Field streams. Every float tensor (BF16, F16, F32) of more than 4096
   bytes, as brevis.formats.layout cuts the files, is cut into chunks like
   the encoder does (brevis.workers.pool.chunk_counts, 1 MiB, rows of the last
   dimension). Each chunk gives two byte streams: the exponent field (one
   byte per element) and the sign bit with the 7 high mantissa bits
   ("sign+mantissa", one byte per element). A stream kind is (dtype, field).
   The sample is every 4th tensor of each dtype (the 1st, 5th, ...), and
   the totals are over every stream, sample included:

   a. zstd: each stream coded by Zstd.entropy(), what Brevis does now;
   b. dict: the same parameters with a zstd dictionary per stream kind
      (zstandard.train_dictionary, 1 KiB and 4 KiB, statistics at level 19)
      trained on the sample's streams, cut into 16 KiB pieces (at most 4 MiB
      of them, evenly spread); no dictionary id in the frames; each
      dictionary's bytes counted once. A kind whose training fails is coded
      as in (a);
   c. static: the ideal size (whole bytes) of a static order-0 code per
      stream kind, the cross-entropy of each stream against the pooled
      histogram of the sample's streams with add-0.5 smoothing over the
      field's alphabet, plus the table once per kind (4 bits per symbol,
      as a list of code lengths);
   d. choice: per stream the smaller of (a) and (c), plus one flag byte,
      plus the tables of (c) once: the most a "fixed table where it wins"
      coder could reach;
   e. entropy: each stream's own order-0 entropy (no table): the bound of
      any per-stream order-0 coder (zstd goes below it on a few streams
      with repeats).
   f. own: each stream's ideal order-0 code under its own histogram (whole
      bytes) plus its own table (4 bits per symbol): an ideal per-stream
      entropy coder, learning nothing on the sample;
   g. best: per stream the smaller of (f) and (c), plus one flag byte, plus
      the tables of (c) once. (a) -> (f) is what a better coder gains with no
      learned statistics; (f) -> (g) is what sharing tables adds;

   A table costs 4 bits per symbol of the field's alphabet (128 bytes for
   bytes, 16 for F16 exponents), shared or not; that overstates what a
   sparse per-stream table needs, which favours the shared tables.

   Small streams (chunks of under 16 KiB of elements) are also totalled on
   their own, without the one-time dictionary and table bytes.

2. Index. The item is compressed with brevis.compress (default settings,
   threads=1); from the footer (docs/FORMAT.md) the stored index length is
   read, and the index JSON is re-compressed as the writer does (compact
   JSON, zstd level 9) with every segment's `programs` emptied: the
   difference is what programs cost in the index, the most a compact
   serialization of them could save. Likewise without the `prior` entry
   (its counts and learned programs): what carrying the prior costs.

Writes coder_tables.md and coder_tables.json to DIR (default
benchmarks/results/).
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import platform
import struct
import sys
import tempfile
from pathlib import Path

import numpy as np
import zstandard

ROOT = Path(__file__).resolve().parent.parent
if __name__ == "__main__":
    sys.path[0] = str(ROOT)

import brevis  # noqa: E402
from brevis.dsl import Zstd  # noqa: E402
from brevis.dsl.types import Field  # noqa: E402
from brevis.formats import layout  # noqa: E402
from brevis.workers.pool import CHUNK_BYTES, chunk_counts  # noqa: E402
from benchmarks.entropy import entropy_bits  # noqa: E402
from benchmarks.run import load_items, revision, threads_available  # noqa: E402

DEFAULT_CORPUS = Path.home() / ".cache" / "brevis-corpus"
FLOAT_DTYPES = ("BF16", "F16", "F32")
MIN_TENSOR = 4096  # bytes: smaller tensors are not searched (planner.TINY) and not measured
SMALL_STREAM = 16 << 10  # elements (= bytes of a field stream): "small" streams
SAMPLE_EVERY = 4  # every 4th tensor of each dtype is in the sample
DICT_SIZES = (1 << 10, 4 << 10)
TRAIN_PIECE = 16 << 10  # bytes: sample streams are cut into pieces this long for training
TRAIN_MAX = 4 << 20  # bytes of pieces at most per stream kind
# Level the trainer computes the dictionary's statistics at: of 3 (its
# default), 1 and 19, 19 gave the smallest totals on 3 items.
TRAIN_LEVEL = 19
SMOOTHING = 0.5
TABLE_BITS_PER_SYMBOL = 4
FLAG_BYTES = 1
INDEX_LEVEL = 15  # the archive writer's zstd level for the index (brevis/archive/writer.py)
FOOTER = struct.Struct("<QQQ16s8s")  # index offset, stored length, raw length, digest, end magic
FIELDS = ("exponent", "sign+mantissa")
METHODS = ["zstd"] + [f"dict{s >> 10}k" for s in DICT_SIZES] + ["static", "choice", "own", "best", "entropy"]


# ------------------------------------------------------------- the streams

def field_streams(x: np.ndarray, exponent_bits: int, mantissa_bits: int) -> dict[str, tuple[np.ndarray, int]]:
    """The two byte streams of a chunk of float bit patterns (unsigned
    view), with the alphabet size of each."""
    bits = 1 + exponent_bits + mantissa_bits
    exponent = (x >> mantissa_bits) & ((1 << exponent_bits) - 1)
    sign = x >> (bits - 1)
    high = (x >> (mantissa_bits - 7)) & 0x7F
    return {"exponent": (exponent.astype(np.uint8), 1 << exponent_bits),
            "sign+mantissa": (((sign << 7) | high).astype(np.uint8), 256)}


def float_tensors(path: Path) -> list:
    """The float segments of a file that Brevis would search (above 4096 bytes)."""
    with open(path, "rb") as f:
        _, segments = layout(f, path.stat().st_size, path.name)
    return [s for s in segments if s.dtype is not None and s.dtype.name in FLOAT_DTYPES
            and s.length > MIN_TENSOR and s.length % s.dtype.itemsize == 0]


def tensor_chunks(path: Path, seg) -> list[np.ndarray]:
    """The segment's elements (unsigned view) cut into the encoder's chunks."""
    dt = seg.dtype
    with open(path, "rb") as f:
        f.seek(seg.offset)
        x = np.frombuffer(f.read(seg.length), dtype=dt.uint)
    row = seg.shape[-1] if seg.shape else 1
    out, start = [], 0
    for n in chunk_counts(len(x), dt.itemsize, CHUNK_BYTES, row):
        out.append(x[start:start + n])
        start += n
    return out


def item_streams(files: list[Path]):
    """(kind, alphabet, stream, in_sample) for every chunk's field streams of
    an item, tensors in file order; a kind is 'DTYPE:field'."""
    seen: dict[str, int] = {}
    for path in files:
        for seg in float_tensors(path):
            dt = seg.dtype
            index = seen[dt.name] = seen.get(dt.name, -1) + 1
            in_sample = index % SAMPLE_EVERY == 0
            for x in tensor_chunks(path, seg):
                for name, (s, alphabet) in field_streams(x, dt.exponent_bits, dt.mantissa_bits).items():
                    yield f"{dt.name}:{name}", alphabet, s, in_sample


# ------------------------------------------------- what is learned on the sample

def train_pieces(streams: list[np.ndarray]) -> list[bytes]:
    """The sample's streams cut into training pieces, evenly thinned to TRAIN_MAX bytes."""
    pieces = [s[i:i + TRAIN_PIECE].tobytes() for s in streams for i in range(0, len(s), TRAIN_PIECE)]
    keep = max(1, TRAIN_MAX // TRAIN_PIECE)
    if len(pieces) > keep:
        pieces = [pieces[i * len(pieces) // keep] for i in range(keep)]
    return pieces


def train_dictionary(size: int, pieces: list[bytes]) -> bytes | None:
    """A zstd dictionary of at most `size` bytes, or None where training fails."""
    try:
        return zstandard.train_dictionary(size, pieces, level=TRAIN_LEVEL).as_bytes()
    except zstandard.ZstdError:
        return None


def pooled_table(streams: list[np.ndarray], alphabet: int) -> np.ndarray:
    """-log2 q(v) of the static code: the sample's pooled histogram, add-0.5 smoothed."""
    counts = np.full(alphabet, SMOOTHING)
    for s in streams:
        counts += np.bincount(s, minlength=alphabet)[:alphabet]
    return -np.log2(counts / counts.sum())


def table_bytes(alphabet: int) -> int:
    return math.ceil(alphabet * TABLE_BITS_PER_SYMBOL / 8)


# ------------------------------------------------------------- the coders

def entropy_compressor(dictionary: bytes | None = None) -> zstandard.ZstdCompressor:
    """Zstd.entropy()'s parameters, with a dictionary (no id in the frame) if given."""
    c = Zstd.entropy().config
    params = zstandard.ZstdCompressionParameters.from_level(
        c["level"], strategy=c["strategy"], window_log=c["window_log"], hash_log=c["hash_log"],
        chain_log=c["chain_log"], min_match=c["min_match"], write_content_size=True,
        write_checksum=False, write_dict_id=False)
    if dictionary is None:
        return zstandard.ZstdCompressor(compression_params=params)
    return zstandard.ZstdCompressor(compression_params=params, dict_data=zstandard.ZstdCompressionDict(dictionary))


def zstd_bytes(s: np.ndarray) -> int:
    """Bytes of the stream as Brevis codes it now (the Zstd.entropy() leaf)."""
    return len(Zstd.entropy().encode(s, Field(8)))


def static_bytes(s: np.ndarray, cost: np.ndarray) -> int:
    """Whole bytes of the stream under a static order-0 code with these -log2 q."""
    return math.ceil(float(cost[s].sum()) / 8) if len(s) else 0


def own_entropy_bytes(s: np.ndarray) -> float:
    return entropy_bits(np.bincount(s)) / 8


# ------------------------------------------------------ measurement 1: streams

def _zero() -> dict:
    return {"streams": 0, "raw": 0, **{m: 0.0 for m in METHODS}}


def measure_streams(files: list[Path]) -> dict:
    """Totals per field (all streams, and small ones) for methods (a)-(e),
    and the one-time bytes (dictionaries, tables) per field."""
    sample: dict[str, list[np.ndarray]] = {}
    alphabets: dict[str, int] = {}
    for kind, alphabet, s, in_sample in item_streams(files):
        alphabets[kind] = alphabet
        if in_sample:
            sample.setdefault(kind, []).append(s)

    dict_coders: dict[tuple[str, int], zstandard.ZstdCompressor] = {}
    tables: dict[str, np.ndarray] = {}
    once = {f: {"dictionaries": {m: 0 for m in METHODS if m.startswith("dict")}, "tables": 0,
                "failed_dictionaries": 0} for f in FIELDS}
    for kind, streams in sample.items():
        field = kind.split(":", 1)[1]
        pieces = train_pieces(streams)
        for size in DICT_SIZES:
            d = train_dictionary(size, pieces)
            if d is None:
                once[field]["failed_dictionaries"] += 1
                continue
            once[field]["dictionaries"][f"dict{size >> 10}k"] += len(d)
            dict_coders[kind, size] = entropy_compressor(d)
        tables[kind] = pooled_table(streams, alphabets[kind])
        once[field]["tables"] += table_bytes(alphabets[kind])

    totals = {f: {"all": _zero(), "small": _zero()} for f in FIELDS}
    for kind, _, s, _ in item_streams(files):
        field = kind.split(":", 1)[1]
        a = zstd_bytes(s)
        sizes = {"zstd": a, "entropy": own_entropy_bytes(s)}
        for size in DICT_SIZES:
            coder = dict_coders.get((kind, size))
            sizes[f"dict{size >> 10}k"] = len(coder.compress(s.tobytes())) if coder else a
        sizes["static"] = static_bytes(s, tables[kind])
        sizes["choice"] = min(a, sizes["static"]) + FLAG_BYTES
        sizes["own"] = math.ceil(sizes["entropy"]) + table_bytes(alphabets[kind])
        sizes["best"] = min(sizes["own"], sizes["static"]) + FLAG_BYTES
        for group in ("all", "small") if len(s) < SMALL_STREAM else ("all",):
            t = totals[field][group]
            t["streams"] += 1
            t["raw"] += len(s)
            for m, v in sizes.items():
                t[m] += v
    for field in FIELDS:  # one-time bytes belong to the item's totals, not to the small streams
        t = totals[field]["all"]
        for m, v in once[field]["dictionaries"].items():
            t[m] += v
        for m in ("static", "choice", "best"):
            t[m] += once[field]["tables"]
    return {"fields": totals, "once": once}


# ------------------------------------------------------- measurement 2: index

def read_index(archive: Path) -> tuple[int, bytes]:
    """The stored length of an archive's index and its JSON."""
    with open(archive, "rb") as f:
        f.seek(-FOOTER.size, 2)
        offset, stored, raw, _, magic = FOOTER.unpack(f.read(FOOTER.size))
        if magic != b"BRVINDEX":
            raise ValueError(f"{archive}: not a Brevis archive")
        f.seek(offset)
        frame = f.read(stored)
    return stored, zstandard.ZstdDecompressor().decompress(frame, max_output_size=raw)


def _stored(obj: dict) -> int:
    """Bytes of an index object as the archive writer stores it."""
    raw = json.dumps(obj, separators=(",", ":")).encode("ascii")
    return len(zstandard.ZstdCompressor(level=INDEX_LEVEL).compress(raw))


def index_costs(index_json: bytes) -> dict:
    """The index re-compressed as it is, with every segment's programs
    emptied (and the program table, format version 9 on), and without the
    prior (counts and learned programs)."""
    obj = json.loads(index_json)
    out = {"index_json": len(index_json), "recompressed": _stored(obj)}
    out["without_prior"] = _stored({k: v for k, v in obj.items() if k != "prior"})
    obj.pop("programs", None)
    for f in obj["files"]:
        for seg in f["segments"]:
            seg["programs"] = []
    out["without_programs"] = _stored(obj)
    out["programs_json"] = len(index_json) - len(json.dumps(obj, separators=(",", ":")))
    out["programs"] = out["recompressed"] - out["without_programs"]
    out["prior"] = out["recompressed"] - out["without_prior"]
    return out


def measure_index(files: list[Path], scratch: Path) -> dict:
    archive = scratch / "item.brv"
    brevis.compress([str(p) for p in files], archive, threads=1, force=True)
    stored, index_json = read_index(archive)
    out = {"archive": archive.stat().st_size, "index_stored": stored, **index_costs(index_json)}
    archive.unlink()
    return out


# ------------------------------------------------------------------ report

def combine(rows: list[dict]) -> dict:
    """Field totals and index figures summed over items."""
    out = {"fields": {f: {g: _zero() for g in ("all", "small")} for f in FIELDS}, "index": {}}
    for r in rows:
        for f in FIELDS:
            for g in ("all", "small"):
                for k, v in r["streams"]["fields"][f][g].items():
                    out["fields"][f][g][k] += v
        for k, v in (r.get("index") or {}).items():
            out["index"][k] = out["index"].get(k, 0) + v
    return out


def _both(fields: dict, group: str) -> dict:
    t = _zero()
    for f in FIELDS:
        for k, v in fields[f][group].items():
            t[k] += v
    return t


def _pct(x: float, base: float, digits: int = 2) -> str:
    return f"{100 * x / base:.{digits}f}" if base else "–"


def _delta(x: float, base: float, archive: float | None) -> str:
    return f"{100 * (x - base) / archive:+.3f}" if archive else "–"


def stream_table(title: str, rows: list[tuple[str, dict, float | None]]) -> list[str]:
    """One line per (label, totals, archive bytes): (a) in bytes, the others
    as % of (a), and the change of the best dictionary and of (d) as % of the archive."""
    others = [m for m in METHODS if m != "zstd"]
    out = [f"### {title}", "",
           "| | streams | raw bytes | (a) zstd bytes | " + " | ".join(f"{m} % of (a)" for m in others)
           + " | dict4k − (a), % of archive | choice − (a), % of archive | best − own, % of archive |",
           "|" + "---|" * (7 + len(others))]
    for label, t, archive in rows:
        out.append(f"| {label} | {t['streams']} | {t['raw']:,} | {round(t['zstd']):,} | "
                   + " | ".join(_pct(t[m], t["zstd"]) for m in others)
                   + f" | {_delta(t['dict4k'], t['zstd'], archive)} | {_delta(t['choice'], t['zstd'], archive)} "
                   f"| {_delta(t['best'], t['own'], archive)} |")
    return out + [""]


def markdown(res: dict) -> str:
    rows, total = res["items"], res["overall"]
    m = res["machine"]
    lines = ["# Coder tables learned on the sample: what they could save (issue 3)", "",
             f"{res['date']}, commit {res['commit']}, {m['arch']}, {m['nproc']} CPUs, Python {m['python']}, "
             f"zstd {res['zstd']}. Produced by `benchmarks/coder_tables.py`; the methods are in its docstring.", "",
             "(a) zstd = `Zstd.entropy()` per chunk stream (now); dictNk = (a) with an N KiB dictionary per "
             "stream kind trained on the sample (dictionary bytes counted once); static = one pooled order-0 "
             "table per stream kind (ideal code + table once); choice = per stream min((a), static) + 1 flag "
             "byte; own = ideal per-stream order-0 code + its own table; best = per stream min(own, static) "
             "+ 1 flag byte; entropy = each stream's own order-0 entropy, no table (the bound). "
             "Tables cost 4 bits per symbol. "
             "Small streams: chunks under 16 KiB, one-time bytes not included.", ""]
    archive_total = total["index"].get("archive")
    overall_rows = []
    for f in FIELDS:
        overall_rows.append((f, total["fields"][f]["all"], archive_total))
    overall_rows.append(("both", _both(total["fields"], "all"), archive_total))
    for f in FIELDS:
        overall_rows.append((f"{f}, small", total["fields"][f]["small"], archive_total))
    overall_rows.append(("both, small", _both(total["fields"], "small"), archive_total))
    lines += stream_table(f"Overall ({len(rows)} items), field streams", overall_rows)
    failed = [f"{r['item']} ({sum(r['streams']['once'][f]['failed_dictionaries'] for f in FIELDS)})"
              for r in rows if any(r["streams"]["once"][f]["failed_dictionaries"] for f in FIELDS)]
    if failed:
        lines += ["Dictionary trainings that failed (too little sample; those streams count as (a)): "
                  + ", ".join(failed) + ".", ""]
    lines += stream_table("Per item, both fields, all streams",
                          [(r["item"], _both(r["streams"]["fields"], "all"), (r.get("index") or {}).get("archive"))
                           for r in rows])
    lines += stream_table("Per item, both fields, small streams (under 16 KiB)",
                          [(r["item"], _both(r["streams"]["fields"], "small"), (r.get("index") or {}).get("archive"))
                           for r in rows])
    lines += ["### Index: what programs cost", "",
              "| | archive bytes | index stored | index re-compressed | without segments' programs | programs | programs, JSON bytes | "
              "programs % of index | programs % of archive | prior (in the index) | prior % of archive |",
              "|" + "---|" * 11]
    for label, ix in [(r["item"], r.get("index")) for r in rows] + [("overall", total["index"])]:
        if not ix:
            continue
        lines.append(f"| {label} | {ix['archive']:,} | {ix['index_stored']:,} | {ix['recompressed']:,} | "
                     f"{ix['without_programs']:,} | {ix['programs']:,} | {ix['programs_json']:,} | {_pct(ix['programs'], ix['index_stored'])} | "
                     f"{_pct(ix['programs'], ix['archive'], 4)} | {ix['prior']:,} | {_pct(ix['prior'], ix['archive'], 4)} |")
    return "\n".join(lines) + "\n"


def measure_item(item: dict, scratch: Path, index: bool = True) -> dict:
    files = item["files"]
    row = {"item": item["name"], "streams": measure_streams(files)}
    if index:
        row["index"] = measure_index(files, scratch)
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("corpus", nargs="?", type=Path, default=DEFAULT_CORPUS)
    ap.add_argument("--items", default=None, help="comma-separated item names (default: all)")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = ap.parse_args(argv)
    items = load_items(args.corpus, args.items.split(",") if args.items else None)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for item in items:
            print(f"{item['name']} ...", file=sys.stderr, flush=True)
            rows.append(measure_item(item, Path(tmp)))
    res = {"date": datetime.date.today().isoformat(), "commit": revision(),
           "machine": {"arch": platform.machine(), "nproc": threads_available(),
                       "python": platform.python_version(), "platform": platform.platform()},
           "zstd": zstandard.ZSTD_VERSION, "items": rows, "overall": combine(rows)}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "coder_tables.json").write_text(json.dumps(res, indent=1) + "\n")
    (args.out / "coder_tables.md").write_text(markdown(res))
    print(markdown(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
