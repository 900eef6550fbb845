"""A tensor's split gives way to one `ans` leaf where that codes its chunks
no larger (planner._one_leaf): one stream and one pass to decode. The
split stays where it codes smaller, and stays what the segment's family
reuses, so that each sibling decides on its own values."""

from __future__ import annotations

import numpy as np
import pytest
from safetensors.numpy import save_file

import brevis
from brevis.dsl import Ans, LowZeroBits, Transpose
from brevis.dsl.program import Program
from brevis.dsl.types import tensor
from brevis.dtypes import DTYPES
from brevis.synth.planner import (TINY_ANS, Plan, SearchKind, SegmentInfo, _chunk_windows, _Family, _one_leaf,
                                  publish)

RNG = np.random.default_rng(11)
F32 = tensor(DTYPES["F32"])
# A split whose one child codes the same values in another order: an order-0
# coder codes them to the same size, so one leaf codes them no larger.
REORDERED = Program.op(Transpose(cols=64), Program.leaf(Ans()))
DEAD_BITS = Program.op(LowZeroBits(shift=8), Program.leaf(Ans()))


def segment(x: np.ndarray, chunks: int = 1, name: str = "layer.0.conv.weight") -> SegmentInfo:
    data = x.tobytes()
    return SegmentInfo(name, F32, x.shape, len(data), chunks, lambda o, n: data[o:o + n])


def dense(n: int) -> np.ndarray:
    return (RNG.standard_normal(n) * 0.02).astype(np.float32)


def searched(program: Program, estimate: float) -> Plan:
    return Plan(program, {"search": SearchKind.SEARCH, "estimate": round(estimate)}, estimate)


def test_a_split_that_codes_no_smaller_gives_way_to_one_leaf():
    seg = segment(dense(1 << 16))
    plan = searched(REORDERED, seg.length * 0.9)
    got = _one_leaf(plan, seg)
    assert got.program == TINY_ANS and got.found is plan
    assert got.stats["search"] == SearchKind.SEARCH and got.estimate == got.stats["estimate"] < seg.length


def test_a_split_that_codes_smaller_stays():
    """Dead low bits: `ans` would code them as live, a byte a value more."""
    x = (dense(1 << 16).view(np.uint32) >> 8 << 8).view(np.float32)
    seg = segment(x)
    plan = searched(DEAD_BITS, seg.length * 0.7)
    assert _one_leaf(plan, seg) is plan


@pytest.mark.parametrize("program", [TINY_ANS, None])
def test_what_has_no_split_is_left(program):
    seg = segment(dense(4096))
    plan = searched(program, 1000.0)
    assert _one_leaf(plan, seg) is plan


def test_a_long_segment_is_measured_at_two_places():
    """From three chunks on, a chunk's length at a third and at two thirds
    of the segment (a large weight's statistics drift along it), else at
    its middle; whole elements, inside the segment."""
    x = np.arange(6 << 10, dtype=np.uint32).view(np.float32)  # (the windows are the words: each its position)

    def placed(seg):
        return [(int(w[0]), len(w)) for w in _chunk_windows(seg)]

    assert placed(segment(x, chunks=6)) == [(1536, 1024), (3584, 1024)]
    assert placed(segment(x, chunks=2)) == [(1536, 3072)]
    assert placed(segment(x[:1001], chunks=1)) == [(0, 1001)]


def test_the_family_reuses_the_program_found():
    family = _Family()
    seg = segment(dense(1 << 16))
    plan = searched(REORDERED, seg.length * 0.9)
    publish(family, _one_leaf(plan, seg), seg)
    assert family.program == REORDERED and family.bytes_per_byte == pytest.approx(0.9)


def test_archives_round_trip_with_one_leaf_in_worker_processes(tmp_path):
    """Planned in worker processes (the plan comes back with the program
    found): every byte comes back."""
    tensors = {f"layer{i}.conv.weight": dense(1 << 20).reshape(1024, 1024) for i in range(3)}
    path = tmp_path / "model.safetensors"
    save_file(tensors, path)
    out = tmp_path / "model.brv"
    brevis.compress([path], out, threads=2, processes=True)
    segments = [s for f in brevis.inspect(out)["files"] for s in f["segments"] if s["name"].endswith("weight")]
    # Dense weights: a partition by exponent (what the search finds on the
    # samples of two of them) codes their chunks no smaller than one leaf.
    assert [s["programs"][0]["program"] for s in segments] == ["ans"] * 3
    assert brevis.unpack(out)["model.safetensors"] == path.read_bytes()
