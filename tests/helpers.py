"""Helpers shared by the test suite (imported as `helpers`: tests/ is on sys.path)."""

from __future__ import annotations

import ctypes
import hashlib
import json
import mmap
import os
import signal
import struct
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import zstandard

from brevis.archive.format import FOOTER_SIZE, HEADER, HEADER_SIZE, VERSION, Footer, index_digest
from brevis.archive.reader import ArchiveReader
from brevis.dsl import decode, encode
from brevis.dsl.interpreter import leaf_counts
from brevis.dsl.program import Program
from brevis.dsl.types import Field

REPO = Path(__file__).resolve().parent.parent


# ---------------------------------------------------------------- guard pages
@contextmanager
def before_unreadable_page(data: bytes):
    """A view of `data` that ends just before a page that may not be read
    (mprotect): a kernel reading past it crashes the test process."""
    libc = ctypes.CDLL(None)
    libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    page = mmap.PAGESIZE
    pages = (len(data) + page - 1) // page + 1
    with mmap.mmap(-1, pages * page) as m:
        base = ctypes.addressof(ctypes.c_char.from_buffer(m))
        assert libc.mprotect(base + (pages - 1) * page, page, 0) == 0
        start = (pages - 1) * page - len(data)
        m[start:start + len(data)] = data
        view = memoryview(m)[start:start + len(data)]
        try:
            yield view
        finally:
            view.release()
            libc.mprotect(base + (pages - 1) * page, page, 3)  # readable again before unmapping


# ---------------------------------------------------------------- time limits
@contextmanager
def deadline(seconds: int, what: str):
    """Fail instead of hanging (the alarm interrupts Python code between calls)."""
    def expire(signum, frame):
        raise TimeoutError(f"{what}: no answer within {seconds} s")
    old = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


