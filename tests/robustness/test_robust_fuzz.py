"""Fuzzing the archive reader with hypothesis: mutate valid archives, and
check that inspect, verify and decompress raise nothing but BrevisError,
agree with each other, leave nothing behind, and never pass off wrong
bytes as an archived file (robust_util.check_archive).

Mutations: bit flips, byte overwrites, truncations, insertions and
deletions, splices of two archives; index JSON rewritten (values replaced
by hostile ones, keys dropped, list items duplicated, dropped or swapped)
and sealed again with a valid digest and footer; streams damaged with
their CRC-32s recomputed, so the DSL decoders themselves meet the damage.
Seeds: two compressed checkpoints and an archive that runs every operator.

The fast profile runs by default (a few seconds); the long one with
--runslow. Inputs that ever failed are kept in regressions/ and replayed.
scripts/fuzz_reader.py is the same oracle under atheris (coverage-guided).
"""

from __future__ import annotations

import base64
import copy
import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from robust_util import Seeds, Unexpected, archive_of, check_archive, join, reseal_crcs, split

REGRESSIONS = Path(__file__).resolve().parent / "regressions"
# Random here, the same examples in CI (conftest's "ci" profile): a run that
# lands must not hang on a new find; fuzz locally (--runslow) for those.
FAST = settings(max_examples=40, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
LONG = settings(FAST, max_examples=2500)


@pytest.fixture(scope="module")
def seeds(tmp_path_factory) -> Seeds:
    return Seeds(tmp_path_factory.mktemp("fuzz-seeds"))


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("fuzz-work")


def oracle(data: bytes, seeds: Seeds, work: Path, exact: bool) -> str:
    try:
        return check_archive(data, seeds.trees, work, exact=exact)
    except Unexpected:
        keep(data)
        raise


def keep(data: bytes) -> None:
    """Save a failing archive so that it becomes a regression test (commit it)."""
    import hashlib

    REGRESSIONS.mkdir(exist_ok=True)
    (REGRESSIONS / f"found-{hashlib.sha256(data).hexdigest()[:16]}.brv").write_bytes(data)


# ------------------------------------------------------------ byte mutations
@st.composite
def mutated_bytes(draw, archives: list[bytes]) -> bytes:
    data = bytearray(draw(st.sampled_from(archives)))
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["flip", "overwrite", "truncate", "insert", "delete", "splice", "tail"]))
        n = len(data)
        if n == 0:
            break
        pos = draw(st.integers(0, n - 1))
        if kind == "flip":
            data[pos] ^= 1 << draw(st.integers(0, 7))
        elif kind == "overwrite":
            chunk = draw(st.binary(min_size=1, max_size=16))
            data[pos:pos + len(chunk)] = chunk
        elif kind == "truncate":
            del data[pos:]
        elif kind == "insert":
            data[pos:pos] = draw(st.binary(min_size=1, max_size=16))
        elif kind == "delete":
            del data[pos:pos + draw(st.integers(1, 64))]
        elif kind == "splice":  # the start of one archive, the end of another
            other = draw(st.sampled_from(archives))
            cut = draw(st.integers(0, len(other)))
            data = data[:pos] + bytearray(other[cut:])
        else:  # the footer (last 48 bytes) hit
            back = draw(st.integers(1, min(48, n)))
            data[n - back] ^= 1 << draw(st.integers(0, 7))
    return bytes(data)


def byte_mutations(profile):
    @profile
    @given(data=st.data())
    def run(seeds, work, data):
        archive = data.draw(mutated_bytes(seeds.archives))
        oracle(archive, seeds, work, exact=True)
    return run


test_byte_mutations = byte_mutations(FAST)
test_byte_mutations_long = pytest.mark.slow(byte_mutations(LONG))


# ------------------------------------------------------------ index rewrites
HOSTILE = st.one_of(
    st.sampled_from([0, 1, -1, 2**31, 2**32, 2**53 + 1, 2**63, 2**64, -2**63, 10**30, True, False, None,
                     0.5, 1e308, float("inf"), "", "..", "/etc/passwd", "a/../../b", "x" * 300, "\udcff",
                     [], {}, [[]], [0, 0], [0, 0, 0], {"": 0}, "raw", ["raw", {}], ["zstd", {}],
                     ["constant", {"value": 0}, []], "00" * 16, "zz", 16, 48]),
    st.integers(), st.text(max_size=8),
    st.lists(st.integers(-2, 2**33), max_size=4),
)


