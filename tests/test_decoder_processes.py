"""Decompression in worker processes (codec/chunks.py: DecodeJob, run_jobs).

What must hold: the files are the same whether chunks are decoded inline,
on threads or in worker processes that write them in place, with jobs of
any size; damage found in a worker reaches the caller as the same
BrevisError and leaves nothing behind; an archive coded against a base
decodes on threads; Ctrl-C and SIGTERM during a decompression with worker
processes exit 130 at once with one line, leave no worker and no output.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

import brevis
from brevis.codec import chunks
from brevis.archive.reader import ArchiveReader
from brevis.errors import ChecksumError
from helpers import REPO, f16_layers, largest_stream, signal_and_wait, start_with_workers, write_safetensors

PTH = REPO / "examples" / "taesd" / "taef2_decoder.pth"
ENV = {**os.environ, "PYTHONPATH": str(REPO)}
# sys.argv[0] first: the command's process, its signal handling (brevis._is_command)
RUN = "import sys; sys.argv[0] = 'brevis'; from brevis.__main__ import main; sys.exit(main())"


def tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def archive(tmp_path_factory) -> tuple[Path, Path]:
    """taesd, a tied tensor, a constant, random bytes and an empty file, archived."""
    if not PTH.is_file():
        pytest.skip(f"{PTH} not found")
    tmp = tmp_path_factory.mktemp("decode")
    src = tmp / "src"
    (src / "sub").mkdir(parents=True)
    shutil.copyfile(PTH, src / PTH.name)
    rng = np.random.default_rng(3)
    w = (rng.standard_normal(1 << 20) * 0.02).astype(np.float16).tobytes()
    write_safetensors(src / "sub" / "model.safetensors", {
        "embed.weight": ("F16", (1024, 1024), w),
        "lm_head.weight": ("F16", (1024, 1024), w),
        "norm.weight": ("F32", (4096,), np.ones(4096, np.float32).tobytes()),
        "noise": ("U8", (300_000,), rng.integers(0, 256, 300_000, dtype=np.uint8).tobytes()),
    })
    (src / "empty").write_bytes(b"")
    out = tmp / "a.brv"
    brevis.compress([src], out)
    return src, out


@pytest.mark.parametrize("task_bytes", [1, 1 << 20, chunks.PROCESS_JOB_BYTES])
def test_same_files_in_worker_processes(archive, tmp_path, monkeypatch, task_bytes):
    src, arc = archive
    monkeypatch.setattr(chunks, "PROCESS_JOB_BYTES", task_bytes)
    brevis.decompress(arc, tmp_path / "procs", threads=2, processes=True)
    brevis.decompress(arc, tmp_path / "inline", threads=1)
    assert tree(tmp_path / "procs") == tree(tmp_path / "inline") == tree(src)


@pytest.mark.parametrize("job_bytes, threads", [(chunks.PROCESS_JOB_BYTES, 1), (chunks.THREAD_JOB_BYTES, 2),
                                               (256 << 10, 4)])
def test_tasks_cover_every_chunk_once(archive, tmp_path, job_bytes, threads):
    _, arc = archive
    with ArchiveReader(arc) as reader:
        sink = chunks.CheckOnly()
        tasks = list(chunks.decode_jobs(reader.index, lambda i: sink, job_bytes, threads=threads))
        index = reader.index
        wanted = [(i, s, c) for i, f in enumerate(index.files) for s, seg in enumerate(f.segments)
                  for c in range(len(seg.chunks))]
        assert [(t.file, s, c) for t in tasks for s, c in t.chunks] == wanted
        for t in tasks:  # each task starts where the chunks before it in its file end
            f = index.files[t.file]
            s0, c0 = t.chunks[0]
            before = sum(ch.n * seg.itemsize for s, seg in enumerate(f.segments)
                         for c, ch in enumerate(seg.chunks) if (s, c) < (s0, c0))
            assert t.offset == before
            assert t.start == sum(ch.n * f.segments[s0].itemsize for ch in f.segments[s0].chunks[:c0])


def test_thread_jobs_shrink_towards_the_end(archive, monkeypatch):
    """On more than one thread a job holds what is left over 2 x threads
    (at most job_bytes, at least TAIL_JOB_BYTES), closing at the first
    chunk that reaches it or at its file's end; on one, job_bytes."""
    _, arc = archive
    monkeypatch.setattr(chunks, "TAIL_JOB_BYTES", 64 << 10)
    with ArchiveReader(arc) as reader:
        index = reader.index
        for threads in (1, 2, 3):
            left = index.original_bytes
            sizes = []
            for t in chunks.decode_jobs(index, lambda i: chunks.CheckOnly(), 1 << 20, threads=threads):
                f = index.files[t.file]
                lengths = [f.segments[s].chunks[c].n * f.segments[s].itemsize for s, c in t.chunks]
                target = 1 << 20 if threads == 1 else max(64 << 10, min(1 << 20, left // (2 * threads)))
                last_of_file = t.chunks[-1] == max((s, c) for s, seg in enumerate(f.segments)
                                                   for c in range(len(seg.chunks)))
                assert sum(lengths[:-1]) < target and (sum(lengths) >= target or last_of_file)
                sizes.append(sum(lengths))
                left -= sum(lengths)
            assert left == 0
            if threads > 1:  # the tail is cut finer than the rest
                assert min(sizes[len(sizes) // 2:]) < 1 << 20 <= max(sizes)


def test_damage_found_in_a_worker_leaves_nothing(archive, tmp_path):
    _, arc = archive
    bad = tmp_path / "bad.brv"
    data = bytearray(arc.read_bytes())
    off, length, _ = largest_stream(arc)  # flip a byte inside it
    data[off + length // 2] ^= 0x40
    bad.write_bytes(bytes(data))
    # The worker checks the chunk's streams once it fails: the stream is named.
    with pytest.raises(ChecksumError, match=f"stream [0-9]+ at offset {off} is damaged"):
        brevis.decompress(bad, tmp_path / "out", threads=2, processes=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.brv"]


def test_small_archives_and_bases_decode_on_threads(archive):
    from types import SimpleNamespace as Index

    plain, based = (Index(original_bytes=chunks.PROCESS_MIN_BYTES, base=None, series=None),
                    Index(original_bytes=1 << 40, base={}, series=None))
    assert chunks.decode_workers(Index(original_bytes=chunks.PROCESS_MIN_BYTES - 1, base=None, series=None),
                                 2).executor is None
    assert chunks.decode_workers(plain, 1).executor is None
    assert chunks.decode_workers(based, 3).executor is None
    assert chunks.decode_workers(based, 3, processes=True).executor is None
    # Two threads beat two worker processes at any size; asked for, they start.
    assert chunks.decode_workers(Index(original_bytes=1 << 40, base=None, series=None), 2).executor is None
    with chunks.decode_workers(plain, 2, processes=True) as workers:
        assert workers is not None
    with chunks.decode_workers(plain, chunks.PROCESS_MIN_THREADS) as workers:
        assert workers is not None
    # A member of a training run: each worker finds its predecessor itself.
    member = Index(original_bytes=1 << 40, base={}, series={"previous": {"archive": "a.brv", "content": "0" * 32}})
    with chunks.decode_workers(member, chunks.PROCESS_MIN_THREADS) as workers:
        assert workers is not None


def test_base_archive_with_processes_requested(tmp_path):
    rng = np.random.default_rng(5)
    w = (rng.standard_normal(1 << 18) * 0.02).astype(np.float32)
    write_safetensors(tmp_path / "base.safetensors", {"w": ("F32", (512, 512), w.tobytes())})
    tuned = w.copy()
    tuned[::7] = (tuned[::7].view(np.uint32) ^ np.uint32(1)).view(np.float32)  # a few low bits change
    (tmp_path / "tuned").mkdir()
    write_safetensors(tmp_path / "tuned" / "model.safetensors", {"w": ("F32", (512, 512), tuned.tobytes())})
    brevis.compress([tmp_path / "tuned"], tmp_path / "t.brv", base=tmp_path / "base.safetensors")
    brevis.decompress(tmp_path / "t.brv", tmp_path / "out", threads=2, processes=True,
                      base=tmp_path / "base.safetensors")
    assert tree(tmp_path / "out") == tree(tmp_path / "tuned")


# ------------------------------------------------------------------ signals
@pytest.fixture(scope="module")
def big_archive(tmp_path_factory) -> Path:
    """An archive of 48 MiB of original bytes: decoded by worker processes at -j3."""
    tmp = tmp_path_factory.mktemp("big")
    src = tmp / "src"
    src.mkdir()
    f16_layers(src / "gen.safetensors", 12)
    out = tmp / "big.brv"
    brevis.compress([src], out, effort=1, threads=2)
    return out


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("sig,group", [("INT", False), ("TERM", False), ("HUP", True)])  # HUP: a closed terminal's
def test_signal_while_decoding_in_worker_processes(big_archive, tmp_path, sig, group):
    out = tmp_path / "out"
    p, workers = start_with_workers(["-c", RUN, "decompress", big_archive, "-o", out, "-j", "3", "-q"], ENV,
                                    group=group)
    err, elapsed = signal_and_wait(p, workers, sig, group=group)
    if p.returncode == 0:
        pytest.skip("the run ended before the signal")
    assert p.returncode == 130, (p.returncode, err)
    assert err.strip() == "brevis: interrupted", err
    assert elapsed < 5, f"{elapsed:.2f} s from SIG{sig} to exit"
    assert list(tmp_path.iterdir()) == []


def test_verify_in_worker_processes_reports_like_threads(archive, tmp_path, monkeypatch):
    src, arc = archive
    monkeypatch.setattr(chunks, "PROCESS_JOB_BYTES", 1 << 20)
    clean = brevis.verify(arc, [src], threads=2, processes=True)
    assert clean["ok"] and clean["problems"] == []
    # Damage every kind of way: a stream, a changed source file, a longer
    # one, a missing one and an extra one.
    bad = tmp_path / "bad.brv"
    data = bytearray(arc.read_bytes())
    off, length, _ = largest_stream(arc)
    data[off + length // 3] ^= 0x01
    bad.write_bytes(bytes(data))
    other = tmp_path / "src"
    shutil.copytree(src, other)
    model = other / "sub" / "model.safetensors"
    raw = bytearray(model.read_bytes())
    raw[-5] ^= 0x80
    model.write_bytes(bytes(raw))
    with open(other / PTH.name, "ab") as f:
        f.write(b"\0")
    (other / "empty").unlink()
    (other / "extra.txt").write_text("new\n")
    by_threads = brevis.verify(bad, [other], threads=2, processes=False)
    by_processes = brevis.verify(bad, [other], threads=2, processes=True)
    assert not by_threads["ok"] and len(by_threads["problems"]) >= 5
    assert by_processes["problems"] == by_threads["problems"]
