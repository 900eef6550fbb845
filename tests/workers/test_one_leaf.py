"""A tensor's chunk that a split coded in several streams is coded by one
`ans` of its whole values where that is no larger (tasks.one_leaf): one
stream and one pass to decode; the split stays where it codes smaller."""

from __future__ import annotations

import numpy as np
import pytest
from safetensors.numpy import save_file

import brevis
from brevis.dsl import Ans, BytePlanes, Raw
from brevis.dsl.program import Program
from brevis.dsl.types import BYTES, tensor
from brevis.dtypes import DTYPES
from brevis.workers import tasks
from brevis.workers.tasks import encode_repairing, one_leaf

RNG = np.random.default_rng(11)
F32 = tensor(DTYPES["F32"])
# Four byte planes stored as they are: an F32 weight's `ans` codes smaller.
PLANES = Program.op(BytePlanes(), *[Program.leaf(Raw())] * 4)


def dense(n: int) -> np.ndarray:
    return (RNG.standard_normal(n) * 0.02).astype(np.float32)


def test_a_split_that_codes_no_smaller_gives_way_to_one_leaf():
    x = dense(1 << 16).view(np.uint32)
    program, streams = encode_repairing(PLANES, x, F32)
    got, coded = one_leaf(program, streams, x, F32)
    assert got == Program.leaf(Ans()) and coded == [Ans().encode(x, F32)]
    assert len(coded[0]) < sum(map(len, streams))
    assert np.array_equal(Ans().decode(memoryview(coded[0]), len(x), F32), x)


def test_a_split_that_codes_smaller_stays():
    """Streams whose bytes and index entries come to less than the leaf's
    stream stay (by a byte, or by half of it); streams a few dozen bytes
    larger give way."""
    x = dense(1 << 16).view(np.uint32)
    leaf = len(Ans().encode(x, F32))
    for size in (leaf - 6 * 3 - 1, leaf // 2):
        streams = [b"\0" * (size - 3 * (size // 4))] + [b"\0" * (size // 4)] * 3
        assert sum(map(len, streams)) == size
        assert one_leaf(PLANES, streams, x, F32) == (PLANES, streams)
    # Larger by a few dozen bytes, index entries counted (the leaf's cost is
    # estimated first, within a few bytes of its stream):
    streams = [b"\0" * (leaf - 6 * 3 + 40 - 3 * 100)] + [b"\0" * 100] * 3
    assert one_leaf(PLANES, streams, x, F32)[0] == Program.leaf(Ans())


@pytest.mark.parametrize("t", [BYTES, tensor(DTYPES["F64"])])
def test_what_one_leaf_does_not_code_is_left(t):
    x = dense(1 << 12).view(t.container)
    streams = [b"\0" * x.nbytes] * 4
    assert one_leaf(PLANES, streams, x, t) == (PLANES, streams)


def test_archives_take_the_leaf_chunk_by_chunk(tmp_path, monkeypatch):
    """Weights planned as four raw byte planes: every chunk coded by one
    `ans` instead, smaller, every byte back; without the step, the planes."""
    from brevis.synth import planner

    made = planner.Planner._plan

    def planes(self, seg, family, leader):
        plan = made(self, seg, family, leader)
        if seg.name.endswith("weight"):
            return planner.Plan(PLANES, dict(plan.stats), plan.estimate)
        return plan

    monkeypatch.setattr(planner.Planner, "_plan", planes)
    tensors = {f"layer{i}.conv.weight": dense(1 << 18).reshape(512, 512) for i in range(2)}
    path = tmp_path / "model.safetensors"
    save_file(tensors, path)

    def coded(out):
        brevis.compress([path], out)
        programs = {p["program"] for f in brevis.inspect(out)["files"] for s in f["segments"]
                    if s["name"].endswith("weight") for p in s["programs"]}
        assert brevis.unpack(out)["model.safetensors"] == path.read_bytes()
        return out.stat().st_size, programs

    size, programs = coded(tmp_path / "model.brv")
    assert programs == {"ans"}
    monkeypatch.setattr(tasks, "one_leaf", lambda program, streams, x, t: (program, streams))
    split_size, split_programs = coded(tmp_path / "split.brv")
    assert split_programs == {PLANES.describe(F32)} and size < split_size
