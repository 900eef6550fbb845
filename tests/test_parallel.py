"""Chunk jobs in worker processes (workers/tasks.py, processes.py, shared.py, codec/encoder.py).

What must hold: the archive is the same byte for byte whether chunks are
encoded inline, on threads, on worker processes or on a caller's executor,
in batches of any size, with duplicated chunks and with a base (a folder,
whose bytes workers read by path, or an archive, whose bytes travel with
the job); a task is picklable and reads its own bytes; errors raised in a
worker reach the caller as the same BrevisError; Ctrl-C, SIGTERM and
SIGKILL leave no worker process behind and (for the first two) exit 130
at once with one line.
"""

from __future__ import annotations

import os
import pickle
import shutil
import signal
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

import brevis
from brevis.codec import encoder
from brevis.workers import tasks as jobs
from brevis.errors import InvalidArgument, IOFailure
from brevis.workers import shared
from brevis.workers.pool import runs
from brevis.workers.processes import WorkerProcesses
from helpers import REPO, f16_layers, signal_and_wait, start_with_workers, write_safetensors

PTH = REPO / "examples" / "taesd" / "taef2_decoder.pth"
ENV = {**os.environ, "PYTHONPATH": str(REPO)}


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    """taesd, a tensor tied to another (duplicate chunks), constant and random tensors, config text."""
    if not PTH.is_file():
        pytest.skip(f"{PTH} not found")
    src = tmp_path_factory.mktemp("parallel") / "src"
    src.mkdir()
    shutil.copyfile(PTH, src / PTH.name)
    rng = np.random.default_rng(1)
    w = (rng.standard_normal(1 << 20) * 0.02).astype(np.float16).tobytes()  # 2 MiB: two chunks
    write_safetensors(src / "model.safetensors", {
        "embed.weight": ("F16", (1024, 1024), w),
        "lm_head.weight": ("F16", (1024, 1024), w),  # tied: stored once
        "norm.weight": ("F32", (4096,), np.ones(4096, np.float32).tobytes()),
        "noise": ("U8", (300_000,), rng.integers(0, 256, 300_000, dtype=np.uint8).tobytes()),
    })
    (src / "config.json").write_text('{"tie_word_embeddings": true}\n')
    return src


def archive_bytes(tmp: Path, name: str, src, **kw) -> bytes:
    out = tmp / f"{name}.brv"
    s = encoder.compress([src], out, **kw)
    assert s["encode_processes"] == 1
    return out.read_bytes()


def test_same_archive_everywhere(source, tmp_path):
    ref = archive_bytes(tmp_path, "inline", source, threads=1)
    assert archive_bytes(tmp_path, "threads", source, threads=2) == ref
    assert archive_bytes(tmp_path, "threads-forced", source, threads=3, processes=False) == ref
    out = tmp_path / "procs.brv"
    s = encoder.compress([source], out, threads=2, processes=True, batch_bytes=1 << 20)
    assert out.read_bytes() == ref and s["encode_processes"] >= 1  # 2 unless one worker started late
    out = tmp_path / "procs-small-batches.brv"
    encoder.compress([source], out, threads=2, processes=True, batch_bytes=1, window=1)
    assert out.read_bytes() == ref
    with ThreadPoolExecutor(3) as ex:
        assert archive_bytes(tmp_path, "executor", source, threads=2, executor=ex, batch_bytes=3 << 20) == ref
    from brevis.archive.reader import ArchiveReader
    with ArchiveReader(tmp_path / "procs.brv") as reader:  # the tied tensor is stored once
        segs = {s.name: s for f in reader.index.files for s in f.segments}
        a, b = segs["embed.weight"].chunks, segs["lm_head.weight"].chunks
        assert len(a) == 2 and [c.streams for c in a] == [c.streams for c in b]


