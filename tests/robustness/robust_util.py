"""Shared by the robustness tests and scripts/fuzz_reader.py.

Seed archives (a compressed checkpoint and a hand-built archive that runs
every operator of the DSL), tools to take an archive apart and seal a
changed one again (index digest and footer, stream CRCs), the one oracle
every fuzzer uses, and subprocess helpers that measure peak RSS.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
TESTS = HERE.parent
REPO = TESTS.parent
for p in (str(TESTS), str(REPO)):
    if p not in sys.path:
        sys.path.insert(0, p)

import brevis  # noqa: E402
from brevis.archive.format import chunk_digest, stream_check  # noqa: E402
from brevis.archive.index import Chunk, FileEntry, Index, SegmentEntry  # noqa: E402
from brevis.archive.writer import ArchiveWriter  # noqa: E402
from brevis.dsl import encode  # noqa: E402
from brevis.dsl.program import Program  # noqa: E402
from brevis.dsl.types import BYTES, tensor  # noqa: E402
from brevis import dtypes  # noqa: E402
from brevis.errors import BrevisError  # noqa: E402
from helpers import deadline, join, small_checkpoint, split, tree, write_safetensors  # noqa: E402,F401

PTH = REPO / "examples" / "taesd" / "taef2_decoder.pth"
ENV = {**os.environ, "PYTHONPATH": str(REPO)}


def on_first_stream(monkeypatch) -> dict:
    """Hook ArchiveWriter.write_stream: the first stream written (while
    `change` is set) first runs state["change"](), once. Returns the state."""
    original = ArchiveWriter.write_stream
    state = {"change": None}

    def hooked(self, data, crc):
        if state["change"]:
            state["change"](), state.update(change=None)
        return original(self, data, crc)

    monkeypatch.setattr(ArchiveWriter, "write_stream", hooked)
    return state


def reseal_crcs(head: bytes, index: dict) -> dict:
    """Recompute the CRC-32 of every well-formed stream location from `head`,
    so damage in the streams gets past the CRC to the decoders (only the
    chunk digests of the original bytes are left to catch it)."""
    def items(obj, key):
        value = obj.get(key) if isinstance(obj, dict) else None
        return value if isinstance(value, list) else []

    for f in items(index, "files"):
        for s in items(f, "segments"):
            for c in items(s, "chunks"):
                if not (isinstance(c, list) and len(c) == 4 and isinstance(c[2], list)):
                    continue
                for loc in c[2]:
                    if (isinstance(loc, list) and len(loc) == 3 and all(type(v) is int for v in loc)
                            and 0 <= loc[0] <= loc[0] + loc[1] <= len(head)):
                        loc[2] = stream_check(head[loc[0]:loc[0] + loc[1]])
    return index


# ------------------------------------------------------------ seeds
def operator_specs() -> list[tuple[str, str | None, tuple[int, ...] | None, np.ndarray, list]]:
    """(segment name, dtype, shape, values, program JSON): every operator and coder at least once."""
    rng = np.random.default_rng(11)
    raw = ["raw", {}]
    ent = ["zstd", {"level": 1, "strategy": 1, "window_log": 17, "hash_log": 6, "chain_log": 6, "min_match": 7}]
    z3 = ["zstd", {"level": 3, "strategy": 0, "window_log": 0, "hash_log": 0, "chain_log": 0, "min_match": 0}]
    f32 = (rng.standard_normal(256) * 0.05).astype(np.float32).view(np.uint32)
    u16 = rng.integers(0, 1 << 16, 128, dtype=np.uint16)
    rows = np.tile(rng.integers(0, 1 << 16, 16, dtype=np.uint16), 8)
    rows[16:32] = rng.integers(0, 1 << 16, 16, dtype=np.uint16)
    sparse = np.zeros(300, np.uint32)
    sparse[rng.choice(300, 9, replace=False)] = rng.integers(1, 1 << 32, 9, dtype=np.uint32)
    few = rng.choice(np.array([3, 70000, 5, 2**31], np.uint32), 200)
    few[7] = 123456
    q8 = rng.integers(0, 256, 34 * 6, dtype=np.uint8)  # six GGUF Q8_0-like blocks
    return [
        ("float_fields", "F32", (256,), f32, ["float_fields", {"grouping": "e|sm"}, [ent, z3]]),
        ("bit_fields", "U16", (128,), u16, ["bit_fields", {"groups": [[[8, 8]], [[0, 8]]]}, [ent, raw]]),
        ("byte_planes", "F32", (16, 16), f32, ["byte_planes", {}, [raw, ent, ent, raw]]),
        ("low_zero_bits", "I32", (64,), (rng.integers(0, 1 << 20, 64) << 8).astype(np.uint32),
         ["low_zero_bits", {"shift": 8}, [z3]]),
        ("pack_bits", "U8", (100,), rng.integers(0, 256, 100, dtype=np.uint8),
         ["bit_fields", {"groups": [[[4, 4]], [[0, 4]]]}, [["pack_bits", {}, [raw]], ["pack_bits", {}, [ent]]]]),
        ("constant", "I32", (90,), np.full(90, 7, np.uint32), ["constant", {"value": 7}, []]),
        ("delta", "I64", (50,), (np.arange(50, dtype=np.uint64) * 3 + 11), ["delta", {"stride": 1}, [ent]]),
        ("xor_delta", "U16", (128,), u16, ["xor_delta", {"stride": 2}, [raw]]),
        ("zigzag", "I16", (64,), rng.integers(-40, 40, 64).astype(np.int16).view(np.uint16),
         ["zigzag", {}, [ent]]),
        ("transpose", "U16", (16, 8), u16, ["transpose", {"cols": 8}, [z3]]),
        ("affine", "I64", (40,), np.arange(40, dtype=np.uint64) * 5 + 2, ["affine", {"step": 5}, [raw]]),
        ("row_dedup", "F16", (8, 16), rows, ["row_dedup", {"row": 16}, [ent, raw]]),
        ("sparse", "F32", (300,), sparse, ["sparse", {"value": 0}, [raw, ent, raw]]),
        ("rank", "U32", (200,), few, ["rank", {"symbols": [3, 5, 70000, 2**31]}, [ent, raw]]),
        ("partition", "BF16", (128,), u16,
         ["partition", {"context": [[12, 4]], "rest": [[0, 12]], "classes": [[0, 1, 2], [15]]}, [ent, raw, z3, raw]]),
        ("records", None, None, q8, ["records", {"fields": [[1, 2], [32, 1]]}, [raw, ent]]),
        ("bool", "BOOL", (70,), rng.integers(0, 2, 70, dtype=np.uint8), ent),
    ]


def operator_archive(path: Path, chunk_elements: int = 64) -> bytes:
    """Write an archive whose segments run every operator (several chunks each);
    return the original bytes of its one file, `ops.bin`."""
    entry = FileEntry("ops.bin", 0, "bytes")
    original = bytearray()
    with ArchiveWriter(path, force=True) as writer:
        for name, dtype_name, shape, values, spec in operator_specs():
            dtype = dtypes.lookup(dtype_name) if dtype_name else None
            t = tensor(dtype) if dtype else BYTES
            x = np.ascontiguousarray(values).astype(t.container)
            program = Program.from_json(spec)
            program.check(t)
            seg = SegmentEntry(name, dtype, shape, x.nbytes, [program])
            per = chunk_elements
            if name == "records":
                per = 34 * 2  # whole records
            elif name in ("transpose", "row_dedup"):
                per = len(x)
            for start in range(0, len(x), per):
                part = x[start:start + per]
                streams = encode(program, part, t)
                located = [writer.write_stream(s, stream_check(s)) for s in streams]
                digest = chunk_digest(part.view(np.uint8))
                seg.chunks.append(Chunk(0, len(part), located, digest))
            entry.segments.append(seg)
            original += x.view(np.uint8).tobytes()
        entry.size = len(original)
        writer.finish(Index([entry], ["empty/folder"], "robustness seed"))
    return bytes(original)


def checkpoint_source(root: Path, seed: int = 1) -> Path:
    """A small checkpoint whose archive uses many programs (few KB)."""
    src = small_checkpoint(root, seed=seed, elements=1024)
    rng = np.random.default_rng(seed)
    write_safetensors(src / "extra.safetensors", {
        "const": ("F32", (300,), np.full(300, 0.5, np.float32).tobytes()),
        "rows": ("F16", (16, 32), np.tile((rng.standard_normal(32) * .1).astype(np.float16), 16).tobytes()),
        "few": ("I32", (600,), rng.choice([3, -7, 100, 5], 600).astype(np.int32).tobytes()),
        "mask": ("BOOL", (333,), (rng.random(333) < .5).astype(np.uint8).tobytes()),
        "ramp": ("I64", (200,), np.arange(200, dtype=np.int64).tobytes()),
    })
    (src / "blob.bin").write_bytes(bytes(rng.integers(0, 3, 700, dtype=np.uint8)))
    (src / "empty").mkdir()
    return src


class Seeds:
    """Valid archives to mutate, and what each must decode to."""

    def __init__(self, root: Path):
        root.mkdir(parents=True, exist_ok=True)
        self.archives: list[bytes] = []
        self.trees: list[tuple] = []
        for i, seed in enumerate((1, 2)):
            src = checkpoint_source(root / f"src{i}", seed)
            path = root / f"ckpt{i}.brv"
            brevis.compress([src], path, threads=1, chunk_bytes=512)
            self.archives.append(path.read_bytes())
            self.trees.append(tree(src))
        ops = root / "ops.brv"
        original = operator_archive(ops)
        (root / "ops").mkdir(exist_ok=True)
        (root / "ops" / "ops.bin").write_bytes(original)
        (root / "ops" / "empty" / "folder").mkdir(parents=True, exist_ok=True)
        self.archives.append(ops.read_bytes())
        self.trees.append(tree(root / "ops"))


def archive_of(data: bytes, archives: list[bytes], parts: list[tuple[bytes, dict]]) -> tuple[bytes, bool]:
    """What a fuzz input [mode][seed][payload] stands for (see scripts/fuzz_reader.py):
    the archive, and whether a successful decode must give a seed's files exactly."""
    if len(data) < 2:
        return data, True
    mode, k, payload = data[0] % 3, data[1] % len(archives), data[2:]
    if mode == 0:
        return payload, True
    head, index = parts[k]
    if mode == 1:
        return join(head, payload), False
    fixed = reseal_crcs(payload, json.loads(json.dumps(index)))
    return join(payload, fixed), True


