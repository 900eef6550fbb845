"""The search finds known structure, and never loses to the plain fallback."""

from __future__ import annotations

import numpy as np
import pytest
import zstandard
from safetensors.numpy import save_file

import brevis
from brevis.dsl import Field, tensor
from brevis.dsl.interpreter import decode, encode
from brevis.dtypes import DTYPES
from brevis.synth.prior import Prior
from brevis.synth.proposals import Value
from brevis.synth.search import PRUNE_MAX_BYTES, Budget, search

RNG = np.random.default_rng(7)


def weights(shape, dtype=np.float32):
    return (RNG.standard_normal(shape) * 0.02).astype(dtype)


def bf16_upcast(shape):
    """f32 values that are exactly bf16 values (low 16 bits zero)."""
    return (weights(shape).view(np.uint32) & np.uint32(0xFFFF0000)).view(np.float32)


CRAFTED = {
    "constant": lambda: np.ones((256, 384), np.float32),
    "arange": lambda: np.arange(65536, dtype=np.int64),
    "upcast": lambda: bf16_upcast((256, 384)),
    "repeated_rows": lambda: np.tile(weights((1, 384)), (256, 1)),
    "sparse": lambda: np.where(RNG.random((256, 384)) < 0.01, weights((256, 384)), 0).astype(np.float32),
}


def stored_bytes(archive, name):
    for f in brevis.inspect(archive)["files"]:
        for s in f["segments"]:
            if s["name"] == name:
                return s["stored_bytes"], s["programs"][0]["program"]
    raise KeyError(name)


@pytest.mark.parametrize("kind", sorted(CRAFTED))
def test_search_finds_known_structure(tmp_path, kind):
    x = CRAFTED[kind]()
    save_file({"t": x, "noise": weights((64, 64))}, tmp_path / "m.safetensors")
    brevis.compress([tmp_path / "m.safetensors"], tmp_path / "a.brv")
    stored, program = stored_bytes(tmp_path / "a.brv", "t")
    zstd_size = len(zstandard.ZstdCompressor(level=3).compress(x.tobytes()))
    # What the structure leaves to store: nothing, one row, half the bits, the exceptions.
    floor = {"constant": 0, "arange": 0, "repeated_rows": x[0].nbytes, "upcast": x.nbytes // 2,
             "sparse": int(np.count_nonzero(x)) * 5}[kind]
    assert stored <= min(floor * 1.1 + 64, zstd_size), (kind, stored, zstd_size, program)
    brevis.decompress(tmp_path / "a.brv", tmp_path / "out")
    assert (tmp_path / "out" / "m.safetensors").read_bytes() == (tmp_path / "m.safetensors").read_bytes()


def test_exact_duplicate_tensor_is_stored_once(tmp_path):
    w = weights((512, 384))
    save_file({"a": w, "b": w.copy()}, tmp_path / "m.safetensors")
    save_file({"c": w.copy()}, tmp_path / "n.safetensors")
    brevis.compress([tmp_path], tmp_path.with_suffix(".brv"))
    info = brevis.inspect(tmp_path.with_suffix(".brv"))
    archive = info["archive_bytes"]
    single = stored_bytes(tmp_path.with_suffix(".brv"), "a")[0]
    assert archive < single * 1.2  # three copies cost about one
    assert brevis.verify(tmp_path.with_suffix(".brv"), [tmp_path])["ok"]


def test_upcast_program_drops_the_zero_bits(tmp_path):
    save_file({"t": bf16_upcast((256, 384))}, tmp_path / "m.safetensors")
    brevis.compress([tmp_path / "m.safetensors"], tmp_path / "a.brv")
    assert "low_zero_bits" in stored_bytes(tmp_path / "a.brv", "t")[1] or \
        "constant(0x0)" in stored_bytes(tmp_path / "a.brv", "t")[1]


@pytest.mark.parametrize("seed", range(6))
def test_search_never_worse_than_raw(seed):
    rng = np.random.default_rng(seed)
    bits = int(rng.choice([8, 16, 32]))
    t = Field(bits)
    x = rng.integers(0, 1 << bits, 4096, dtype=np.uint64).astype(t.container)  # incompressible
    result = search(Value([x], t), Prior(), "other", 1.0, 1, Budget(64, 5))
    size = sum(map(len, encode(result.program, x, t)))
    assert size <= x.nbytes * 1.01 + 64
    back = decode(result.program, t, len(x), [memoryview(b) for b in encode(result.program, x, t)])
    assert back.tobytes() == x.tobytes()


def test_search_estimate_is_close_on_the_sample():
    """Exact for coders measured by coding, within half a percent for
    `ans`, whose size the search takes from its model's own cost."""
    t = tensor(DTYPES["BF16"])
    x = (weights(20000).view(np.uint32) >> np.uint32(16)).astype(np.uint16)
    result = search(Value([x], t), Prior(), "mlp", 1.0, 1, Budget(400, 10))
    size = sum(map(len, encode(result.program, x, t)))
    leaves = len(result.program.leaves())
    assert size * 0.995 <= result.estimate <= size * 1.005 + 6 * leaves + 64  # + index entries, description