@pytest.mark.parametrize("kind", ["folder", "archive"])
def test_base_in_worker_processes(kind, tmp_path):
    """Programs coded against a base: workers read a folder base by path; an
    archive base is decoded in the main process and its bytes travel."""
    rng = np.random.default_rng(2)
    x = (rng.standard_normal(1 << 20) * 0.02).astype(np.float16).view(np.uint16)
    base = tmp_path / "base"
    base.mkdir()
    write_safetensors(base / "m.safetensors", {"w": ("F16", (1024, 1024), x.tobytes())})
    ft = tmp_path / "ft"
    ft.mkdir()
    y = x ^ (rng.integers(0, 4, x.size, dtype=np.uint16) * (rng.random(x.size) < 0.2))
    write_safetensors(ft / "m.safetensors", {"w": ("F16", (1024, 1024), y.tobytes())})
    if kind == "archive":
        brevis.compress([base], tmp_path / "base.brv")
        base = tmp_path / "base.brv"
    ref = tmp_path / "ref.brv"
    brevis.compress([ft], ref, threads=1, base=base)
    out = tmp_path / "procs.brv"
    encoder.compress([ft], out, threads=2, processes=True, base=base, batch_bytes=1 << 19)
    assert out.read_bytes() == ref.read_bytes()
    from brevis.archive.reader import ArchiveReader
    with ArchiveReader(out) as reader:
        assert reader.index.base is not None
    brevis.decompress(out, tmp_path / "copy", base=base)
    assert (tmp_path / "copy" / "m.safetensors").read_bytes() == (ft / "m.safetensors").read_bytes()


def test_task_reads_its_own_bytes(tmp_path):
    data = np.tile(np.arange(256, dtype=np.uint16), 256).tobytes()
    f = tmp_path / "x.bin"
    f.write_bytes(b"head" + data)
    import json
    from brevis.dsl.coders import Zstd
    from brevis.dsl.program import Program
    program = json.dumps(Program.leaf(Zstd.at_level(3)).to_json())
    task = jobs.ChunkTask(str(f), 4, len(data), "F16", program)
    assert pickle.loads(pickle.dumps(task)) == task
    out = jobs.run_chunk(task)
    from brevis.archive.format import chunk_digest
    assert out.key == chunk_digest(data) + b"F16" and out.digest == chunk_digest(data)
    assert out.program is None and len(out.streams) == 1 and out.pid == os.getpid()
    with pytest.raises(InvalidArgument, match=f"cannot read {tmp_path / 'nope'}: No such file"):
        jobs.run_chunk(jobs.ChunkTask(str(tmp_path / "nope"), 0, 10, "u8", program))
    with pytest.raises(IOFailure, match="shrank while being read"):
        jobs.run_chunk(jobs.ChunkTask(str(f), 4, len(data) + 10, "u8", program))
    # The same errors come back from a worker process.
    ex = WorkerProcesses(1)
    try:
        with pytest.raises(IOFailure, match="shrank while being read"):
            ex.submit(jobs.run_chunks, [jobs.ChunkTask(str(f), 4, len(data) + 10, "u8", program)]).result()
        assert ex.submit(jobs.run_chunk, task).result().pid != os.getpid()
    finally:
        ex.shutdown(wait=True, cancel_futures=True)


# ------------------------------------------------------------ signals, with worker processes
RUN = """
import sys
sys.argv = ["brevis", *sys.argv[1:]]  # first: the command's process, its signal handling (brevis._is_command)
from brevis import cli
from brevis.codec import encoder
encoder.PROCESS_MIN_BYTES = 0  # worker processes whatever the size
cli.main()
"""


