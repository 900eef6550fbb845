"""The index's compiled reader (brevis/native/_index.c) against the reader
the schema compiles to Python: the same index from real archives, the same
index or the same refusal from thousands of damaged ones, and giving up
(None) on what it does not read itself."""

from __future__ import annotations

import copy
import gc
import random
from pathlib import Path

import pytest

from brevis.archive import index as index_module, schema
from brevis.archive.format import HEADER_SIZE
from brevis.archive.index import INDEX, Index
from brevis.codec.encoder import compress
from brevis.errors import FormatError
from helpers import split

pytestmark = pytest.mark.skipif(schema._index is None, reason="the C extension is not built")

ROOT = Path(__file__).resolve().parents[2]
SOURCES = {"taesd": ROOT / "examples" / "taesd", "golden-source": ROOT / "tests" / "golden" / "v1" / "source"}
GOLDEN = sorted((ROOT / "tests" / "golden").glob("v*/archive.brv"))

# The schema's reader with the loops only: no compiled segments, no compiled placements.
_python_parse = schema.parser(INDEX, names={"read_segments": index_module._loops_only})


def python_reader(obj, start: int, end: int) -> Index:
    saved, schema._index = schema._index, None
    try:
        with schema.paused_gc():
            return _python_parse(obj, start, end)
    finally:
        schema._index = saved


def outcome(read, obj, end):
    """What a reader makes of a copy of obj: ("index", Index) or ("refused", message)."""
    try:
        return "index", read(copy.deepcopy(obj), HEADER_SIZE, end)
    except FormatError as e:
        return "refused", str(e)


def stored_index(path: Path) -> tuple[dict, int]:
    """An archive's index as JSON, and where it starts (the stream region's end)."""
    head, obj = split(path.read_bytes())
    return obj, len(head)


@pytest.fixture(scope="module", params=sorted(SOURCES))
def written(request, tmp_path_factory) -> tuple[dict, int]:
    source = SOURCES[request.param]
    if not source.exists():
        pytest.skip(f"{source} is missing")
    out = tmp_path_factory.mktemp("index") / f"{request.param}.brv"
    compress([source], out, threads=1)
    return stored_index(out)


def test_real_indexes_read_alike(written):
    obj, end = written
    seen = []
    segments = index_module._read_segments
    assert outcome(Index.from_json, obj, end) == outcome(python_reader, obj, end)
    for f in obj["files"]:  # each file's segments read by the compiled reader itself, none left to the loop
        got = schema._index.segments(copy.deepcopy(f["segments"]), HEADER_SIZE, end, {}, obj.get("programs"))
        seen.append(got is not None)
    assert segments is schema._index.segments and all(seen)


def test_tuples_of_ints_and_strings_are_left_out_of_the_collector(written):
    """Stream locations, ranges, shapes and gathered members hold ints and
    strings only: the compiled reader leaves them untracked, as the
    collector itself would once it had visited them (the first collection
    after an index is read visited each of them)."""
    obj, end = written
    index = Index.from_json(copy.deepcopy(obj), HEADER_SIZE, end)
    made = []
    for f in index.files:
        for seg in f.segments:
            made += [s for c in seg.chunks for s in c.streams] + ([seg.shape] if seg.shape else [])
            if seg.ranges:
                made += [seg.ranges, *seg.ranges]
            if seg.members:
                made += [seg.members, *seg.members, *(shape for _, shape in seg.members if shape)]
    assert any(len(t) == 2 and type(t[0]) is str for t in made)  # gathered tensors among them
    assert made and not any(gc.is_tracked(t) for t in made)


@pytest.mark.parametrize("golden", GOLDEN, ids=lambda p: p.parent.name)
def test_golden_indexes_of_every_version_read_alike(golden):
    obj, end = stored_index(golden)
    assert outcome(Index.from_json, obj, end) == outcome(python_reader, obj, end)


# Values a damaged index may hold where the schema wants something else.
ODD = [None, True, False, 0, 1, -1, 2, 7, 1 << 31, 1 << 32, (1 << 63) - 1, 1 << 63, 1 << 64, -(1 << 63) - 1, 1.0,
       0.5, "", "x", "F32", "BF16", "00" * 16, "0A" * 16, "00 " * 16, "0" * 33, "zz" * 16, [], [0], [0, 0],
       [[0, 1]], [[0, 1, 2]], [1, 2, 3, 4], {}, {"file": "a", "name": "b", "sha256": "00" * 16}, ["x", [1]]]


def _leaves(value, path=()):
    """Every path into a JSON value (containers too)."""
    yield path
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _leaves(v, path + (k,))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _leaves(v, path + (i,))


