"""The `ans` coder's C steps, nanoseconds a value, on real checkpoint bytes.

    python benchmarks/coder_kernels.py [CORPUS] [--items a,b] [--against OLD.so]
                                       [--repeat 15] [--rounds 3]

For each item, the middle 8 MiB of its largest file, read as 16-bit
values (F16 and BF16 weights, the two halves of F32 ones), as bytes and
as the low 23 bits of 32-bit words (an F32 mantissa, as float_fields
splits it off), is cut into blocks of 2^19 values (the last one, or a smaller file's
only one, shorter) and timed, best of
--repeat over all blocks, for --rounds rounds:

- encode_block: one block's model, rANS part and offsets (the encoder's
  step, at 32 states: blocks this long are wide);
- trie_values: the keys counted and the trie chosen (the search's
  estimate, and the first step of encode_block);
- decode_stream: a stream of those blocks (as `Ans().encode` writes it)
  decoded back;
- decode_streams: the same values as streams of 2^15 values (narrow
  blocks, as small tensors and a partition's classes have them), all
  decoded in one call, eight blocks at a time (the engine).

With --against, the same calls through another build of the extension
(a copy of an older brevis/native/_rans*.so), in the same process and
interleaved with this one's, and every encoded block compared byte for
byte: a kernel change measured against the one before it, on a host whose
speed drifts between processes. Prints a table; nothing is written.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from brevis.dsl.entropy import BIN_COST, NODE_COST, WIDE_LANES, Ans  # noqa: E402
from brevis.dsl.types import Field  # noqa: E402
from brevis.native import _rans  # noqa: E402
from brevis.workers.heap import keep_freed_memory  # noqa: E402

DEFAULT_CORPUS = Path.home() / ".cache" / "brevis-corpus"
DEFAULT_ITEMS = "nomic-embed-v1.5-f16,astra-i3d-resnet152,minilm-l6-v2"
SPAN = 8 << 20
BLOCK = 1 << 19
SHORT = 1 << 15  # values of a short stream: narrow blocks (below WIDE_MIN)


def load_build(path: Path):
    """Another build of brevis.native._rans, a module object of its own (not put in sys.modules)."""
    spec = importlib.util.spec_from_file_location("brevis.native._rans", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def middle_bytes(item: Path) -> np.ndarray:
    largest = max((p for p in item.rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)
    size = largest.stat().st_size
    start = max(0, (size - SPAN) // 2) & ~1
    return np.fromfile(largest, dtype=np.uint8, count=min(SPAN, size - start) & ~1, offset=start)


def best(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def same_blocks(builds: dict, blocks: list, width: int, bits: int, where: str) -> None:
    """Every build codes every block to the same bytes, or the script stops."""
    for k, b in enumerate(blocks):
        coded = {mod.encode_block(b, width, bits, BIN_COST, NODE_COST, WIDE_LANES) for mod in builds.values()}
        if len(coded) > 1:
            raise SystemExit(f"{where}: the builds code block {k} differently")


def measure(builds: dict, values: np.ndarray, blocks: list, width: int, bits: int,
            repeat: int) -> dict[str, dict[str, float]]:
    """{step: {build: ns a value}} over `values` and its `blocks`; each
    build's decoding checked to give the values back."""
    n = len(values)
    stream = Ans().encode(values, Field(bits))
    out = np.empty(n, dtype=values.dtype)
    counted = sum(len(b) for b in blocks)
    # Short streams of narrow blocks, decoded in one call: the engine's case.
    pieces = [values[k: k + SHORT] for k in range(0, n, SHORT)]
    shorts = [Ans().encode(p, Field(bits)) for p in pieces]
    outs = [np.empty_like(p) for p in pieces]
    calls = [(s, len(p), width, bits, o) for s, p, o in zip(shorts, pieces, outs)]
    result: dict[str, dict[str, float]] = {"encode_block": {}, "trie_values": {}, "decode_stream": {},
                                           "decode_streams": {}}
    for name, mod in builds.items():
        def encode(mod=mod):
            for b in blocks:
                mod.encode_block(b, width, bits, BIN_COST, NODE_COST, WIDE_LANES)

        def trie(mod=mod):
            for b in blocks:
                mod.trie_values(b, width, max(0, bits - 16), min(bits, 16), BIN_COST, NODE_COST)

        result["encode_block"][name] = best(encode, repeat) / counted * 1e9
        result["trie_values"][name] = best(trie, repeat) / counted * 1e9
        result["decode_stream"][name] = best(lambda mod=mod: mod.decode_stream(stream, n, width, bits, out),
                                             repeat) / n * 1e9
        if not np.array_equal(out, values):
            raise SystemExit(f"{name}: decode_stream did not give the values back")
        result["decode_streams"][name] = best(lambda mod=mod: mod.decode_streams(calls), repeat) / n * 1e9
        if not all(np.array_equal(o, p) for o, p in zip(outs, pieces)):
            raise SystemExit(f"{name}: decode_streams did not give the values back")
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("corpus", nargs="?", type=Path, default=DEFAULT_CORPUS)
    ap.add_argument("--items", default=DEFAULT_ITEMS)
    ap.add_argument("--against", type=Path, help="another build of brevis/native/_rans*.so")
    ap.add_argument("--repeat", type=int, default=15)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)
    keep_freed_memory()  # as the encoder's processes do: freed buffers kept, not faulted in again
    builds = {"this build": _rans}
    if args.against:
        builds["against"] = load_build(args.against)
    columns = list(builds)
    print("| item | values | step | " + " | ".join(f"{c}, ns a value" for c in columns) + " |")
    print("|---|---|---|" + "---:|" * len(columns))
    for item in args.items.split(","):
        raw = middle_bytes(args.corpus / item)
        low23 = raw[: len(raw) & ~3].view(np.uint32) & np.uint32((1 << 23) - 1)
        for label, values, width, bits in (("16-bit", raw.view(np.uint16), 2, 16), ("bytes", raw, 1, 8),
                                           ("23-bit", low23, 4, 23)):
            blocks = [np.ascontiguousarray(values[k: k + BLOCK]) for k in range(0, len(values), BLOCK)]
            same_blocks(builds, blocks, width, bits, f"{item} {label}")
            rounds = [measure(builds, values, blocks, width, bits, args.repeat) for _ in range(args.rounds)]
            for step in rounds[0]:
                cells = [" / ".join(f"{r[step][c]:.2f}" for r in rounds) for c in columns]
                print(f"| {item} | {label} | {step} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
