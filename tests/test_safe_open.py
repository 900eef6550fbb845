"""A path into PyTorch and Hugging Face (issue 15, item 8): brevis.safe_open
and brevis.load_file as safetensors has them, torch tensors (BF16
included, on the decoded bytes), state_dict(), stored files by path,
plain names across shards, and decompressing what from_pretrained reads.

torch is optional: tests that need it are skipped without it, and its
absence is tested by hiding it."""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

import brevis
from brevis.access import BitsWarning
from brevis.errors import InvalidArgument
from helpers import write_safetensors

RNG = np.random.default_rng(15)
BF16 = RNG.integers(0, 1 << 16, 6 * 5, dtype=np.uint16)
BF16[0] = 0x3F80  # 1.0
F32 = RNG.standard_normal(12).astype(np.float32)
I64 = np.arange(7, dtype=np.int64)
CONFIG = '{"model_type": "llama", "hidden_size": 8}\n'


@pytest.fixture(scope="module")
def sharded(tmp_path_factory) -> tuple[Path, Path]:
    """A sharded Hugging Face checkpoint: two safetensors shards, an index,
    a config and a tokenizer file."""
    folder = tmp_path_factory.mktemp("hf")
    src = folder / "model"
    src.mkdir()
    write_safetensors(src / "model-00001-of-00002.safetensors",
                      {"model.embed.weight": ("BF16", (6, 5), BF16.tobytes()),
                       "model.norm.weight": ("F32", (12,), F32.tobytes())}, metadata={"format": "pt"})
    write_safetensors(src / "model-00002-of-00002.safetensors",
                      {"lm_head.weight": ("BF16", (6, 5), BF16[::-1].copy().tobytes()),
                       "model.positions": ("I64", (7,), I64.tobytes())}, metadata={"format": "pt"})
    (src / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {}}))
    (src / "config.json").write_text(CONFIG)
    (src / "tokenizer.json").write_text('{"version": "1.0"}')
    (src / "pytorch_model.bin").write_bytes(b"\0" * 1000)  # a second copy a loader would skip
    archive = folder / "model.brv"
    brevis.compress([src], archive, effort=0)
    return src, archive


def test_plain_names_across_shards(sharded):
    _, archive = sharded
    with brevis.open(archive) as ckpt:
        assert list(ckpt) == ["model.embed.weight", "model.norm.weight", "lm_head.weight", "model.positions"]
        assert ckpt.key("model-00002-of-00002.safetensors::lm_head.weight") == "lm_head.weight"  # still works
        assert ckpt["model-00001-of-00002.safetensors::model.norm.weight"].tobytes() == F32.tobytes()


def test_read_a_stored_file(sharded):
    src, archive = sharded
    with brevis.open(archive) as ckpt:
        assert ckpt.read_file("config.json") == CONFIG.encode()
        shard = "model-00001-of-00002.safetensors"
        assert ckpt.read_file(shard) == (src / shard).read_bytes()
        assert "tokenizer.json" in ckpt.paths()
        with pytest.raises(InvalidArgument, match="no file"):
            ckpt.read_file("missing.json")


def test_numpy_framework(sharded):
    _, archive = sharded
    with warnings.catch_warnings():
        warnings.simplefilter("error", BitsWarning)
        with brevis.safe_open(archive, framework="np") as f:
            assert f.keys()[0] == "model.embed.weight"
            norm = f.get_tensor("model.norm.weight")
            assert norm.dtype == np.float32 and norm.tobytes() == F32.tobytes() and norm.flags.writeable
            assert f.get_slice("model.positions")[2:4].tolist() == [2, 3]
            assert f.get_slice("model.embed.weight").get_shape() == [6, 5]
            assert f.read_file("config.json") == CONFIG.encode()


def test_numpy_bf16_without_ml_dtypes_is_bits_with_a_warning(sharded, monkeypatch):
    _, archive = sharded
    monkeypatch.setitem(sys.modules, "ml_dtypes", None)  # import fails
    with brevis.safe_open(archive, framework="np") as f, pytest.warns(BitsWarning, match="ml_dtypes"):
        w = f.get_tensor("model.embed.weight")
    assert w.dtype == np.uint16 and w.tobytes() == BF16.tobytes()


