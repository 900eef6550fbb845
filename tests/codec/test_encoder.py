"""The encoder's plan (codec/plan.py) and its assembler (codec/assembler.py).

What must hold: the plan's skeleton names every file, segment and chunk
in archive order before anything is planned; the assembler alone builds
the index from it, in plan order: files without segments and segments
without chunks in their places, duplicated chunks stored once, each file
checked and closed once its last chunk is in the index (a file without
segments when the assembler reaches it), chunks out of plan order
refused. And compress() returns the archive's path as given.
"""

from __future__ import annotations

import dataclasses
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

import brevis
from brevis.archive.reader import ArchiveReader
from brevis.archive.schema import SearchKind
from brevis.codec import encoder
from brevis.codec import plan as plan_module
from brevis.codec.assembler import Assembler
from brevis.codec.plan import lay_out, plan_segments, scan
from brevis.errors import IOFailure
from brevis.fs.sources import Source
from brevis.synth.planner import Planner
from brevis.workers.pool import Pool
from brevis.workers.tasks import run_chunk
from helpers import small_checkpoint, write_safetensors

CHUNK = 4096


class Writer:
    """What the assembler needs of an ArchiveWriter: streams are counted, not written."""

    def __init__(self):
        self.streams: list[bytes] = []
        self.offset = 0
        self.index = None

    def write_stream(self, data, crc):
        where = (self.offset, len(data), crc)
        self.streams.append(bytes(data))
        self.offset += len(data)
        return where

    def finish(self, index):
        self.index = index
        return self.offset


@pytest.fixture
def tree(tmp_path) -> list[Source]:
    """An empty file, a file with a duplicated tensor and an empty one, another empty file, text."""
    rng = np.random.default_rng(0)
    w = (rng.standard_normal(3000) * 0.02).astype(np.float16).tobytes()  # 6000 bytes: two chunks
    (tmp_path / "a.bin").write_bytes(b"")
    write_safetensors(tmp_path / "b.safetensors", {
        "x.weight": ("F16", (3000,), w),
        "empty": ("F32", (0,), b""),
        "y.weight": ("F16", (3000,), w),  # the same bytes: stored once
    })
    (tmp_path / "c.bin").write_bytes(b"")
    (tmp_path / "d.txt").write_text("text " * 100)
    return [Source(n, tmp_path / n) for n in ["a.bin", "b.safetensors", "c.bin", "d.txt"]]


def add(asm: Assembler, ref) -> None:
    output = run_chunk(ref.task())
    asm.add(ref, output, output.streams)


def planned(sources: list[Source]):
    scanned = [scan(s) for s in sources]
    files = lay_out(scanned, CHUNK)
    return scanned, files, list(plan_segments(files, Planner(1), Pool(1), CHUNK, None))


def segment_plans(sources: list[Source], planner, executor, ahead: int) -> list[tuple]:
    """Each segment's name, program, stats, estimate and chunk size, as
    plan_segments plans them with a fresh planner() (here where executor is None)."""
    files = lay_out([scan(s) for s in sources], CHUNK)
    out = [(ps.segment.name, ps.program_json, ps.plan.stats, ps.plan.estimate, ps.plan.chunk_bytes)
           for ps in plan_segments(files, planner(), Pool(1), CHUNK, None, executor, ahead)]
    for f in files:
        f.scanned.close()
    return out


@pytest.mark.parametrize("batch", [1, 2, 16])
def test_segments_planned_elsewhere_get_the_plans_made_here(tmp_path, monkeypatch, batch):
    """plan_segments with an executor (worker processes in compress; threads
    here) runs the segments' planning in jobs of `batch` segments, each
    task carrying the prior as JSON and, for a family's follower, its
    leader's program: the plans are the ones made on this process's pool,
    families and learned programs included, however the batches fall."""
    monkeypatch.setattr(plan_module, "PLAN_BATCH_SEGMENTS", batch)
    rng = np.random.default_rng(4)
    tensors = {f"layer{i}.mlp.weight": ("F16", (64, 256), (rng.standard_normal(64 * 256) * 0.02)
                                        .astype(np.float16).tobytes()) for i in range(6)}
    tensors["norm.weight"] = ("F32", (4096,), np.ones(4096, np.float32).tobytes())
    tensors["head"] = ("F32", (300, 40), (rng.standard_normal(12000) * 0.1).astype(np.float32).tobytes())
    write_safetensors(tmp_path / "m.safetensors", tensors)
    sources = [Source("m.safetensors", tmp_path / "m.safetensors")]
    learner = Planner(2)
    scanned = [scan(s) for s in sources]
    encoder._learn(learner, scanned, Pool(1), CHUNK)

    here = segment_plans(sources, lambda: Planner(2, learner.prior), None, 3)
    with ThreadPoolExecutor(2) as ex:
        assert segment_plans(sources, lambda: Planner(2, learner.prior), ex, 3) == here
    kinds = [stats.get("search") for _, _, stats, _, _ in here]
    assert {SearchKind.FAMILY, SearchKind.LEARNED, SearchKind.SEARCH} <= set(kinds), kinds


