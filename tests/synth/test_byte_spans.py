"""Byte spans no parser typed: the planner measures zstd's levels, the
bytes read as words and LZMA on the span, and takes LZMA only where it is
clearly smaller (it decodes about 20 times slower than `ans`)."""

from __future__ import annotations

import json
import lzma

import numpy as np
import zstandard
import pytest

import brevis
from brevis.archive.reader import ArchiveReader

RNG = np.random.default_rng(13)


def made_up_format(arrays: int = 24) -> bytes:
    """Names, lengths and F32 arrays at odd offsets, each padded with zeros
    to 256 bytes; a third of the arrays repeat earlier ones (tied weights)."""
    parts, kernels = [b"MADEUP\x00\x02"], []
    for i in range(arrays):
        if i % 3 == 2:
            w = kernels[i // 3 % len(kernels)]
        else:
            w = (RNG.standard_normal(int(RNG.integers(2000, 6000))) * 0.05).astype(np.float32)
            kernels.append(w)
        name = f"layers.{i}.conv.weight".encode()
        parts += [bytes([len(name)]), name, w.size.to_bytes(4, "little"), w.tobytes()]
        parts.append(bytes(-sum(map(len, parts)) % 256))
    return b"".join(parts)


def vocabulary(n: int = 80000) -> bytes:
    """A tokenizer's vocabulary as JSON: strings with shared prefixes."""
    stems = ["tion", "ing", "ment", "er", "ly", "ness", "able", "ous"]
    words = {f"{chr(97 + i % 26)}{chr(97 + i // 26 % 26)}{stems[i % len(stems)]}{i}": i for i in range(n)}
    return json.dumps({"model": {"type": "BPE", "vocab": words}}).encode()


def programs(archive) -> list:
    with ArchiveReader(archive) as reader:
        return [p.to_json()[0] for f in reader.index.files for s in f.segments for p in s.programs]


def stored(archive) -> int:
    """The bytes the archive's segments take, its index and framing aside."""
    return sum(s["stored_bytes"] for f in brevis.inspect(archive)["files"] for s in f["segments"])


def archive_of(data: bytes, tmp_path, name: str):
    path = tmp_path / name
    path.write_bytes(data)
    out = tmp_path / (name + ".brv")
    brevis.compress([path], out)
    assert brevis.verify(out, sources=[path])["ok"]
    return out


@pytest.mark.parametrize("make", [made_up_format, vocabulary], ids=["made-up-format", "vocabulary"])
def test_an_unknown_format_is_no_larger_than_xz(make, tmp_path):
    """On text LZMA is all there is to find: the stream is xz's, less its
    container (the archive adds its index, some hundred bytes)."""
    data = make()
    out = archive_of(data, tmp_path, "blob")
    assert "lzma" in programs(out)
    assert stored(out) <= len(lzma.compress(data, preset=6))


def test_lzma_spans_take_long_chunks(tmp_path):
    """A 1.7 MB vocabulary is one chunk, not two of 1 MiB: its window then
    reaches as far as xz -6's."""
    data = vocabulary()
    out = archive_of(data, tmp_path, "vocab.json")
    (entry,) = [s for f in brevis.inspect(out)["files"] for s in f["segments"]]
    assert entry["chunks"] == 1


def test_bare_floats_keep_a_fast_coder(tmp_path):
    """Aligned F32 arrays behind a short header: the bytes read as words
    win, and LZMA (slower to decode) is not taken."""
    data = b"\x07" * 3 + (RNG.standard_normal(1 << 18) * 0.02).astype(np.float32).tobytes()
    out = archive_of(data, tmp_path, "floats.bin")
    assert "lzma" not in programs(out)
    assert out.stat().st_size < len(lzma.compress(data, preset=6))


def test_a_parsed_files_spans_never_take_lzma(tmp_path):
    """In a parsed file the byte spans are headers and framing: they are
    left to zstd and the word views at every effort (LZMA would cost its
    time for a small share of the file)."""
    from safetensors.numpy import save_file

    path = tmp_path / "model.safetensors"
    save_file({"w": (RNG.standard_normal((256, 256)) * 0.02).astype(np.float32)}, str(path),
              metadata={"vocab": vocabulary(20000).decode()})
    (tmp_path / "vocab.json").write_text(vocabulary(20000).decode())
    for effort in (2, 3):
        out = tmp_path / f"e{effort}.brv"
        brevis.compress([path], out, effort=effort)
        assert brevis.verify(out, sources=[path])["ok"]
        assert "lzma" not in programs(out)
    # the same text in a file of its own (no parser) takes it
    out = archive_of(vocabulary(20000), tmp_path, "alone.json")
    assert "lzma" in programs(out)


def test_a_short_span_of_floats_takes_ans_on_its_words(tmp_path):
    """A span too short to search (a norm's weights, a bias cut out as a
    repeat) in a file no parser knows: `ans` on its F32 words where that is
    smaller than zstd, as a short parsed tensor gets."""
    w = (RNG.standard_normal(750) * 0.02).astype(np.float32)
    path = tmp_path / "norm.bin"
    path.write_bytes(w.tobytes())
    out = tmp_path / "norm.brv"
    brevis.compress([path], out)
    with ArchiveReader(out) as r:
        (seg,) = [s for f in r.index.files for s in f.segments]
        assert [p.to_json() for p in seg.programs] == [["view", {"dtype": "F32"}, [["ans", {}]]]]
        assert seg.stored < len(zstandard.ZstdCompressor(level=3).compress(w.tobytes()))
    brevis.decompress(out, tmp_path / "out")
    assert (tmp_path / "out").read_bytes() == w.tobytes() if (tmp_path / "out").is_file() else \
        (tmp_path / "out" / "norm.bin").read_bytes() == w.tobytes()


def test_lzma_must_win_by_the_efforts_margin():
    """LZMA decodes 10-40x slower than the fast coders: up to the default
    effort it must code a span 5 % smaller than they do, at the highest
    0.5 %."""
    from brevis.synth.planner import LZMA_MARGIN, LZMA_MARGIN_MOST, effort, lzma_wins

    text = vocabulary()
    read = lambda off, n: text[off: off + n]  # noqa: E731
    assert lzma_wins(read, [(0, len(text))], margin=LZMA_MARGIN)  # text: far ahead
    assert not lzma_wins(read, [(0, len(text))], margin=0.9)
    assert [effort(e).lzma_margin for e in (0, 1, 2, 3)] == [LZMA_MARGIN] * 3 + [LZMA_MARGIN_MOST]
    assert LZMA_MARGIN_MOST < LZMA_MARGIN


def test_lzma_trials_on_threads_measure_as_on_one():
    """LZMA's trials code their literal contexts (and a span's windows)
    side by side on threads: the same sizes, so the same choices, as one
    after another, whether LZMA wins (text) or loses (floats), on little
    (all contexts on everything) and on more than LZMA_CONTEXT_BYTES (the
    two best on the middles, then on everything). On one thread lzma_wins
    stops at the first context under its bound: the same answers."""
    from brevis.dsl.types import BYTES
    from brevis.synth.planner import LZMA_CONTEXT_BYTES, LZMA_MARGIN, LZMA_TRIALS, _lzma_best, _sizes, lzma_wins

    floats = (RNG.standard_normal(1 << 16) * 0.02).astype(np.float32).tobytes()
    answers = []
    for data, threads in ((vocabulary(6000), 2), (vocabulary(16000), 3), (floats, 2)):
        x = np.frombuffer(data, np.uint8)
        pieces = [x[: len(x) // 3], x[len(x) // 3:]]
        assert _lzma_best(pieces, BYTES, threads) == _lzma_best(pieces, BYTES)
        apart = [(p, [x]) for p, x in zip(LZMA_TRIALS[:2], pieces)]
        assert _sizes(apart, BYTES, threads) == _sizes(apart, BYTES, 1)
        read = lambda off, n, data=data: data[off: off + n]  # noqa: E731
        spans = [(0, len(data) // 2), (len(data) // 2, len(data) - len(data) // 2)]
        answers.append(lzma_wins(read, spans, LZMA_MARGIN))
        assert lzma_wins(read, spans, LZMA_MARGIN, threads) == answers[-1]
    assert answers == [True, True, False]
    assert len(vocabulary(16000)) > LZMA_CONTEXT_BYTES > len(vocabulary(6000))
    assert lzma_wins(lambda off, n: floats[off: off + n], [(0, len(floats))], LZMA_MARGIN, 2) is False


def test_files_no_parser_knows_give_the_same_archive_on_any_threads(tmp_path):
    """Discovery measures each unparsed span on threads, or in the worker
    processes, and a planner on one thread lets LZMA's trials take threads:
    the archive is the same to the byte at -j1, at -j2 on threads and at
    -j2 with worker processes (several unparsed files, text and numbers)."""
    sources = []
    for name, data in (("a.bin", made_up_format(12)), ("vocab.json", vocabulary(12000)),
                       ("b.bin", made_up_format(6) + vocabulary(3000))):
        (tmp_path / name).write_bytes(data)
        sources.append(tmp_path / name)
    archives = []
    for threads, processes in ((1, False), (2, None), (2, True)):
        out = tmp_path / f"j{threads}-{processes}.brv"
        brevis.compress(sources, out, threads=threads, processes=processes)
        archives.append(out.read_bytes())
    assert archives[0] == archives[1] == archives[2]
    assert "lzma" in programs(out)
