"""ArchiveReader: batched decoding into places of any alignment, and an
archive read from memory as from its file."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import brevis
from brevis.archive import reader as reader_module
from brevis.archive.reader import MEMORY, ArchiveReader
from brevis.dsl.coders import thread_decompressor
from helpers import make_gguf, write_safetensors


def compressed(root, tensors: dict, **options):
    """An archive of one safetensors file of `tensors`, made in `root`."""
    write_safetensors(root / "m.safetensors", tensors)
    brevis.compress([root / "m.safetensors"], root / "m.brv", **options)
    return root / "m.brv"


@pytest.fixture(scope="module")
def archive(tmp_path_factory):
    rng = np.random.default_rng(2)
    return compressed(tmp_path_factory.mktemp("reader"), {
        "a": ("F32", (3000,), (rng.standard_normal(3000) * 0.05).astype(np.float32).tobytes()),
        "b": ("F16", (5001,), (rng.standard_normal(5001) * 0.1).astype(np.float16).tobytes()),
        "c": ("BF16", (64, 40), (rng.standard_normal(2560).astype(np.float32).view(np.uint32) >> 16)
              .astype(np.uint16).tobytes()),
    }, chunk_bytes=4096)


def chunks(reader):
    for f in reader.index.files:
        for seg in f.segments:
            for chunk in seg.chunks:
                yield seg, chunk


@pytest.mark.parametrize("shift", [0, 1, 2, 3])
def test_batched_chunks_decode_into_places_of_any_alignment(archive, shift):
    """A place at an odd offset (ONNX puts tensors there) gets the same bytes
    as decode_chunk gives, from a batch as alone."""
    with ArchiveReader(archive) as reader:
        work = list(chunks(reader))
        want = [bytes(reader.decode_chunk(seg, chunk)) for seg, chunk in work]
        total = sum(len(w) for w in want)
        buffer = np.zeros(total + shift, np.uint8)[shift:]
        items, at = [], 0
        for (seg, chunk), w in zip(work, want):
            items.append((seg, chunk, None, buffer[at: at + len(w)], None))
            at += len(w)
        got = reader.decode_chunks(items)
        assert [bytes(g) for g in got] == want
        assert bytes(buffer) == b"".join(want)


def test_an_archive_in_memory_reads_as_its_file(archive):
    data = archive.read_bytes()
    with ArchiveReader(archive) as on_disk, ArchiveReader(MEMORY, data) as in_memory:
        assert in_memory.in_memory and not on_disk.in_memory
        assert in_memory.index.original_bytes == on_disk.index.original_bytes
        assert [bytes(in_memory.decode_chunk(s, c)) for s, c in chunks(in_memory)] == \
               [bytes(on_disk.decode_chunk(s, c)) for s, c in chunks(on_disk)]


def test_an_archive_in_a_writable_buffer_is_read_only_and_left_as_it_is(archive):
    """An archive handed over in a bytearray: the reader's views of it are
    read-only (a raw leaf's value is one), and unpacking leaves it as it was."""
    data = bytearray(archive.read_bytes())
    before = bytes(data)
    with ArchiveReader(MEMORY, data) as reader:
        assert reader.read(0, 16).readonly
    files = brevis.unpack(data)
    assert bytes(data) == before and files


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    """Two tensors coded by one `ans` leaf (batched) around a bias stored raw (decoded alone)."""
    rng = np.random.default_rng(3)
    return compressed(tmp_path_factory.mktemp("mixed"), {
        "w1": ("F16", (65536,), (rng.standard_normal(65536) * 0.02).astype(np.float16).tobytes()),
        "bias": ("F32", (8,), rng.standard_normal(8).astype(np.float32).tobytes()),
        "w2": ("F16", (65536,), (rng.standard_normal(65536) * 0.03).astype(np.float16).tobytes()),
    })


def _mixed_work(reader):
    work = [(seg, chunk) for seg, chunk in chunks(reader) if seg.name in ("w1", "bias", "w2")]
    assert [str(seg.programs[c.program].node) for seg, c in work] == ["ans", "raw", "ans"]
    return work


def test_chunks_decoded_alone_leave_the_batch_open(mixed):
    """A chunk decoded on its own between batched ones: every chunk's bytes as decode_chunk gives them."""
    with ArchiveReader(mixed) as reader:
        work = _mixed_work(reader)
        want = [bytes(reader.decode_chunk(seg, chunk)) for seg, chunk in work]
        got = reader.decode_chunks([(seg, chunk, None, None, None) for seg, chunk in work])
        assert [bytes(g) for g in got] == want


def test_the_first_damaged_chunk_is_told_before_a_later_one_decoded_alone(mixed):
    """w1 (batched, still pending) and the bias after it (decoded at once) both
    fail their digests: the error names w1, the first."""
    import dataclasses

    from brevis.errors import ChecksumError

    with ArchiveReader(mixed) as reader:
        work = [(seg, dataclasses.replace(chunk, digest=bytes(16))) for seg, chunk in _mixed_work(reader)]
        with pytest.raises(ChecksumError, match="'w1'"):
            reader.decode_chunks([(seg, chunk, None, None, None) for seg, chunk in work])
        with pytest.raises(ChecksumError, match="'bias'"):
            reader.decode_chunks([(seg, chunk, None, None, None) for seg, chunk in work[1:]])


@pytest.fixture(scope="module")
def quantized(tmp_path_factory):
    """Q8_0 tensors of a GGUF file in chunks of 8 KiB: each chunk's program is
    records over two `ans` leaves (scales, quants), which decode ahead."""
    rng = np.random.default_rng(5)

    def q8_0(blocks: int) -> bytes:
        scales = (rng.random(blocks) * 0.01 + 0.001).astype(np.float16).view(np.uint8).reshape(-1, 2)
        quants = np.clip(np.round(rng.standard_normal((blocks, 32)) * 30), -127, 127).astype(np.int8)
        return np.concatenate([scales, quants.view(np.uint8)], axis=1).tobytes()

    root = tmp_path_factory.mktemp("quantized")
    (root / "m.gguf").write_bytes(make_gguf([(f"blk.{i}.w", 8, (256, 64), q8_0(512)) for i in range(6)]))
    brevis.compress([root / "m.gguf"], root / "m.brv", chunk_bytes=8192)
    return root / "m.brv"


def _quantized_work(reader):
    work = [(seg, chunk) for seg, chunk in chunks(reader)
            if seg.programs[chunk.program].describe(seg.value_type).endswith("[field0: ans, field1: ans]")]
    assert len(work) >= 8
    return work


def test_leaves_of_many_chunks_decode_ahead_in_one_call(quantized, monkeypatch):
    """The scales and quants of every chunk decode in one call of the C
    decoder, and each chunk's bytes are decode_chunk's."""
    from brevis.dsl import entropy

    calls = []
    decode_streams = entropy._rans.decode_streams
    monkeypatch.setattr(entropy, "_rans", type("Spy", (), {
        **{name: staticmethod(getattr(entropy._rans, name)) for name in dir(entropy._rans) if not name.startswith("_")},
        "decode_streams": staticmethod(lambda items: calls.append(len(items)) or decode_streams(items))}))
    with ArchiveReader(quantized) as reader:
        work = _quantized_work(reader)
        want = [bytes(reader.decode_chunk(seg, chunk)) for seg, chunk in work]
        stored = reader.read_runs([chunk for _, chunk in work])
        calls.clear()
        got = reader.decode_chunks([(seg, chunk, None, None, s) for (seg, chunk), s in zip(work, stored)])
        assert [bytes(g) for g in got] == want
        assert calls == [2 * len(work)]


@pytest.mark.parametrize("victim", [0, 3])
def test_a_damaged_leaf_decoded_ahead_is_told_as_decode_chunk_tells_it(quantized, victim):
    """A chunk's stream damaged among those decoded ahead: the error is the
    one decode_chunk gives for that chunk alone (its stream named), not a
    failure of the call they shared."""
    from brevis.errors import BrevisError

    with ArchiveReader(quantized) as reader:
        work = _quantized_work(reader)
        stored = reader.read_runs([chunk for _, chunk in work])
        damaged = bytearray(stored[victim][1])
        damaged[len(damaged) // 2] ^= 0x40
        stored[victim] = [stored[victim][0], memoryview(bytes(damaged))]
        seg, chunk = work[victim]
        with pytest.raises(BrevisError) as alone:
            reader.decode_chunk(seg, chunk, stored=stored[victim])
        with pytest.raises(type(alone.value), match="stream 1 .* is damaged") as together:
            reader.decode_chunks([(seg, chunk, None, None, s) for (seg, chunk), s in zip(work, stored)])
        assert str(together.value) == str(alone.value)


def test_the_index_and_the_zstd_leaves_share_the_threads_decompressor(archive, monkeypatch):
    """One zstd context a thread, made once (a fresh one is fresh pages):
    the reader decompresses its index with the one the zstd leaves use,
    and another thread has its own (a context is not thread-safe)."""
    mine = thread_decompressor()
    assert thread_decompressor() is mine
    asked = []
    monkeypatch.setattr(reader_module, "thread_decompressor", lambda: asked.append(1) or thread_decompressor())
    monkeypatch.setattr(reader_module, "_last_index", None)  # read, not found read already
    with ArchiveReader(archive) as reader:
        assert reader.index.files and asked == [1]
    theirs = []
    worker = threading.Thread(target=lambda: theirs.append(thread_decompressor()))
    worker.start()
    worker.join()
    assert theirs[0] is not mine