def _damaged(obj: dict, rng: random.Random) -> dict:
    """obj with one to three places in its files' segments changed: a value
    replaced, a key dropped or added, an item dropped or repeated, or a
    number nudged by one."""
    obj = copy.deepcopy(obj)
    for _ in range(rng.randint(1, 3)):
        f = rng.choice([i for i, g in enumerate(obj["files"]) if g["segments"]])
        paths = [p for p in _leaves(obj["files"][f]["segments"]) if p]
        path = rng.choice(paths)
        parent = obj["files"][f]["segments"]
        for key in path[:-1]:
            parent = parent[key]
        key, action = path[-1], rng.random()
        if action < 0.55:
            parent[key] = copy.deepcopy(rng.choice(ODD))
        elif action < 0.7 and type(parent[key]) is int:
            parent[key] += rng.choice((-1, 1))
        elif action < 0.8:
            parent.pop(key)
        elif action < 0.9 and isinstance(parent, list):
            parent.insert(key, copy.deepcopy(parent[key]))
        elif isinstance(parent, dict):
            parent[rng.choice(("ranges", "members", "base", "shape", "dtype", "extra"))] = copy.deepcopy(rng.choice(ODD))
    return obj


def test_damaged_indexes_read_alike(written):
    """Whatever the damage, the compiled reader either builds the index the
    loops build or gives up, so the index read is the loops' and a refusal
    says what theirs says."""
    obj, end = written
    rng = random.Random(18)
    kinds = set()
    for _ in range(1500):
        damaged = _damaged(obj, rng)
        fast, slow = outcome(Index.from_json, damaged, end), outcome(python_reader, damaged, end)
        assert fast == slow
        kinds.add(fast[0])
    assert kinds == {"index", "refused"}


def test_what_it_does_not_read_is_left_to_the_loops(written):
    """A segment coded against a base, an integer past 64 bits, a digest in
    other spellings bytes.fromhex takes, a key it does not know (a field
    the schema may gain): None, and the index reads the same."""
    obj, end = written
    segment = next(s for f in obj["files"] for s in f["segments"] if s["chunks"] and s["dtype"])
    edits = [
        lambda s: s.update(base={"file": "a", "name": "b", "sha256": "00" * 16}),
        lambda s: s["chunks"][0][2][0].__setitem__(2, 1 << 64),
        lambda s: s["chunks"][0].__setitem__(3, " ".join(s["chunks"][0][3][i:i + 2] for i in range(0, 32, 2))),
        lambda s: s["chunks"][0].__setitem__(3, s["chunks"][0][3].upper() + " "),
        lambda s: s.update(note="a field this reader does not know"),
    ]
    for edit in edits:
        damaged = copy.deepcopy(obj)
        target = next(s for g in damaged["files"] for s in g["segments"] if s == segment)
        edit(target)
        segments = next(g for g in damaged["files"] if target in g["segments"])["segments"]
        assert schema._index.segments(segments, HEADER_SIZE, end, {}, damaged.get("programs")) is None
        assert outcome(Index.from_json, damaged, end) == outcome(python_reader, damaged, end)


class _Seg:
    def __init__(self, length, ranges=None):
        self.length, self.ranges = length, ranges


def _python_placements(segments, size):
    try:
        return schema._placements(segments, size)
    except FormatError as e:
        return str(e)


def test_placements_are_the_pythons():
    """Random files of gathered and plain segments, some laid out wrong
    (ranges overlapping, out of order, past the end, a plain segment across
    a range): the same pieces, or None where the Python one refuses."""
    rng = random.Random(4)
    refused = placed = 0
    for _ in range(3000):
        size = rng.randint(0, 200)
        cuts = sorted(rng.sample(range(1, size), min(size - 1, rng.randint(0, 12)))) if size > 1 else []
        spans = list(zip([0] + cuts, cuts + [size])) if size else []
        gathered = [s for s in spans if rng.random() < 0.4]
        groups = [gathered[i::2] for i in range(2)] if gathered else []
        plain = [b - a for a, b in spans if (a, b) not in gathered]
        segments = [_Seg(sum(b - a for a, b in g), tuple((a, b - a) for a, b in g)) for g in groups if g]
        segments += [_Seg(n) for n in plain]
        rng.shuffle(segments)
        if rng.random() < 0.3 and segments:  # damage
            s = rng.choice(segments)
            if s.ranges and rng.random() < 0.5:
                s.ranges = tuple(reversed(s.ranges)) if len(s.ranges) > 1 else ((s.ranges[0][0] + 1, s.ranges[0][1]),)
            else:
                s.length += rng.choice((-1, 1, 50))
        fast = schema._index.placements(segments, size)
        slow = _python_placements(segments, size)
        if fast is None:
            assert isinstance(slow, str)
            refused += 1
            with pytest.raises(FormatError, match=slow.removeprefix("index: ")):
                schema.placements(segments, size)
        else:
            assert fast == slow == schema.placements(segments, size)
            placed += 1
    assert refused and placed


def test_it_reads_what_the_records_hold():
    """The compiled reader builds SegmentEntry and Chunk by position: it is
    in use only while their fields are the ones it passes."""
    import dataclasses

    fields = tuple(tuple(f.name for f in dataclasses.fields(c)) for c in (index_module.SegmentEntry, index_module.Chunk))
    assert fields == index_module._COMPILED_FIELDS
    assert index_module._read_segments is schema._index.segments