# ------------------------------------------------------------ the oracle
STREAM_CHECK = re.compile(r"stream \d+ at offset \d+ is damaged$")


class Unexpected(AssertionError):
    """Something other than a BrevisError, a wrong output, or a write outside the output folder."""


def check_archive(data: bytes, trees: list[tuple], work: Path, exact: bool = True,
                  timeout: int = 20) -> str:
    """Run inspect, verify and decompress on `data`.

    Only BrevisError may come out; verify's "ok" and decompress's success
    must agree, but for a stream whose recorded check is wrong while its
    chunk decodes to its digest (verify checks every stream, decompress a
    chunk's streams only once it fails: the digest guards what comes back);
    nothing may appear in `work` but the archive and the output folder; a
    successful decompress must give one of `trees` exactly when `exact`
    (byte mutations: the index is intact or the archive is refused), else
    at least files whose bytes verify chunk by chunk (index rewrites).
    Returns "error", "reported" (verify listed problems) or "ok".
    """
    for p in work.iterdir():
        _remove(p)
    path = work / "fuzz.brv"
    path.write_bytes(data)
    out = work / "out"
    results = {}
    for name, call in (("inspect", lambda: brevis.inspect(path)),
                       ("verify", lambda: brevis.verify(path, threads=1)),
                       ("decompress", lambda: brevis.decompress(path, out, threads=1))):
        try:
            with deadline(timeout, name):
                results[name] = call()
        except BrevisError as e:
            results[name] = e
        except TimeoutError:
            raise
        except Exception as e:  # noqa: BLE001 - the point of the oracle
            raise Unexpected(f"{name} raised {type(e).__name__}: {e}") from e
    left = sorted(p.name for p in work.iterdir())
    if left not in (["fuzz.brv"], ["fuzz.brv", "out"]):
        raise Unexpected(f"left behind: {left}")
    v, d = results["verify"], results["decompress"]
    if isinstance(v, BrevisError):
        if not isinstance(d, BrevisError):
            raise Unexpected(f"verify refused ({v}) but decompress succeeded")
        return "error"
    failed = isinstance(d, BrevisError)
    if not v["ok"] and not failed:
        if not all(STREAM_CHECK.search(p["error"]) for p in v["problems"]):
            raise Unexpected(f"verify reported {v['problems']} but decompress succeeded")
    elif v["ok"] == failed:
        raise Unexpected(f"verify ok={v['ok']} but decompress gave {d!r}")
    if failed:
        if out.exists():
            raise Unexpected("a failed decompress left its output")
        return "reported"
    got = tree(out)
    if exact and got not in trees:
        raise Unexpected("decompress succeeded with output that matches no original")
    return "ok" if v["ok"] else "reported"


