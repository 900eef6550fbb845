"""Coding a checkpoint against a base model (compress --base)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

import brevis
from brevis.errors import ChecksumError, InvalidArgument

RNG = np.random.default_rng(11)
PAIR = Path(os.path.expanduser("~/.cache/brevis-pairs/minilm-rohan-pristine"))


def finetune(w: np.ndarray, scale: float = 1e-3) -> np.ndarray:
    """A small relative update, as fine-tuning makes."""
    return (w * (1 + scale * RNG.standard_normal(w.shape))).astype(w.dtype)


@pytest.fixture
def pair(tmp_path):
    base = {f"layer{i}.weight": (RNG.standard_normal((256, 128)) * 0.02).astype(np.float32) for i in range(3)}
    base["norm.weight"] = np.ones(128, np.float32)
    tuned = {k: finetune(v) for k, v in base.items()}
    tuned["head.weight"] = (RNG.standard_normal((16, 128)) * 0.02).astype(np.float32)  # new in the fine-tune
    (tmp_path / "base").mkdir()
    (tmp_path / "tuned").mkdir()
    save_file(base, tmp_path / "base" / "model.safetensors")
    save_file(tuned, tmp_path / "tuned" / "model.safetensors")
    (tmp_path / "tuned" / "config.json").write_text('{"tuned": true}')
    return tmp_path


def test_delta_round_trip_and_gain(pair):
    plain = brevis.compress([pair / "tuned"], pair / "plain.brv")
    delta = brevis.compress([pair / "tuned"], pair / "delta.brv", base=pair / "base")
    assert delta["archive_bytes"] < 0.8 * plain["archive_bytes"]
    programs = [s["programs"][0]["program"] for f in brevis.inspect(pair / "delta.brv")["files"]
                for s in f["segments"] if s["name"].startswith("layer")]
    assert all(p.startswith(("xor_base", "sub_base")) for p in programs), programs
    brevis.decompress(pair / "delta.brv", pair / "out", base=pair / "base")
    for name in ("model.safetensors", "config.json"):
        assert (pair / "out" / name).read_bytes() == (pair / "tuned" / name).read_bytes()
    assert brevis.verify(pair / "delta.brv", [pair / "tuned"], base=pair / "base")["ok"]


def test_equal_tensors_against_different_base_tensors_are_not_one_chunk(tmp_path):
    """Two tensors a fine-tune left equal, coded against base tensors that
    differ: each chunk's streams rebuild its bytes only beside its own base
    tensor, so the second is not pointed at the first's streams (until
    2026-12-06 it was: it decoded to other bytes, and verify failed)."""
    a = (RNG.standard_normal(300_000) * 0.02).astype(np.float32)
    b, x = finetune(a), finetune(a)  # both base tensors near the tuned one: both chunks coded against them
    (tmp_path / "base").mkdir()
    (tmp_path / "tuned").mkdir()
    save_file({"a": a, "b": b}, tmp_path / "base" / "model.safetensors")
    save_file({"a": x, "b": x.copy()}, tmp_path / "tuned" / "model.safetensors")
    brevis.compress([tmp_path / "tuned"], tmp_path / "delta.brv", base=tmp_path / "base")
    programs = [s["programs"][0]["program"] for f in brevis.inspect(tmp_path / "delta.brv")["files"]
                for s in f["segments"] if s["name"] in ("a", "b")]
    assert len(programs) == 2 and all(p.startswith(("xor_base", "sub_base")) for p in programs), programs
    assert brevis.verify(tmp_path / "delta.brv", [tmp_path / "tuned"], base=tmp_path / "base")["ok"]
    got = brevis.unpack((tmp_path / "delta.brv").read_bytes(), base=tmp_path / "base")
    assert bytes(got["model.safetensors"]) == (tmp_path / "tuned" / "model.safetensors").read_bytes()


def test_unpack_in_memory_needs_the_base(pair):
    from brevis.errors import BaseRequired

    brevis.compress([pair / "tuned"], pair / "delta.brv", base=pair / "base")
    data = (pair / "delta.brv").read_bytes()
    with pytest.raises(BaseRequired):
        brevis.unpack(data)
    got = brevis.unpack(data, base=pair / "base", threads=2)
    for name in ("model.safetensors", "config.json"):
        assert bytes(got[name]) == (pair / "tuned" / name).read_bytes()


def test_base_may_be_an_archive(pair):
    brevis.compress([pair / "base"], pair / "base.brv")
    brevis.compress([pair / "tuned"], pair / "delta.brv", base=pair / "base.brv")
    brevis.decompress(pair / "delta.brv", pair / "out", base=pair / "base.brv")
    assert (pair / "out" / "model.safetensors").read_bytes() == (pair / "tuned" / "model.safetensors").read_bytes()
    from safetensors.numpy import load_file

    with brevis.open(pair / "delta.brv", base=pair / "base.brv") as a:
        got = a["layer1.weight"]
    want = load_file(pair / "tuned" / "model.safetensors")["layer1.weight"]
    assert got.shape == want.shape and got.tobytes() == want.tobytes()


def test_listing_needs_no_base(pair):
    """ls and inspect read the index alone: an archive made against a base
    lists without it (ls asked for --base; issue 15)."""
    brevis.compress([pair / "tuned"], pair / "delta.brv", base=pair / "base")
    listed = brevis.ls(pair / "delta.brv")
    assert listed["tensor_count"] == 5 and listed["file_count"] == 2
    assert brevis.inspect(pair / "delta.brv")["base_required"]


def test_missing_or_wrong_base_is_refused(pair):
    brevis.compress([pair / "tuned"], pair / "delta.brv", base=pair / "base")
    with pytest.raises(InvalidArgument):
        brevis.decompress(pair / "delta.brv", pair / "out")
    with pytest.raises(ChecksumError):
        brevis.verify(pair / "delta.brv", base=pair / "tuned")  # same names and shapes, other bytes
    assert not (pair / "out").exists()


def test_unrelated_base_never_makes_the_archive_larger(pair, tmp_path):
    other = {k: (RNG.standard_normal(v.shape) * 0.02).astype(np.float32)
             for k, v in [(f"layer{i}.weight", np.zeros((256, 128))) for i in range(3)]}
    (tmp_path / "other").mkdir()
    save_file(other, tmp_path / "other" / "model.safetensors")
    plain = brevis.compress([pair / "tuned"], pair / "plain.brv")
    delta = brevis.compress([pair / "tuned"], pair / "delta.brv", base=tmp_path / "other")
    assert delta["archive_bytes"] <= plain["archive_bytes"] * 1.002 + 64


@pytest.mark.skipif(not PAIR.exists(), reason="real pair not fetched (../shared/corpus/fetch-pairs.sh)")
def test_real_pair_at_most_40_percent(tmp_path):
    s = brevis.compress([PAIR / "tuned" / "model.safetensors"], tmp_path / "ft.brv", base=PAIR / "base")
    assert s["ratio"] <= 0.40, s["ratio"]
    assert brevis.verify(tmp_path / "ft.brv", [PAIR / "tuned" / "model.safetensors"], base=PAIR / "base")["ok"]


def test_a_dense_difference_takes_the_program_that_decodes_fastest(tmp_path):
    """Differences spread over the low 17 bits: one `ans` over the zigzagged
    words codes them within FAST_SLACK of any split into bit fields, and
    decodes about twice as fast (a training run decodes them link by link)."""
    w = (RNG.standard_normal((512, 256)) * 0.02).astype(np.float32)
    noise = np.round(RNG.standard_normal(w.shape) * 2 ** 15).astype(np.int32)
    (tmp_path / "base").mkdir()
    (tmp_path / "tuned").mkdir()
    save_file({"layer.weight": w}, tmp_path / "base" / "m.safetensors")
    save_file({"layer.weight": (w.view(np.int32) + noise).view(np.float32)}, tmp_path / "tuned" / "m.safetensors")
    brevis.compress([tmp_path / "tuned"], tmp_path / "d.brv", base=tmp_path / "base")
    seg = brevis.inspect(tmp_path / "d.brv")["files"][0]["segments"]
    assert [s["programs"][0]["program"] for s in seg if s["name"] == "layer.weight"] == [
        "sub_base[difference: zigzag[0: ans]]"]
    brevis.decompress(tmp_path / "d.brv", tmp_path / "out", base=tmp_path / "base")
    assert (tmp_path / "out" / "m.safetensors").read_bytes() == (tmp_path / "tuned" / "m.safetensors").read_bytes()