def test_without_torch(sharded, monkeypatch):
    _, archive = sharded
    monkeypatch.setitem(sys.modules, "torch", None)  # import fails
    with pytest.raises(InvalidArgument, match="torch is not installed"):
        brevis.safe_open(archive)  # framework="pt" by default, as safetensors.torch
    with pytest.raises(InvalidArgument, match="torch is not installed"):
        brevis.load_file(archive)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", BitsWarning)
        numpy_dict = brevis.load_file(archive, framework="np")
    assert sorted(numpy_dict) == sorted(
        ["model.embed.weight", "model.norm.weight", "lm_head.weight", "model.positions"])
    with pytest.raises(InvalidArgument, match="not supported"):
        brevis.safe_open(archive, framework="tf")


def test_torch_tensors_bf16_without_a_copy(sharded, monkeypatch):
    torch = pytest.importorskip("torch")
    _, archive = sharded
    made = []
    frombuffer = torch.frombuffer

    def spy(buffer, *args, **kwargs):
        t = frombuffer(buffer, *args, **kwargs)
        made.append((np.asarray(buffer).ctypes.data, t))
        return t

    monkeypatch.setattr(torch, "frombuffer", spy)
    with brevis.safe_open(archive, framework="pt") as f:
        w = f.get_tensor("model.embed.weight")
        assert w.dtype == torch.bfloat16 and tuple(w.shape) == (6, 5)
        assert w.view(torch.int16).numpy().view(np.uint16).tobytes() == BF16.tobytes()
        assert w[0, 0].item() == 1.0
        address, made_t = made[-1]
        assert w.data_ptr() == address  # the decoded bytes themselves: no copy
        sd = f.state_dict()
    assert list(sd) == ["model.embed.weight", "model.norm.weight", "lm_head.weight", "model.positions"]
    assert sd["model.positions"].dtype == torch.int64 and sd["model.positions"].tolist() == list(range(7))
    assert sd["model.norm.weight"].numpy().tobytes() == F32.tobytes()


def test_load_file_matches_safetensors(sharded):
    torch = pytest.importorskip("torch")
    from safetensors.torch import load_file as st_load

    src, archive = sharded
    expected = {}
    for shard in sorted(src.glob("*.safetensors")):
        expected.update(st_load(shard))
    got = brevis.load_file(archive)
    assert list(got) == list(expected) or sorted(got) == sorted(expected)
    for name, t in expected.items():
        assert got[name].dtype == t.dtype and got[name].shape == t.shape
        assert torch.equal(got[name].view(torch.uint8) if t.dtype == torch.bfloat16 else got[name],
                           t.view(torch.uint8) if t.dtype == torch.bfloat16 else t), name
    empty_and_scalar = src.parent / "odd"
    empty_and_scalar.mkdir()
    write_safetensors(empty_and_scalar / "m.safetensors",
                      {"empty": ("F32", (0, 4), b""), "scalar": ("BF16", (), b"\x80\x3f")})
    brevis.compress([empty_and_scalar], src.parent / "odd.brv", effort=0)
    odd = brevis.load_file(src.parent / "odd.brv")
    assert odd["empty"].shape == (0, 4) and odd["scalar"].shape == () and odd["scalar"].item() == 1.0


def test_decompress_what_from_pretrained_reads(sharded, tmp_path):
    """The documented way to a folder from_pretrained reads: the config, the
    tokenizer and the safetensors shards with their index, nothing else."""
    src, archive = sharded
    out = tmp_path / "hf"
    s = brevis.decompress(archive, out, only="*.json,*.safetensors")
    got = sorted(p.name for p in out.iterdir())
    assert got == ["config.json", "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
                   "model.safetensors.index.json", "tokenizer.json"]
    assert s["file_count"] == 5
    for name in got:
        assert (out / name).read_bytes() == (src / name).read_bytes()