# ---------------------------------------------------------------- processes (Linux /proc)
def descendants(pid: int) -> set[int]:
    """Every process below pid (children, their children, ...)."""
    parents: dict[int, int] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    parents[int(d)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                pass
    out, todo = set(), [pid]
    while todo:
        p = todo.pop()
        for child, parent in parents.items():
            if parent == p and child not in out:
                out.add(child)
                todo.append(child)
    return out


def alive(pids: set[int]) -> set[int]:
    """Those of pids still running (not gone, not zombies)."""
    left = set()
    for p in pids:
        try:
            with open(f"/proc/{p}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] != "Z":
                    left.add(p)
        except OSError:
            pass
    return left


def start_with_workers(cmd: list, env: dict, settle: float = 0.0, group: bool = False):
    """Start cmd; return it once it runs at least two worker processes
    (then after `settle` seconds), with the set of its descendants.
    `group`: in a process group of its own, which it leads (a terminal's
    foreground job, for signal_and_wait's group)."""
    p = subprocess.Popen([sys.executable, *map(str, cmd)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, env=env, process_group=0 if group else None)
    limit = time.monotonic() + 60
    workers: set[int] = set()
    while len(workers) < 2 and p.poll() is None:
        assert time.monotonic() < limit, "no worker processes started"
        workers = descendants(p.pid)
        time.sleep(0.01)
    time.sleep(settle)
    return p, workers | descendants(p.pid)


def signal_and_wait(p, workers: set[int], sig: str, group: bool = False) -> tuple[str, float]:
    """Send SIG<sig> (with `group`, to p's whole process group: the workers
    too, as a terminal sends it); return stderr and the seconds to exit,
    once the workers are gone too (asserted, within 3 s of the exit)."""
    sent = time.monotonic()
    if group:
        os.killpg(p.pid, getattr(signal, f"SIG{sig}"))
    else:
        p.send_signal(getattr(signal, f"SIG{sig}"))
    _, err = p.communicate(timeout=30)
    elapsed = time.monotonic() - sent
    limit = time.monotonic() + 3
    while alive(workers) and time.monotonic() < limit:
        time.sleep(0.05)
    assert not alive(workers), "worker processes outlived the main process"
    return err, elapsed


# ---------------------------------------------------------------- taking archives apart
def split(data: bytes) -> tuple[bytes, dict]:
    """(everything before the index, the index as JSON) of a valid archive."""
    footer = Footer.unpack(data[-FOOTER_SIZE:], len(data))
    stored = data[footer.index_offset:footer.index_offset + footer.index_length]
    raw = zstandard.ZstdDecompressor().decompress(stored, max_output_size=footer.index_raw_length)
    return data[:footer.index_offset], json.loads(raw)


def join(head: bytes, index) -> bytes:
    """An archive with this index (an object or raw JSON bytes), digested and
    located; the digest of the header's version (of the newest where `head`
    is shorter than a header: a fuzzer's, which no reader accepts)."""
    raw = index if isinstance(index, bytes) else json.dumps(index).encode("ascii")
    stored = zstandard.ZstdCompressor(level=1).compress(raw)
    version = HEADER.unpack(head[:HEADER_SIZE])[1] if len(head) >= HEADER_SIZE else VERSION
    return head + stored + Footer(len(head), len(stored), len(raw), index_digest(stored, version)).pack()



def inline_programs(index: dict) -> None:
    """An index's JSON as versions 1 to 8 write it, in place: each
    segment's programs in it, no program table."""
    table = index.pop("programs")
    for f in index["files"]:
        for s in f["segments"]:
            s["programs"] = [table[k] for k in s["programs"]]

# ---------------------------------------------------------------- round trip
def as_bytes(x: np.ndarray) -> bytes:
    """The exact bytes of an array: compare bit patterns, never float values."""
    return np.ascontiguousarray(x).view(np.uint8).tobytes()


def roundtrip(program: Program, t: Field, x: np.ndarray) -> list[bytes]:
    """Encode x (n elements of type t) with program, decode, compare bytes.

    The one round-trip check of the suite. Returns the streams.
    """
    x = np.ascontiguousarray(x)
    assert x.dtype == t.container, f"test bug: {x.dtype} values for {t}"
    expected_streams = program.check(t)
    assert expected_streams == len(program.leaves())
    # A program coded against a base takes the base tensor's elements at the
    # same places; any array of the same length will do: use x reversed.
    reference = x[::-1].copy() if program.uses_reference else None
    streams = encode(program, x, t, reference)
    assert len(streams) == expected_streams
    assert all(isinstance(s, bytes) for s in streams)
    # From writable buffers (an archive in a bytearray or mmap), which
    # decoding must leave as they were: no inverse writes a stream's bytes.
    held = [bytearray(s) for s in streams]
    out = decode(program, t, len(x), [memoryview(b) for b in held], reference)
    assert [bytes(b) for b in held] == streams, f"{program.describe(t)} on {t} wrote into its streams"
    assert out.dtype == t.container
    assert out.shape == (len(x),)
    assert as_bytes(out) == as_bytes(x), f"{program.describe(t)} on {t} changed the bytes"
    # Into a chunk's place, as decompressing does (a root with writes_into
    # rebuilds there; the others are copied in): the same bytes, in `into`.
    # A place is aligned to its elements or not (ONNX puts tensors at any
    # byte of their file): both; a byte root's too (its children may take
    # the place as wider elements: view).
    size = t.container.itemsize
    for shift in (0, 1):
        into = np.full(len(x) * size + shift, 0x5A, dtype=np.uint8)[shift:].view(t.container)
        got = decode(program, t, len(x), [memoryview(s) for s in streams], reference, into)
        assert got is into and as_bytes(into) == as_bytes(x), \
            f"{program.describe(t)} on {t} decoded into a place {shift} bytes off alignment wrongly"
    # With every leaf whose count n decides decoded ahead, as the reader
    # does its `ans` leaves (interpreter.leaves_ahead): the same bytes, and
    # each taken, its count the one read (every operator's child_counts
    # claim holds).
    leaves = program.leaves()
    ready = {at: leaves[at].decode(memoryview(streams[at]), n, lt) for at, n, lt in leaf_counts(program, t, len(x))}
    got = decode(program, t, len(x), [memoryview(s) for s in streams], reference, None, ready)
    assert as_bytes(got) == as_bytes(x), f"{program.describe(t)} on {t} changed the bytes with leaves decoded ahead"
    assert not ready, f"{program.describe(t)} on {t}: leaves {sorted(ready)} decoded ahead with counts not read"
    return streams


# ---------------------------------------------------------------- files
def gguf_str(s: str | bytes) -> bytes:
    """A GGUF string: its length (u64), then its bytes."""
    b = s.encode() if isinstance(s, str) else s
    return struct.pack("<Q", len(b)) + b


def gguf_kv(key: str, vtype: int, payload: bytes) -> bytes:
    """A GGUF metadata entry: key, value type, value."""
    return gguf_str(key) + struct.pack("<I", vtype) + payload


def gguf_array(etype: int, items: list[bytes]) -> bytes:
    """A GGUF array value: item type, count, the items."""
    return struct.pack("<IQ", etype, len(items)) + b"".join(items)


def make_gguf(tensors_: list[tuple[str, int, tuple[int, ...], bytes]], *, alignment: int | None = None,
              version: int = 3, vocabulary: int = 100) -> bytes:
    """A GGUF file of metadata of every value type and tensors_: (name,
    ggml type, dims fastest first, data)."""
    kvs = [
        gguf_kv("general.architecture", 8, gguf_str("llama")),
        gguf_kv("general.name", 8, gguf_str("tiny ✓")),
        gguf_kv("llama.block_count", 4, struct.pack("<I", 2)),
        gguf_kv("llama.rope.freq_base", 6, struct.pack("<f", 10000.0)),
        gguf_kv("llama.flag", 7, b"\x01"),
        gguf_kv("x.u8", 0, b"\x05"), gguf_kv("x.i8", 1, b"\xfb"), gguf_kv("x.u16", 2, b"\x01\x02"),
        gguf_kv("x.i16", 3, b"\x01\x02"), gguf_kv("x.i32", 5, b"\0" * 4), gguf_kv("x.u64", 10, b"\0" * 8),
        gguf_kv("x.i64", 11, b"\0" * 8), gguf_kv("x.f64", 12, b"\0" * 8),
        gguf_kv("tokenizer.ggml.tokens", 9, gguf_array(8, [gguf_str(f"tok{i}") for i in range(vocabulary)])),
        gguf_kv("tokenizer.ggml.scores", 9, gguf_array(6, [struct.pack("<f", -i / 7) for i in range(100)])),
        gguf_kv("tokenizer.ggml.token_type", 9, gguf_array(5, [struct.pack("<i", 1)] * 100)),
        gguf_kv("x.short", 9, gguf_array(5, [struct.pack("<i", 1)] * 3)),
        gguf_kv("x.nested", 9, gguf_array(9, [gguf_array(8, [gguf_str("a"), gguf_str("bc")]), gguf_array(8, [])])),
    ]
    if alignment is not None:
        kvs.append(gguf_kv("general.alignment", 4, struct.pack("<I", alignment)))
    align = alignment or 32
    infos, blob = [], b""
    for name, gtype, dims, data in tensors_:
        blob += b"\0" * (-len(blob) % align)
        infos.append(gguf_str(name) + struct.pack("<I", len(dims)) + struct.pack(f"<{len(dims)}Q", *dims)
                     + struct.pack("<IQ", gtype, len(blob)))
        blob += data
    head = b"GGUF" + struct.pack("<IQQ", version, len(tensors_), len(kvs)) + b"".join(kvs) + b"".join(infos)
    return head + b"\0" * (-len(head) % align) + blob


def write_safetensors(path: Path, tensors: dict[str, tuple[str, tuple[int, ...], bytes]],
                      metadata: dict | None = None) -> None:
    """A safetensors file: tensors maps name -> (dtype name, shape, raw little-endian bytes)."""
    header: dict = {}
    if metadata is not None:
        header["__metadata__"] = metadata
    offset = 0
    for name, (dtype, shape, data) in tensors.items():
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for _, _, data in tensors.values():
            f.write(data)


def f16_layers(path: Path, layers: int, seed: int = 0) -> None:
    """A safetensors file of `layers` F16 weights of 1024 x 2048 (4 MiB each),
    like a model's: normal values, scale 0.02."""
    rng = np.random.default_rng(seed)
    write_safetensors(path, {
        f"layers.{i}.weight": ("F16", (1024, 2048), (rng.standard_normal(1 << 21) * 0.02).astype(np.float16).tobytes())
        for i in range(layers)})


def small_checkpoint(folder: Path, seed: int = 0, elements: int = 2048) -> Path:
    """A folder with a small safetensors file (bf16, f32, i64) and a config.json."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    w = rng.standard_normal(elements).astype(np.float32)
    bf16 = (w.view(np.uint32) >> 16).astype(np.uint16)
    write_safetensors(folder / "model.safetensors", {
        "layer.weight": ("BF16", (elements // 32, 32), bf16.tobytes()),
        "layer.bias": ("F32", (64,), rng.standard_normal(64).astype(np.float32).tobytes()),
        "norm.weight": ("F32", (256,), np.ones(256, np.float32).tobytes()),
        "position_ids": ("I64", (1, 128), np.arange(128, dtype=np.int64).tobytes()),
    }, metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps({"hidden_size": 32, "layers": 1}, indent=2) + "\n")
    return folder


def sha256_file(path: str | os.PathLike) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def tree(root: str | os.PathLike) -> tuple[dict[bytes, str], set[bytes]]:
    """(sha256 of every file, set of empty folders), keyed by relative path bytes."""
    root_b = os.fsencode(root)
    files: dict[bytes, str] = {}
    empty: set[bytes] = set()
    for here, dirs, names in os.walk(root_b):
        rel = os.path.relpath(here, root_b)
        for name in names:
            key = os.path.normpath(os.path.join(rel, name))
            files[key] = sha256_file(os.path.join(here, name))
        if not dirs and not names and rel != b".":
            empty.add(os.path.normpath(rel))
    return files, empty


def listing(folder: str | os.PathLike) -> list[str]:
    return sorted(os.listdir(folder))


def largest_stream(archive: str | os.PathLike, path: str | None = None) -> tuple[int, int, int]:
    """(offset, length, check) of the longest stream of an archive (of its
    file `path`, where given): where a test damages it."""
    with ArchiveReader(archive) as reader:
        files = [f for f in reader.index.files if path is None or f.path == path]
        return max((st for f in files for seg in f.segments for c in seg.chunks for st in c.streams),
                   key=lambda st: st[1])


def second_moments(rng: np.random.Generator, n: int) -> np.ndarray:
    """F32 values that look like an Adam optimizer's second moments:
    positive, spanning decades, neighbours alike (a random walk of logs)."""
    walk = np.cumsum(rng.standard_normal(n) * 0.05)
    return (np.exp(walk - 25) * (1 + 0.01 * rng.standard_normal(n))).astype(np.float32)