def test_a_follower_waiting_for_its_leader_holds_back_no_later_segment(tmp_path, monkeypatch):
    """Planned elsewhere, a family's follower waits for its leader's plan,
    but the segments after it are sent meanwhile: here the leader's job
    (one segment a job) runs only once a segment after all of its
    followers has been sent (it would wait out the timeout were they held
    back), and the plans are still the ones made here."""
    monkeypatch.setattr(plan_module, "PLAN_BATCH_SEGMENTS", 1)
    rng = np.random.default_rng(5)
    tensors = {f"layer{i}.mlp.weight": ("F16", (64, 256), (rng.standard_normal(64 * 256) * 0.02)
                                        .astype(np.float16).tobytes()) for i in range(4)}
    tensors["zeta.weight"] = ("F32", (300, 40), (rng.standard_normal(12000) * 0.1).astype(np.float32).tobytes())
    write_safetensors(tmp_path / "m.safetensors", tensors)
    source = Source("m.safetensors", tmp_path / "m.safetensors")
    last_sent = threading.Event()
    waited_out = []

    class Gated(ThreadPoolExecutor):
        def submit(self, fn, tasks):
            names = [task.segment.name for task in tasks]
            if "zeta.weight" in names:
                last_sent.set()
            if "layer0.mlp.weight" not in names:
                return super().submit(fn, tasks)

            def leader(tasks):
                waited_out.append(not last_sent.wait(10))
                return fn(tasks)
            return super().submit(leader, tasks)

    here = segment_plans([source], lambda: Planner(2), None, 8)
    with Gated(2) as ex:
        assert segment_plans([source], lambda: Planner(2), ex, 8) == here
    assert waited_out == [False]
    kinds = [stats.get("search") for name, _, stats, _, _ in here if name.startswith("layer")]
    assert kinds == [SearchKind.SEARCH] + [SearchKind.FAMILY] * 3


def test_the_skeleton_holds_every_file_segment_and_chunk_before_planning(tree):
    files = lay_out([scan(s) for s in tree], CHUNK)
    assert [f.source.name for f in files] == ["a.bin", "b.safetensors", "c.bin", "d.txt"]
    b = files[1]
    names = [ps.segment.name for ps in b.segments]
    assert "x.weight" in names and "empty" in names and "y.weight" in names
    x = b.segments[names.index("x.weight")]
    assert [(c.n, c.length) for c in x.chunks] == [(2048, 4096), (952, 1904)]
    assert x.chunks[1].offset == x.chunks[0].offset + 4096 == x.segment.offset + 4096
    assert b.segments[names.index("empty")].chunks == ()
    assert not files[0].segments
    assert all(not ps.planned for f in files for ps in f.segments)
    assert sum(c.length for f in files for ps in f.segments for c in ps.chunks) == sum(
        f.scanned.size for f in files)


def test_the_assembler_builds_the_index_in_plan_order(tree):
    scanned, files, segments = planned(tree)
    assert all(ps.planned for ps in segments)
    writer = Writer()
    asm = Assembler(files, ["sub"], writer)
    refs = [ref for ps in segments for ref in ps.chunks]
    for ref in refs:
        add(asm, ref)
    size = asm.finish({"prior": 1})
    index = writer.index
    assert index is asm.index and size == writer.offset
    assert index.dirs == ["sub"] and index.prior == {"prior": 1} and index.base is None
    assert [f.path for f in index.files] == ["a.bin", "b.safetensors", "c.bin", "d.txt"]
    assert [[s.name for s in f.segments] for f in index.files] == [
        [ps.segment.name for ps in f.segments] for f in files]
    for f, entry in zip(files, index.files):
        assert entry.size == f.scanned.size
        for ps, s in zip(f.segments, entry.segments):
            assert [c.n for c in s.chunks] == [c.n for c in ps.chunks]
            assert s.search == ps.plan.stats
    seg = {s.name: s for s in index.files[1].segments}
    assert seg["empty"].chunks == [] and seg["empty"].programs == []
    assert seg["x.weight"].chunks[0].streams == seg["y.weight"].chunks[0].streams  # deduplicated
    assert len(writer.streams) < sum(len(run_chunk(r.task()).streams) for r in refs)
    assert all(f.fd == -1 for f in scanned)


def test_chunks_whose_keys_collide_are_stored_apart_unless_their_bytes_match(tree):
    """A key is a digest, not a proof: every chunk given one key (a
    collision on every pair), only the two of the same bytes share streams."""
    scanned, files, segments = planned(tree)
    writer = Writer()
    asm = Assembler(files, [], writer)
    refs = [ref for ps in segments for ref in ps.chunks]
    for ref in refs:
        output = run_chunk(ref.task())
        asm.add(ref, dataclasses.replace(output, key=b"one key"), output.streams)
    asm.finish(None)
    chunks = [(s.name, c) for f in asm.index.files for s in f.segments for c in s.chunks]
    where = {}
    for name, c in chunks:
        where.setdefault(tuple(map(tuple, c.streams)), set()).add((name, c.digest))
    # x.weight and y.weight hold the same bytes (two chunks each): their chunks pair up; no other chunk shares
    assert sorted(len(v) for v in where.values()) == [1] * (len(chunks) - 4) + [2, 2]
    assert all(len({d for _, d in v}) == 1 for v in where.values())
    assert len(writer.streams) == sum(len(run_chunk(r.task()).streams) for r in refs) - 2


