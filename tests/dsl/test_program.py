"""The type checker and the JSON reader refuse malformed programs with ProgramError."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys

import pytest

from brevis.dsl import (Affine, BitFields, BytePlanes, Constant, Delta, FloatFields, LowZeroBits, PackBits,
                        Partition, Program, Rank, Raw, Records, RowDedup, Sparse, Transpose, ZigZag, Zstd)
from brevis.dsl.program import MAX_DEPTH, MAX_NODES
from brevis.dsl.types import BYTES, Field, tensor
from brevis.dtypes import DTYPES
from brevis.errors import FormatError, ProgramError

F32 = tensor(DTYPES["F32"])
BF16 = tensor(DTYPES["BF16"])
F16 = tensor(DTYPES["F16"])
I32 = tensor(DTYPES["I32"])
RAW = Program.leaf(Raw())


def raws(n: int) -> list[Program]:
    return [RAW] * n


def test_program_error_is_a_format_error():
    # An archive with a bad program is a corrupt archive to the reader.
    assert issubclass(ProgramError, FormatError)


# ------------------------------------------------------------ child counts
@pytest.mark.parametrize("program,t", [
    (Program.op(BytePlanes(), *raws(1)), F32),  # 4 planes
    (Program.op(BytePlanes(), *raws(5)), F32),
    (Program.op(BytePlanes()), Field(8)),
    (Program.op(FloatFields(grouping="s|e|m"), *raws(2)), F32),
    (Program.op(FloatFields(grouping="e|sm"), *raws(3)), BF16),
    (Program.op(LowZeroBits(shift=3)), Field(16)),
    (Program.op(Constant(value=0), RAW), Field(8)),
    (Program.op(Sparse(value=0), *raws(2)), Field(8)),
    (Program.op(RowDedup(row=2), *raws(1)), Field(8)),
    (Program.op(PackBits(), *raws(2)), Field(2)),
    (Program.op(BitFields(groups=[[[0, 8]]]), *raws(2)), Field(8)),
    (Program(Raw(), (RAW,)), Field(8)),  # a coder with a child
], ids=lambda v: v.describe() if isinstance(v, Program) else str(v))
def test_wrong_child_count(program, t):
    with pytest.raises(ProgramError):
        program.check(t)


@pytest.mark.parametrize("obj", [
    ["raw", {}, []],  # a coder with (even no) children
    ["raw", {}, [["raw", {}]]],
    ["byte_planes", {}],  # an operator without its children list
    ["byte_planes", {}, ["raw", {}]],  # children not a list of nodes
    ["byte_planes", {}, "raw"],
])
def test_json_node_shape(obj):
    with pytest.raises(ProgramError):
        Program.from_json(obj).check(Field(16))


def test_json_children_counted_by_the_checker():
    p = Program.from_json(["byte_planes", {}, [["raw", {}]]])
    assert p.check(Field(8)) == 1
    with pytest.raises(ProgramError):
        p.check(Field(16))


# ------------------------------------------------------------ type rules
@pytest.mark.parametrize("t", [I32, tensor(DTYPES["U8"]), tensor(DTYPES["BOOL"]), tensor(DTYPES["I64"]),
                               Field(32), Field(16), BYTES], ids=str)
def test_float_fields_needs_a_float_tensor(t):
    with pytest.raises(ProgramError, match="float"):
        Program.op(FloatFields(grouping="s|e|m"), *raws(3)).check(t)


@pytest.mark.parametrize("bits,shift", [(8, 8), (8, 9), (16, 16), (32, 40), (1, 1), (64, 64)])
def test_low_zero_bits_shift_must_be_below_the_width(bits, shift):
    with pytest.raises(ProgramError):
        Program.op(LowZeroBits(shift=shift), RAW).check(Field(bits))


@pytest.mark.parametrize("program,t", [
    (Program.op(PackBits(), RAW), Field(8)),
    (Program.op(PackBits(), RAW), Field(3)),
    (Program.op(ZigZag(), RAW), Field(12)),
    (Program.op(Records(fields=[[1, 2]]), RAW), Field(16)),
    (Program.op(Constant(value=256)), Field(8)),
    (Program.op(Constant(value=2)), Field(1)),
    (Program.op(Sparse(value=1 << 16), *raws(3)), tensor(DTYPES["F16"])),
    (Program.op(Rank(symbols=[0, 300]), *raws(2)), Field(8)),
    (Program.op(BitFields(groups=[[[0, 4]], [[5, 3]]]), *raws(2)), Field(8)),  # a gap
    (Program.op(BitFields(groups=[[[0, 4]], [[3, 5]]]), *raws(2)), Field(8)),  # an overlap
    (Program.op(BitFields(groups=[[[0, 16]]]), RAW), Field(8)),  # wider than the word
    (Program.op(BitFields(groups=[[[0, 4]]]), RAW), Field(8)),  # short of the word
    (Program.op(Partition(context=[[0, 4]], rest=[[4, 8]], classes=[]), *raws(2)), Field(8)),
    (Program.op(Partition(context=[[0, 4]], rest=[[4, 3]], classes=[]), *raws(2)), Field(8)),
], ids=lambda v: v.describe() if isinstance(v, Program) else str(v))
def test_type_mismatch(program, t):
    with pytest.raises(ProgramError):
        program.check(t)


def test_well_typed_programs_pass():
    p = Program.op(FloatFields(grouping="e|sm"), Program.leaf(Zstd.entropy()),
                   Program.op(BytePlanes(), RAW, Program.leaf(Zstd.at_level(3))))
    assert p.check(F16) == 3
    assert Program.op(LowZeroBits(shift=16), Program.op(BytePlanes(), *raws(2))).check(F32) == 2
    assert Program.op(Constant(value=255)).check(Field(8)) == 0


# ------------------------------------------------------------ unknown ids, bad configs
@pytest.mark.parametrize("obj", [
    ["nope", {}],
    ["Raw", {}],  # ids are case-sensitive
    ["", {}],
    ["nope", {}, [["raw", {}]]],
    ["__init__", {}],
    [3, {}],
    [None, {}],
])
def test_unknown_production(obj):
    with pytest.raises(ProgramError):
        Program.from_json(obj)


ZSTD = {"level": 3, "strategy": 0, "window_log": 0, "hash_log": 0, "chain_log": 0, "min_match": 0}


@pytest.mark.parametrize("ident,config", [
    ("raw", {"level": 1}),  # unknown key
    ("raw", []),  # not an object
    ("raw", None),
    ("raw", "level=1"),
    ("raw", {"self": 1}),  # a key that is a Python parameter name
    ("zstd", {k: v for k, v in ZSTD.items() if k != "level"}),  # missing key
    ("zstd", {**ZSTD, "extra": 1}),
    ("zstd", {**ZSTD, "level": "3"}),
    ("zstd", {**ZSTD, "level": 3.0}),
    ("zstd", {**ZSTD, "level": True}),  # bool is not an int here
    ("zstd", {**ZSTD, "level": None}),
    ("zstd", {**ZSTD, "level": 23}),
    ("zstd", {**ZSTD, "level": -8}),
    ("zstd", {**ZSTD, "strategy": 10}),
    ("zstd", {**ZSTD, "window_log": 9}),
    ("zstd", {**ZSTD, "window_log": 32}),
    ("zstd", {**ZSTD, "min_match": 8}),
    ("constant", {"value": -1}),
    ("constant", {"value": 1 << 64}),
    ("constant", {"value": False}),
    ("constant", {"value": 1.0}),
    ("constant", {}),
    ("low_zero_bits", {"shift": 0}),
    ("low_zero_bits", {"shift": 64}),
    ("low_zero_bits", {"shift": "1"}),
    ("float_fields", {"grouping": "s|e"}),
    ("float_fields", {"grouping": "s|e|m|s"}),
    ("float_fields", {"grouping": "s||em"}),
    ("float_fields", {"grouping": "s|e|m|"}),
    ("float_fields", {"grouping": "sex"}),
    ("float_fields", {"grouping": ["s", "e", "m"]}),
    ("bit_fields", {"groups": []}),
    ("bit_fields", {"groups": [[]]}),
    ("bit_fields", {"groups": [[[0, 0]]]}),
    ("bit_fields", {"groups": [[[-1, 2]]]}),
    ("bit_fields", {"groups": [[[60, 8]]]}),
    ("bit_fields", {"groups": [[[0, 8, 1]]]}),
    ("bit_fields", {"groups": [[[0, True]]]}),
    ("bit_fields", {"groups": [[[0, 40], [40, 24], [0, 8]]]}),  # a group over 64 bits
    ("bit_fields", {"groups": "0:8"}),
    ("pack_bits", {"bits": 2}),
    ("byte_planes", {"order": "le"}),
    ("delta", {"stride": 0}),
    ("delta", {"stride": (1 << 26) + 1}),
    ("xor_delta", {"stride": -1}),
    ("transpose", {"cols": 0}),
    ("affine", {"step": -1}),
    ("affine", {"step": 1 << 64}),
    ("row_dedup", {"row": 0}),
    ("sparse", {"value": -1}),
    ("rank", {"symbols": [1, 1]}),
    ("rank", {"symbols": list(range(256))}),
    ("rank", {"symbols": [-1]}),
    ("rank", {"symbols": [True]}),
    ("rank", {"symbols": "abc"}),
    ("partition", {"context": [[0, 17]], "rest": [[17, 15]], "classes": []}),  # context too wide
    ("partition", {"context": [[0, 4]], "rest": [[4, 4]], "classes": [[1], [1]]}),  # a value in two classes
    ("partition", {"context": [[0, 4]], "rest": [[4, 4]], "classes": [[16]]}),  # not a context value
    ("partition", {"context": [[0, 4]], "rest": [[4, 4]], "classes": [1]}),
    ("partition", {"context": [], "rest": [[0, 8]], "classes": []}),
    ("records", {"fields": []}),
    ("records", {"fields": [[1, 3]]}),
    ("records", {"fields": [[0, 1]]}),
    ("records", {"fields": [[(1 << 16) + 1, 1]]}),
    ("records", {"fields": [[1, 1]] * 65}),
])
def test_bad_config(ident, config):
    with pytest.raises(ProgramError):
        Program.from_json([ident, config])
    if isinstance(config, dict) and "self" not in config:
        from brevis.dsl.operator import REGISTRY
        with pytest.raises(ProgramError):
            REGISTRY[ident](**config)


def test_configs_are_copied():
    groups = [[[0, 8]]]
    op = BitFields(groups=groups)
    op.config["groups"] = "changed"
    assert op.config == {"groups": [[[0, 8]]]}


# ------------------------------------------------------------ size limits
def chain(depth: int) -> list:
    """byte_planes over Field(8) nested `depth` times, ending in raw."""
    node: list = ["raw", {}]
    for _ in range(depth):
        node = ["byte_planes", {}, [node]]
    return node


# Every limit holds read alone and read with a memo of subtrees (an index's
# programs share one): a subtree found again counts as read again.
MEMOS = pytest.mark.parametrize("memo", [None, {}], ids=["alone", "memo"])


@MEMOS
def test_depth_limit(memo):
    ok = Program.from_json(chain(MAX_DEPTH), memo)
    assert ok.check(BYTES) == 1
    with pytest.raises(ProgramError, match="deep"):
        Program.from_json(chain(MAX_DEPTH + 1), memo)
    # Built in code, the checker applies the same limit.
    deep = RAW
    for _ in range(MAX_DEPTH + 1):
        deep = Program.op(BytePlanes(), deep)
    with pytest.raises(ProgramError, match="deep"):
        deep.check(BYTES)


@MEMOS
def test_very_deep_json_is_refused_without_recursion_error(memo):
    with pytest.raises(ProgramError):
        Program.from_json(chain(5000), memo)


def test_a_memo_reads_a_shared_subtree_once_and_keeps_the_limits():
    memo: dict = {}
    planes = ["byte_planes", {}, [["raw", {}], ["raw", {}]]]
    first = Program.from_json(["view", {"dtype": "U16"}, [planes]], memo)
    second = Program.from_json(["view", {"dtype": "I16"}, [planes]], memo)
    assert first.children[0] is second.children[0]  # one object, read once
    assert first == Program.from_json(first.to_json()) and second == Program.from_json(second.to_json())
    # Seen near the root, then where it goes past MAX_DEPTH.
    shallow = chain(MAX_DEPTH - 1)
    Program.from_json(shallow, memo)
    with pytest.raises(ProgramError, match="deep"):
        Program.from_json(["byte_planes", {}, [["byte_planes", {}, [shallow]]]], memo)
    # Seen whole, then as one of many children past MAX_NODES.
    hundred = ["byte_planes", {}, [["raw", {}]] * 100]  # 101 nodes, read alone (the form only, not types)
    Program.from_json(hundred, memo)
    with pytest.raises(ProgramError, match="nodes"):
        Program.from_json(["bit_fields", {"groups": [[[0, 4]], [[4, 4]], [[8, 8]]]}, [hundred] * 3], memo)


def wide(leaves_per_group: int, levels: int) -> Program:
    """bit_fields cutting a u64 into 64 one-bit fields, each passed down a chain."""
    def down(k):
        p = RAW
        for _ in range(k):
            p = Program.op(BitFields(groups=[[[0, 1]]]), p)
        return p
    return Program.op(BitFields(groups=[[[i, 1]] for i in range(64)]), *([down(levels)] * 64))


@MEMOS
def test_node_limit_from_json(memo):
    p = wide(1, 2)  # 1 + 64 * 3 = 193 nodes
    assert p.check(Field(64)) == 64
    assert Program.from_json(p.to_json(), memo) == p
    too_many = wide(1, 3)  # 1 + 64 * 4 = 257 nodes
    with pytest.raises(ProgramError, match="nodes"):
        Program.from_json(too_many.to_json(), memo)
    with pytest.raises(ProgramError, match="nodes"):
        Program.from_json(["byte_planes", {}, [["raw", {}]] * MAX_NODES], memo)


def test_node_limit_in_the_checker():
    # A program built in code must not pass the checker and then be refused
    # by every reader of the archive it was written to.
    too_many = wide(1, 3)
    assert 1 + 64 * 4 > MAX_NODES
    with pytest.raises(ProgramError, match="nodes"):
        too_many.check(Field(64))


def test_a_shared_subtree_is_checked_for_each_type_and_place():
    planes = Program.op(BytePlanes(), RAW, RAW)
    assert Program.op(FloatFields(grouping="e|sm"), RAW, planes).check(F16) == 3  # sign_mantissa: 11 bits, 2 planes
    with pytest.raises(ProgramError):  # F32's sign_mantissa has 3 planes
        Program.op(FloatFields(grouping="e|sm"), RAW, planes).check(F32)
    assert planes.check(Field(16)) == 2
    # Well typed as a root, refused below one (a base tensor only at the root)
    ref = Program.from_json(["xor_base", {}, [["raw", {}]]])
    assert ref.check(F32) == 1
    with pytest.raises(ProgramError, match="only at the root"):
        Program.op(Transpose(cols=1), ref).check(F32)


def test_a_pickled_program_hashes_as_one_made_where_it_is_unpickled():
    # A worker started by spawn has other string hashes: a production's
    # hash, cached where it was made, must not travel with it.
    p = Program.op(FloatFields(grouping="e|sm"), RAW, Program.op(BytePlanes(), RAW, Program.leaf(Zstd.at_level(3))))
    assert pickle.loads(pickle.dumps(p)) == p and hash(pickle.loads(pickle.dumps(p))) == hash(p)
    code = ("import pickle, sys; from brevis.dsl import Program; "
            "p = pickle.loads(sys.stdin.buffer.read()); q = Program.from_json(p.to_json()); "
            "print(p == q, hash(p) == hash(q), hash(p.node) == hash(q.node), len({p, q}))")
    for seed in ("1", "2"):
        out = subprocess.run([sys.executable, "-c", code], input=pickle.dumps(p), capture_output=True,
                             env={**os.environ, "PYTHONHASHSEED": seed}, check=True).stdout
        assert out.split() == [b"True", b"True", b"True", b"1"]


# ------------------------------------------------------------ describe
def test_describe_is_readable():
    p = Program.op(FloatFields(grouping="e|sm"), Program.leaf(Zstd.entropy()),
                   Program.op(BytePlanes(), RAW, Program.leaf(Zstd.at_level(3))))
    assert p.describe(F16) == ("float_fields(grouping=e|sm)[exponent: zstd(entropy), "
                               "sign_mantissa: byte_planes[byte0: raw, byte1: zstd(level=3)]]")
    assert p.describe() == "float_fields(grouping=e|sm)[zstd(entropy), byte_planes[raw, zstd(level=3)]]"
    assert Program.op(Constant(value=255)).describe(Field(8)) == "constant(0xff)"
    assert RAW.describe() == "raw"
    z = Zstd(level=19, strategy=0, window_log=27, hash_log=0, chain_log=0, min_match=0)
    assert Program.leaf(z).describe() == "zstd(level=19,window_log=27)"
    assert Program.op(Sparse(value=0), *raws(3)).describe(Field(8)) == \
        "sparse(value=0)[count: raw, gaps: raw, values: raw]"
    text = Program.op(Delta(stride=1), Program.op(ZigZag(), RAW)).describe(I32)
    assert "delta" in text and "zigzag" in text and "raw" in text
    for p in (Program.op(Affine(step=1), RAW), Program.op(Transpose(cols=4), RAW),
              Program.op(RowDedup(row=4), RAW, RAW)):
        text = p.describe(Field(16))
        assert p.node.id in text and "\n" not in text and text.count("[") == text.count("]")


def test_describe_of_an_ill_typed_program_shows_every_child():
    # bf16 sign+mantissa is 8 bits: one byte plane, but the program has two children.
    p = Program.op(FloatFields(grouping="e|sm"), RAW,
                   Program.op(BytePlanes(), RAW, Program.leaf(Zstd.at_level(3))))
    with pytest.raises(ProgramError):
        p.check(BF16)
    assert "zstd(level=3)" in p.describe(BF16)
    assert p.describe(I32) == p.describe()  # not a float: described without names


def test_describe_matches_json_roundtrip():
    p = Program.op(Partition(context=[[7, 1]], rest=[[0, 7]], classes=[[0], [1]]), *raws(4))
    q = Program.from_json(json.loads(json.dumps(p.to_json())))
    assert q.describe(Field(8)) == p.describe(Field(8))
    assert "context: raw" in p.describe(Field(8))