@pytest.fixture(scope="module")
def big_source(tmp_path_factory) -> Path:
    src = tmp_path_factory.mktemp("signals") / "src"
    src.mkdir()
    f16_layers(src / "gen.safetensors", 24)  # 96 MiB: about a second of work
    return src


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
# group: to the whole process group, as a terminal sends Ctrl-C (INT) and
# its hangup (HUP) to its foreground job: the workers ignore both.
@pytest.mark.parametrize("sig,group", [("INT", False), ("TERM", False), ("KILL", False), ("INT", True), ("HUP", True)])
def test_signal_with_worker_processes(big_source, tmp_path, sig, group):
    out = tmp_path / "ckpt.brv"
    p, workers = start_with_workers(["-c", RUN, "compress", big_source, "-o", out, "-j", "2", "-q"], ENV, 0.2,
                                    group=group)
    err, elapsed = signal_and_wait(p, workers, sig, group=group)
    if p.returncode == 0 or (sig != "KILL" and out.exists()):
        # Renamed into place before the signal took effect (even if it then met interpreter shutdown).
        assert p.returncode in (0, 130, -getattr(signal, f"SIG{sig}")) and brevis.verify(out, [big_source])["ok"]
        pytest.skip("the run ended before the signal")
    if sig == "KILL":
        assert p.returncode == -signal.SIGKILL
        # Batches in flight may be left in /dev/shm; the next run removes them.
        shared.remove_stale_batches()
        prefix = os.path.basename(shared.shm_prefix(p.pid))
        assert not [n for n in os.listdir(shared.SHM_DIR) if n.startswith(prefix)]
        return
    assert p.returncode == 130, (p.returncode, err)
    assert err.strip() == "brevis: interrupted", err  # no tracebacks from the workers
    print(f"SIG{sig}: exit {elapsed:.2f} s after the signal")
    assert elapsed < 5, f"{elapsed:.2f} s from SIG{sig} to exit"  # as tests/robustness (a loaded machine)
    assert not out.exists()
    assert [x.name for x in tmp_path.iterdir()] == []


SHRINK = """
import os, sys
from brevis import cli
from brevis.codec import encoder
encoder.PROCESS_MIN_BYTES = int(sys.argv.pop(1))
learn = encoder._learn
def shrink_then_learn(planner, scanned, *a, **k):  # the file shrinks after the scan, before encoding
    r = learn(planner, scanned, *a, **k)
    os.truncate(scanned[0].source.path, scanned[0].size // 2)
    return r
encoder._learn = shrink_then_learn
sys.argv = ["brevis", *sys.argv[1:]]
cli.main()
"""


@pytest.mark.parametrize("min_bytes", [0, 1 << 62], ids=["processes", "threads"])
def test_worker_error_is_one_line(big_source, tmp_path, min_bytes):
    """A source that shrinks while it is archived: the same line and exit code from a worker process."""
    src = tmp_path / "src"
    shutil.copytree(big_source, src)
    out = tmp_path / "out" / "x.brv"
    out.parent.mkdir()
    r = subprocess.run([sys.executable, "-c", SHRINK, str(min_bytes), "compress", src, "-o", out, "-j", "2", "-q"],
                       capture_output=True, text=True, env=ENV, timeout=120)
    assert r.returncode == 8, r.stderr
    assert r.stderr == f"brevis: i/o error: {src / 'gen.safetensors'} shrank while being read\n"
    assert list(out.parent.iterdir()) == []


def test_runs_group_consecutive_items_by_bytes_and_count():
    sizes = [3, 1, 5, 2, 2, 2, 9]
    assert list(runs(sizes, lambda n: n, 4)) == [[3, 1], [5], [2, 2], [2, 9]]
    assert list(runs(sizes, lambda n: n, 100, 3)) == [[3, 1, 5], [2, 2, 2], [9]]
    assert list(runs(sizes, lambda n: n, 0, 1)) == [[n] for n in sizes]  # one item a run
    assert list(runs([], lambda n: n, 4)) == []


# ------------------------------------------------------------ the ring of shared memory
def _outputs(*streams: bytes) -> list:
    return [jobs.ChunkOutput(b"k", b"d", None, list(streams), [0] * len(streams), os.getpid())]