def test_a_file_is_released_after_its_last_chunk(tree):
    scanned, files, segments = planned(tree)
    asm = Assembler(files, [], Writer())
    b = files[1]
    refs = [ref for ps in segments for ref in ps.chunks]
    last_of_b = max(i for i, r in enumerate(refs) if r.segment.file is b)
    assert b.scanned.fd >= 0  # opened for planning
    for i, ref in enumerate(refs):
        add(asm, ref)
        assert (b.scanned.fd >= 0) == (i < last_of_b), i
        if i == 0:  # reaching b released a.bin (no segments) on the way
            assert [f.path for f in asm.index.files] == ["a.bin", "b.safetensors"]
    asm.finish(None)


def test_a_changed_file_without_segments_is_caught_when_reached(tree):
    scanned, files, segments = planned(tree)
    asm = Assembler(files, [], Writer())
    st = os.stat(tree[2].path)
    os.utime(tree[2].path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # c.bin, after b.safetensors
    refs = [ref for ps in segments for ref in ps.chunks]
    b_refs = [r for r in refs if r.segment.file is files[1]]
    with pytest.raises(IOFailure, match="c.bin changed while being read"):
        for ref in b_refs:
            add(asm, ref)
    assert [f.path for f in asm.index.files] == ["a.bin", "b.safetensors", "c.bin"]


def test_chunks_out_of_plan_order_are_refused(tree):
    _, files, segments = planned(tree)
    asm = Assembler(files, [], Writer())
    refs = [ref for ps in segments for ref in ps.chunks]
    x = next(ps for ps in segments if ps.segment.name == "x.weight")
    for ref in refs[:refs.index(x.chunks[0])]:
        add(asm, ref)
    with pytest.raises(AssertionError, match="out of plan order"):
        add(asm, x.chunks[1])  # its first chunk skipped
    asm = Assembler(files, [], Writer())
    add(asm, refs[0])
    with pytest.raises(AssertionError):
        add(asm, refs[-1])  # a later segment before this one is complete
    with pytest.raises(AssertionError, match="before its plan"):
        Assembler(files, [], Writer()).finish(None)


def test_a_segment_without_chunks_waits_for_its_plan(tree):
    _, files, _ = planned(tree)
    b = files[1]
    empty = next(ps for ps in b.segments if not ps.chunks)
    plan, empty.plan = empty.plan, None  # as if still being planned
    asm = Assembler(files, [], Writer())
    before = [ref for ps in b.segments[:b.segments.index(empty)] for ref in ps.chunks]
    for ref in before:
        add(asm, ref)
    assert [s.name for s in asm.index.files[1].segments] == [ps.segment.name for ps in b.segments[
        :b.segments.index(empty)]]
    empty.plan = plan
    rest = [ref for f in files for ps in f.segments for ref in ps.chunks if ref not in before]
    for ref in rest:
        add(asm, ref)
    asm.finish(None)
    assert "empty" in [s.name for s in asm.index.files[1].segments]


@pytest.mark.parametrize("kw", [{"threads": 1}, {"threads": 2, "processes": False},
                                {"threads": 2, "processes": True}], ids=["inline", "threads", "processes"])
def test_the_summary_names_the_archive_given(tmp_path, kw):
    src = small_checkpoint(tmp_path / "ckpt")
    out = tmp_path / "out.brv"
    assert encoder.compress([src], out, **kw)["archive"] == str(out)
    assert brevis.compress([src], str(out), force=True, **kw)["archive"] == str(out)


def test_empty_files_and_tensors_give_the_same_archive_for_any_threads(tree, tmp_path):
    digests = set()
    for i, kw in enumerate([{"threads": 1}, {"threads": 2, "processes": False},
                            {"threads": 2, "processes": True, "batch_bytes": 1}]):
        out = tmp_path / f"{i}.brv"
        encoder.compress([s.path for s in tree], out, chunk_bytes=CHUNK, **kw)
        digests.add(out.read_bytes())
    assert len(digests) == 1
    with ArchiveReader(out) as reader:
        assert [f.path for f in reader.index.files] == ["a.bin", "b.safetensors", "c.bin", "d.txt"]


def test_paths_are_kept_as_given(tmp_path):
    src = small_checkpoint(tmp_path / "ckpt")
    rel = Path(os.path.relpath(tmp_path / "rel.brv"))
    assert brevis.compress([src], rel)["archive"] == str(rel)
