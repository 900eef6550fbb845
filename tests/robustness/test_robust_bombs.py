"""Decompression bombs: what an archive may declare, and what it costs to refuse it.

Limits (brevis/archive/format.py, docs/FORMAT.md):
- a chunk holds at most 64 MiB of original bytes (MAX_CHUNK_BYTES): no
  declared size makes a reader allocate more than that per chunk, and at
  most 2 x threads chunks are in flight;
- the index is at most 1 GiB of JSON (MAX_INDEX_BYTES), checked from the
  footer before anything is decompressed;
- decompress compares the total the index declares with the free space of
  the output's filesystem before it writes anything.
Peak RSS is measured per child process with wait4.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import zstandard

import brevis
from brevis.archive import format as fmt
from brevis.archive.index import Chunk, FileEntry, Index, SegmentEntry
from brevis.archive.reader import ArchiveReader
from brevis.archive.writer import ArchiveWriter
from brevis.dsl.program import Program
from brevis.errors import BrevisError, FormatError
from robust_util import join, run_measured, split

MiB = 1 << 20
ZSTD = ["zstd", {"level": 3, "strategy": 0, "window_log": 0, "hash_log": 0, "chain_log": 0, "min_match": 0}]
BASELINE_KB = 100_000  # Python, numpy, zstandard and Brevis imported: about 37 MiB; leave room


def test_documented_limits():
    assert fmt.MAX_CHUNK_BYTES == 64 * MiB
    assert fmt.MAX_INDEX_BYTES == 1 << 30


def bytes_archive(path: Path, total: int, chunk: int, stream: bytes, digest: bytes, name: str = "huge.bin") -> None:
    """One file of `total` bytes in chunks of `chunk` bytes, every chunk naming the same one stream."""
    program = Program.from_json(ZSTD)
    with ArchiveWriter(path, force=True) as w:
        where = w.write_stream(stream, fmt.stream_check(stream))
        seg = SegmentEntry("", None, None, total, [program])
        seg.chunks = [Chunk(0, chunk, [where], digest) for _ in range(total // chunk)]
        w.finish(Index([FileEntry(name, total, "bytes", [seg])], [], "bomb"))


@pytest.fixture(scope="module")
def terabyte(tmp_path_factory) -> Path:
    """A 1 MB archive declaring a file of 1 TiB (or twice the free space, if more):
    64 MiB chunks pointing at one 4 KB zstd stream that holds 1 MiB."""
    root = tmp_path_factory.mktemp("bombs")
    total = max(1 << 40, 2 * shutil.disk_usage(root).free)
    total = -(-total // (64 * MiB)) * 64 * MiB
    if total // (64 * MiB) > 100_000:
        pytest.skip("too much free disk to declare more than it in a small index")
    stream = zstandard.ZstdCompressor().compress(np.random.default_rng(0).integers(0, 4, MiB, dtype=np.uint8).tobytes())
    path = root / "tera.brv"
    bytes_archive(path, total, 64 * MiB, stream, bytes(16))
    assert path.stat().st_size < 4 * MiB
    return path


def test_decompress_of_a_declared_terabyte_is_refused_before_writing(terabyte, tmp_path):
    rc, out, err, rss = run_measured(["decompress", terabyte, "-o", tmp_path / "out"])
    assert rc == 8, err
    assert "free on disk" in err and len(err.strip().splitlines()) == 1
    assert list(tmp_path.iterdir()) == []
    assert rss < BASELINE_KB, f"{rss} KiB"
    print(f"decompress of a declared {brevis.inspect(terabyte)['original_bytes'] >> 30} GiB: refused, peak RSS {rss / 1024:.0f} MiB")


def test_verify_of_a_declared_terabyte_stays_small(terabyte):
    """Every chunk's stream declares 1 MiB where 64 MiB are expected: each is
    refused from the zstd frame header, before any 64 MiB buffer exists."""
    rc, out, err, rss = run_measured(["verify", terabyte, "-q", "-j", "4"], timeout=300)
    assert rc == 6, err
    assert "Traceback" not in err
    assert rss < BASELINE_KB, f"{rss} KiB"
    print(f"verify of a declared terabyte: every chunk refused, peak RSS {rss / 1024:.0f} MiB")


def test_inspect_of_a_declared_terabyte(terabyte):
    rc, out, err, rss = run_measured(["inspect", terabyte, "--json"])
    assert rc == 0, err
    assert rss < BASELINE_KB + 100_000


def test_chunk_over_the_limit_is_refused_before_decoding(tmp_path, monkeypatch):
    stream = zstandard.ZstdCompressor().compress(bytes(1024))
    path = tmp_path / "big-chunk.brv"
    with pytest.raises(BrevisError, match="readers would refuse it"):  # the writer checks first (issue 16)
        bytes_archive(path, 64 * MiB + 1, 64 * MiB + 1, stream, bytes(16))
    monkeypatch.setattr(ArchiveWriter, "_check_readable", lambda *a: None)  # as a hostile writer would
    bytes_archive(path, 64 * MiB + 1, 64 * MiB + 1, stream, bytes(16))
    with pytest.raises(FormatError, match="out of bounds"):
        ArchiveReader(path)
    rc, out, err, rss = run_measured(["verify", path])
    assert rc == 3 and "out of bounds" in err
    assert rss < BASELINE_KB
    print(f"chunk over 64 MiB: refused, peak RSS {rss / 1024:.0f} MiB")


@pytest.mark.parametrize("threads", [1, 4])
def test_memory_of_legitimate_64_mib_chunks_is_bounded(tmp_path, threads):
    """A real bomb, within the rules: 512 MiB of zeros in a 5 KB archive
    (8 chunks of 64 MiB, one 2 KB zstd stream). Decoding holds at most
    2 x threads chunks at once: about 64 MiB x (2 x threads + 2) at worst."""
    zeros = bytes(64 * MiB)
    stream = zstandard.ZstdCompressor(level=19).compress(zeros)
    path = tmp_path / "zeros.brv"
    bytes_archive(path, 8 * 64 * MiB, 64 * MiB, stream, fmt.chunk_digest(zeros))
    assert path.stat().st_size < 16_000
    rc, out, err, rss = run_measured(["verify", path, "-q", "-j", threads])
    assert rc == 0, err
    bound = BASELINE_KB + 64 * 1024 * (2 * threads + 2)
    assert rss < bound, f"verify -j {threads}: {rss} KiB, bound {bound} KiB"
    print(f"verify -j {threads} of 512 MiB in 64 MiB chunks: peak RSS {rss / 1024:.0f} MiB")


def test_lying_zstd_frame_header_costs_at_most_one_chunk(tmp_path):
    """A frame header claiming more content than the frame holds: refused, and the
    buffer it may cost is bounded by the chunk (64 MiB)."""
    frame = zstandard.ZstdCompressor().compress(bytes(64 * MiB))
    path = tmp_path / "lie.brv"
    # The real frame's header declares 64 MiB; cut it short so the blocks end early.
    bytes_archive(path, 4 * 64 * MiB, 64 * MiB, frame[: len(frame) // 2], bytes(16))
    rc, out, err, rss = run_measured(["verify", path, "-q", "-j", "1"])
    assert rc == 6, err
    assert rss < BASELINE_KB + 2 * 64 * 1024
    print(f"lying frame headers: peak RSS {rss / 1024:.0f} MiB")


@pytest.mark.slow
def test_index_of_one_gib_of_whitespace(tmp_path):
    """1 GiB of JSON whitespace in a 35 KB archive: it cost two copies of the
    index (bytes, then text) and seconds of parsing before it was refused.
    Refused from the footer now (issue 16): an index may declare 16 MiB of
    JSON plus 8 bytes per byte of the archive."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "a").write_bytes(b"a")
    brevis.compress([src], tmp_path / "a.brv")
    head, _ = split((tmp_path / "a.brv").read_bytes())
    raw = b" " * ((1 << 30) - 2) + b"{}"
    path = tmp_path / "whitespace.brv"
    path.write_bytes(join(head, raw))
    del raw
    assert path.stat().st_size < 100_000
    import time
    t = time.perf_counter()
    rc, out, err, rss = run_measured(["inspect", path])
    seconds = time.perf_counter() - t
    assert rc == 3 and "may hold" in err, err
    print(f"1 GiB whitespace index ({path.stat().st_size} bytes): refused in {seconds:.1f} s, peak RSS {rss / 1024:.0f} MiB")
    assert rss < BASELINE_KB, f"{rss} KiB"


def test_the_largest_index_a_small_archive_may_declare(tmp_path):
    """16 MiB of JSON whitespace, the most a small archive may declare: read, parsed, refused (no 'files')."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "a").write_bytes(b"a")
    brevis.compress([src], tmp_path / "a.brv")
    head, _ = split((tmp_path / "a.brv").read_bytes())
    path = tmp_path / "whitespace.brv"
    path.write_bytes(join(head, b" " * (fmt.FREE_INDEX_BYTES - 2) + b"{}"))
    rc, out, err, rss = run_measured(["inspect", path])
    assert rc == 3 and "lacks" in err, err
    assert rss < BASELINE_KB + 2 * 16 * 1024, f"{rss} KiB"