def test_ring_slots_give_back_each_batchs_streams_in_place():
    ring = shared.Ring(os.getpid(), 2, 64)
    try:
        first = shared.write_ring_or_batch(_outputs(b"abc", b"", b"x" * 40), os.getpid(), ring.place(0))
        second = shared.write_ring_or_batch(_outputs(b"slot one"), os.getpid(), ring.place(1))
        third = shared.write_ring_or_batch(_outputs(b"again slot zero"), os.getpid(), ring.place(2))
        assert [type(b) for b in (first, second, third)] == [shared.RingBatch] * 3
        assert (first.slot, second.slot, third.slot) == (0, 1, 0)
        with shared.read_batch(second, ring) as outputs:
            assert [bytes(s) for s in outputs[0][1]] == [b"slot one"]
        with shared.read_batch(third, ring) as outputs:  # slot 0 again: the first batch's place
            assert [bytes(s) for s in outputs[0][1]] == [b"again slot zero"]
            assert outputs[0][0].streams is None
    finally:
        ring.close()
    assert not os.path.exists(ring.name)


def test_a_batch_larger_than_its_slot_or_without_a_ring_takes_a_file_of_its_own():
    ring = shared.Ring(os.getpid(), 1, 16)
    try:
        big = shared.write_ring_or_batch(_outputs(b"y" * 10, b"z" * 10), os.getpid(), ring.place(0))
        assert isinstance(big, shared.SharedBatch)
        with shared.read_batch(big, ring) as outputs:
            assert [bytes(s) for s in outputs[0][1]] == [b"y" * 10, b"z" * 10]
    finally:
        ring.close()
    gone = shared.write_ring_or_batch(_outputs(b"late"), os.getpid(), ring.place(0))  # the run is over
    assert isinstance(gone, shared.SharedBatch)
    with shared.read_batch(gone) as outputs:
        assert [bytes(s) for s in outputs[0][1]] == [b"late"]


def test_ring_refused_where_shared_memory_cannot_hold_it(monkeypatch):
    monkeypatch.setattr(shared, "_free_bytes", lambda folder: (4 << 20) - 1)
    assert shared.Ring.open(os.getpid(), 4, 1 << 20) is None
    assert not [n for n in os.listdir(shared.SHM_DIR) if n.startswith(os.path.basename(shared.shm_prefix(os.getpid())))]


def test_a_slot_that_shared_memory_cannot_hold_sends_its_batch_another_way(monkeypatch):
    """A slot's pages are allocated by the first worker to write to it: where
    /dev/shm is full by then, that batch takes a file of its own (or the
    pipe), not a SIGBUS as the worker writes to its mapping."""
    ring = shared.Ring(os.getpid(), 2, 64)
    try:
        first = shared.write_ring_or_batch(_outputs(b"fits"), os.getpid(), ring.place(0))
        assert isinstance(first, shared.RingBatch)

        def full(fd, offset, length):
            raise OSError(28, "No space left on device")

        monkeypatch.setattr(shared, "_fallocate", full)
        again = shared.write_ring_or_batch(_outputs(b"slot zero again"), os.getpid(), ring.place(2))
        assert isinstance(again, shared.RingBatch)  # slot 0 is allocated already
        other = shared.write_ring_or_batch(_outputs(b"slot one"), os.getpid(), ring.place(1))
        assert not isinstance(other, shared.RingBatch)
        with shared.read_batch(other, ring) as outputs:
            assert [bytes(s) for s in outputs[0][1]] == [b"slot one"]
    finally:
        ring.close()
        shared._mapped.pop(ring.name).close()


@pytest.mark.parametrize("ring", [True, False], ids=["ring", "files"])
def test_worker_processes_with_and_without_a_ring_write_the_same_archive(source, tmp_path, monkeypatch, ring):
    ref = archive_bytes(tmp_path, "inline", source, threads=1, chunk_bytes=256 << 10)
    if not ring:
        monkeypatch.setattr(encoder.Ring, "open", classmethod(lambda cls, *a: None))
    kinds = set()

    def read_batch(result, ring=None):
        kinds.add(type(result))
        return shared.read_batch(result, ring)

    monkeypatch.setattr(encoder, "read_batch", read_batch)
    out = tmp_path / "procs.brv"
    encoder.compress([source], out, threads=2, processes=True, batch_bytes=1 << 20, chunk_bytes=256 << 10)
    assert out.read_bytes() == ref
    assert kinds == {shared.RingBatch if ring else shared.SharedBatch}
    prefix = os.path.basename(shared.shm_prefix(os.getpid()))
    assert not [n for n in os.listdir(shared.SHM_DIR) if n.startswith(prefix)]  # the ring removed