def paths_in(obj, prefix=()):
    """Every (container path, key) in a JSON value."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield prefix, k
            yield from paths_in(v, prefix + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield prefix, i
            yield from paths_in(v, prefix + (i,))


def at(obj, path):
    for k in path:
        obj = obj[k]
    return obj


@st.composite
def rewritten_index(draw, parts: list[tuple[bytes, dict]]) -> tuple[bytes, bool]:
    k = draw(st.integers(0, len(parts) - 1))
    head, index = parts[k]
    index = copy.deepcopy(index)
    # Aim at the interesting parts more often than at the prior's counts.
    targets = [p for p in paths_in(index) if not (p[0][:1] == ("prior",) and len(p[0]) > 1)]
    for _ in range(draw(st.integers(1, 3))):
        container_path, key = draw(st.sampled_from(targets))
        container = at(index, container_path)
        action = draw(st.sampled_from(["replace", "replace", "replace", "drop", "duplicate", "swap", "nudge"]))
        try:
            if action == "replace":
                container[key] = copy.deepcopy(draw(HOSTILE))  # the [] and {} above are shared: later steps edit them
            elif action == "drop":
                del container[key]
            elif action == "duplicate" and isinstance(container, list):
                container.insert(key, copy.deepcopy(container[key]))
            elif action == "swap" and isinstance(container, list) and len(container) > 1:
                other = draw(st.integers(0, len(container) - 1))
                container[key], container[other] = container[other], container[key]
            elif action == "nudge" and type(container[key]) is int:
                container[key] += draw(st.sampled_from([-1, 1, -16, 16, 2**20]))
        except (KeyError, IndexError, TypeError):
            pass
        targets = [p for p in paths_in(index) if not (p[0][:1] == ("prior",) and len(p[0]) > 1)]
        if not targets:
            break
    reseal = draw(st.booleans())
    if reseal:
        reseal_crcs(head, index)
    try:
        raw = json.dumps(index, allow_nan=True).encode("ascii")
    except (ValueError, UnicodeEncodeError):
        raw = json.dumps(index, allow_nan=True, ensure_ascii=False).encode("utf-8", "surrogatepass")
    return join(head, raw), False


def index_rewrites(profile):
    @profile
    @given(data=st.data())
    def run(seeds, work, data):
        parts = [split(a) for a in seeds.archives]
        archive, exact = data.draw(rewritten_index(parts))
        oracle(archive, seeds, work, exact=exact)
    return run


test_index_rewrites = index_rewrites(FAST)
test_index_rewrites_long = pytest.mark.slow(index_rewrites(LONG))


# ------------------------------------------------------------ damaged streams, CRCs resealed
@st.composite
def damaged_streams(draw, parts: list[tuple[bytes, dict]]) -> bytes:
    k = draw(st.integers(0, len(parts) - 1))
    head, index = parts[k]
    data = bytearray(head)
    for _ in range(draw(st.integers(1, 4))):
        pos = draw(st.integers(16, len(data) - 1))
        if draw(st.booleans()):
            data[pos] ^= 1 << draw(st.integers(0, 7))
        else:
            data[pos] = draw(st.integers(0, 255))
    return join(bytes(data), reseal_crcs(bytes(data), copy.deepcopy(index)))


def stream_damage(profile):
    @profile
    @given(data=st.data())
    def run(seeds, work, data):
        parts = [split(a) for a in seeds.archives]
        archive = data.draw(damaged_streams(parts))
        oracle(archive, seeds, work, exact=True)
    return run


test_stream_damage = stream_damage(FAST)
test_stream_damage_long = pytest.mark.slow(stream_damage(LONG))


# ------------------------------------------------------------ regressions
def regression_files() -> list[Path]:
    return sorted(REGRESSIONS.glob("*.brv")) if REGRESSIONS.is_dir() else []


@pytest.mark.parametrize("path", regression_files(), ids=lambda p: p.name)
def test_regression(path, work):
    """Archives that once made the reader fail: only BrevisError (or success) now."""
    check_archive(path.read_bytes(), [], work, exact=False)


def test_atheris_inputs_replay(seeds, work):
    """The input format of scripts/fuzz_reader.py, on its own seeds (mode 0, 1 and 2)."""
    parts = [split(a) for a in seeds.archives]
    for k, (archive, (head, index)) in enumerate(zip(seeds.archives, parts)):
        for data in (bytes([0, k]) + archive, bytes([1, k]) + json.dumps(index).encode(), bytes([2, k]) + head):
            mutated, exact = archive_of(data, seeds.archives, parts)
            assert check_archive(mutated, seeds.trees, work, exact=exact) == "ok"


def test_atheris_input_shorter_than_a_header(seeds, work):
    """Mode 2 with a payload shorter than a header: the first input the
    fuzzer found (2026-12-07) crashed the harness's join, not the reader.
    It stands for an archive every reader refuses."""
    parts = [split(a) for a in seeds.archives]
    found = base64.b64decode("AgCJAkIAiUJSVg1S")  # mode 2, seed 0, a payload of 10 bytes
    archive, exact = archive_of(found, seeds.archives, parts)
    assert check_archive(archive, seeds.trees, work, exact=exact) == "error"