def test_learned_prior_expands_fewer_nodes_without_losing(tmp_path):
    tensors = {f"layer{i}.mlp.weight": weights((256, 256)) for i in range(4)}
    tensors.update({f"layer{i}.norm.weight": np.ones(256, np.float32) for i in range(4)})
    save_file(tensors, tmp_path / "m.safetensors")
    learned = brevis.learn_prior([tmp_path / "m.safetensors"])
    assert learned.learned and learned.samples >= 1
    t = tensor(DTYPES["F32"])
    x = weights(16384).view(np.uint32)
    uniform = search(Value([x], t), Prior(), "mlp", 1.0, 1, Budget(400, 10))
    guided = search(Value([x], t), learned, "mlp", 1.0, 1, Budget(400, 10))
    assert guided.expanded <= uniform.expanded
    assert guided.estimate <= uniform.estimate * 1.01


def test_prior_round_trips_through_a_file(tmp_path):
    save_file({"w": weights((128, 128))}, tmp_path / "m.safetensors")
    prior = brevis.learn_prior([tmp_path / "m.safetensors"], tmp_path / "p.json")
    again = Prior.load(tmp_path / "p.json")
    assert again.to_json() == prior.to_json()
    s = brevis.compress([tmp_path / "m.safetensors"], tmp_path / "a.brv", prior=tmp_path / "p.json")
    assert s["prior_samples"] == prior.samples
    assert brevis.verify(tmp_path / "a.brv")["ok"]


def test_effort_zero_uses_no_search(tmp_path):
    save_file({"w": weights((128, 128))}, tmp_path / "m.safetensors")
    brevis.compress([tmp_path / "m.safetensors"], tmp_path / "a.brv", effort=0)
    assert stored_bytes(tmp_path / "a.brv", "w")[1] == "zstd(entropy)"
    with pytest.raises(brevis.BrevisError):
        brevis.compress([tmp_path / "m.safetensors"], tmp_path / "b.brv", effort=9)


def searches(archive):
    return {s["name"]: (s.get("search") or {}).get("search")
            for f in brevis.inspect(archive)["files"] for s in f["segments"]}


def test_learned_programs_replace_searches_but_not_structure(tmp_path):
    # Dense layers of many shapes: most take a program learned on the sample
    # after one trial encoding; the constant and sparse tensors keep programs
    # that find their structure (a dense layer's program would not).
    tensors = {f"layer{i}.mlp.weight": weights((128 + 16 * i, 256)) for i in range(12)}
    tensors["layer0.norm.weight"] = np.ones((64, 256), np.float32)
    tensors["layer0.mask.weight"] = CRAFTED["sparse"]()
    save_file(tensors, tmp_path / "m.safetensors")
    brevis.compress([tmp_path / "m.safetensors"], tmp_path / "a.brv")
    how = searches(tmp_path / "a.brv")
    assert sum(how[f"layer{i}.mlp.weight"] == "learned" for i in range(12)) >= 8, how
    norm, _ = stored_bytes(tmp_path / "a.brv", "layer0.norm.weight")
    mask, _ = stored_bytes(tmp_path / "a.brv", "layer0.mask.weight")
    assert norm < 200 and mask < tensors["layer0.mask.weight"].size * 0.01 * 5 * 1.1 + 64
    assert brevis.verify(tmp_path / "a.brv")["ok"]


def test_prior_carries_its_learned_programs(tmp_path):
    save_file({"w": weights((128, 128))}, tmp_path / "m.safetensors")
    prior = brevis.learn_prior([tmp_path / "m.safetensors"], tmp_path / "p.json")
    assert prior.programs and all(p.relative > 0 for p in prior.programs)
    assert Prior.load(tmp_path / "p.json").programs == prior.programs
    # A prior written before programs were kept still loads; a damaged one is refused.
    obj = prior.to_json()
    del obj["programs"]
    assert Prior.from_json(obj).programs == []
    obj["programs"] = [{"kind": "T:F32", "role": "mlp", "program": ["no_such_op", {}], "relative": 1.0}]
    with pytest.raises(brevis.BrevisError):
        Prior.from_json(obj)


def test_a_prior_with_a_constant_tensors_program_loads_again(tmp_path):
    """A constant tensor's program estimates nothing (relative 0): the prior
    holding it is read back from its file, and by worker processes."""
    save_file({"w": weights((128, 128)), "norm.weight": np.ones((64, 256), np.float32)}, tmp_path / "m.safetensors")
    prior = brevis.learn_prior([tmp_path / "m.safetensors"], tmp_path / "p.json")
    assert any(p.relative == 0 for p in prior.programs)
    assert Prior.load(tmp_path / "p.json").programs == prior.programs
    obj = prior.to_json()
    obj["programs"][0]["relative"] = -1.0
    with pytest.raises(brevis.BrevisError):
        Prior.from_json(obj)


def test_large_segment_search_keeps_what_the_prior_finds():
    """A segment past PRUNE_MAX_BYTES is searched unpruned (wider); where
    that search runs out of budget, the pruned one's result still counts.
    F32 weights with 7 dead low bits (a PyTorch checkpoint's), scaled to a
    32 MiB segment: the program drops them, as on a small segment."""
    t = tensor(DTYPES["F32"])
    x = weights(65536).view(np.uint32) & np.uint32(0xFFFFFF80)
    slices = [x[i::4].copy() for i in range(4)]
    small = search(Value(slices, t), Prior(), "conv", 1.0, 1, Budget(2000, 30))
    prior = Prior(samples=1)
    prior.observe(small.program, t, "conv")
    scale = (PRUNE_MAX_BYTES * 4) / x.nbytes
    large = search(Value(slices, t), prior, "conv", scale, 32, Budget(100, 30))
    assert "low_zero_bits" in str(large.program), large.program
    assert large.estimate <= small.estimate * scale * 1.01 + 32 * 64