def test_a_worker_lets_go_of_the_rings_of_runs_that_are_over():
    first = shared.Ring(os.getpid(), 1, 64)
    shared.write_ring_or_batch(_outputs(b"one"), os.getpid(), first.place(0))
    assert first.name in shared._mapped
    first.close()  # the run is over
    second = shared.Ring(os.getpid(), 1, 64)
    try:
        shared.write_ring_or_batch(_outputs(b"two"), os.getpid(), second.place(0))
        assert first.name not in shared._mapped and second.name in shared._mapped
    finally:
        second.close()
        shared._mapped.pop(second.name).close()


@pytest.mark.parametrize("ring", [True, False], ids=["ring", "files"])
def test_streams_written_behind_give_the_same_archive(source, tmp_path, monkeypatch, ring):
    """Streams written by a thread of their own (ArchiveWriter.write_behind)
    that lags behind, slowed down: each ring slot is given out again only
    once its last batch's streams are written (else a worker would
    overwrite them first), a batch in a file of its own is written before
    its mapping closes; the archive is the same, byte for byte."""
    import threading
    import time

    from brevis.archive import writer as writer_module

    ref = archive_bytes(tmp_path, "inline", source, threads=1, chunk_bytes=256 << 10)
    if not ring:
        monkeypatch.setattr(encoder.Ring, "open", classmethod(lambda cls, *a: None))
    monkeypatch.setattr(encoder, "WRITE_BEHIND_THREADS", 1)
    monkeypatch.setattr(encoder, "WRITE_BEHIND_BYTES", 0)
    put = writer_module.ArchiveWriter._put
    threads = set()

    def slow_put(self, data):
        threads.add(threading.current_thread().name)
        time.sleep(0.002)
        put(self, data)

    monkeypatch.setattr(writer_module.ArchiveWriter, "_put", slow_put)
    out = tmp_path / "procs.brv"
    s = encoder.compress([source], out, threads=2, processes=True, batch_bytes=1 << 18, chunk_bytes=256 << 10)
    assert out.read_bytes() == ref
    assert "brevis-writer" in threads and s["writer_cpu_s"] > 0
    out = tmp_path / "inline-behind.brv"
    assert encoder.compress([source], out, threads=1, chunk_bytes=256 << 10)["writer_cpu_s"] > 0
    assert out.read_bytes() == ref


def test_a_writing_thread_that_ends_early_is_an_error_not_a_wait_for_ever(tmp_path, monkeypatch):
    from brevis.archive import writer as writer_module

    monkeypatch.setattr(writer_module._Behind, "_run", lambda self: None)  # ends at once
    w = writer_module.ArchiveWriter(tmp_path / "x.brv")
    w.write_behind()
    w.write_stream(b"abc", 0)
    with pytest.raises(RuntimeError, match="ended early"):
        w.wait(w.mark())
    w.abort()
    assert list(tmp_path.iterdir()) == []


def test_streams_the_writing_thread_did_not_write_fail_the_archive(tmp_path, monkeypatch):
    """Every stream's location goes into the index: the file must hold them all."""
    from brevis.archive import writer as writer_module
    from brevis.archive.index import Index
    from brevis.errors import BrevisError

    w = writer_module.ArchiveWriter(tmp_path / "x.brv")
    monkeypatch.setattr(writer_module.ArchiveWriter, "_put", lambda self, data: None)  # dropped silently
    w.write_behind()
    w.write_stream(b"lost", 0)
    with pytest.raises(BrevisError, match="4 bytes of streams were not written"):
        w.finish(Index([], [], "test"))
    w.abort()
    assert list(tmp_path.iterdir()) == []