def _remove(p: Path) -> None:
    if p.is_dir() and not p.is_symlink():
        import shutil
        shutil.rmtree(p)
    else:
        p.unlink()


# ------------------------------------------------------------ subprocesses
# A child's ru_maxrss (getrusage, wait4) also counts every memory image the
# process had before its last exec, and a child started by vfork had its
# parent's: measured straight from pytest, a `brevis` process would report
# pytest's own peak. So a small launcher (a bare Python, about 10 MB) starts
# brevis and reports the wait4 rusage of that grandchild.
LAUNCHER = """
import os, subprocess, sys
p = subprocess.Popen(sys.argv[2:])
_, status, usage = os.wait4(p.pid, 0)
with open(sys.argv[1], "w") as f:
    f.write(str(usage.ru_maxrss))
sys.exit(os.waitstatus_to_exitcode(status) % 256)
"""


def run_measured(args: list, timeout: float = 300, cwd=None) -> tuple[int, str, str, int]:
    """Run `python -m brevis ARGS`: (exit code, stdout, stderr, peak RSS in KiB of that process alone)."""
    with tempfile.TemporaryDirectory() as tmp:
        report = os.path.join(tmp, "rss")
        r = subprocess.run([sys.executable, "-c", LAUNCHER, report, sys.executable, "-m", "brevis",
                            *map(str, args)], capture_output=True, text=True, env=ENV, cwd=cwd, timeout=timeout)
        with open(report) as f:
            rss = int(f.read())
    return r.returncode, r.stdout, r.stderr, rss
