"""The pickle walk: the fast path (opcodes decoded from the bytes) against genops alone."""

from __future__ import annotations

import pickle
import random
import zipfile

import numpy as np
import pytest
from formats_util import taesd_files
from torch_util import Storage, Tensor, make_legacy, pickle_storages, sample_tensors

from brevis.formats import pickle_walk


def _walk_outcome(data: bytes, start: int, fast: bool) -> str:
    try:
        return repr(pickle_walk.walk(data, start, fast=fast))  # repr: memo can make lists recursive
    except Exception as e:  # the same failure, message included: legacy reads grow on it
        return f"{type(e).__name__}: {e}"


def check_fast_walk(data: bytes, start: int = 0, *, seed: int, cuts: int = 50, flips: int = 200) -> None:
    """The fast walk finds what the genops walk finds, or fails the same way, on `data`,
    its prefixes and copies with bytes flipped."""
    rng = random.Random(seed)
    variants = [data] + [data[:rng.randrange(start, len(data))] for _ in range(cuts)]
    for _ in range(flips):
        b = bytearray(data)
        for _ in range(rng.choice((1, 2, 4))):
            i = rng.randrange(start, len(b))
            b[i] = rng.randrange(256) if rng.random() < 0.5 else b[i] ^ (1 << rng.randrange(8))
        variants.append(bytes(b))
    for v in variants:
        assert _walk_outcome(v, start, True) == _walk_outcome(v, start, False)


@pytest.mark.filterwarnings("ignore:invalid escape sequence")  # a flipped GLOBAL, in pickletools
@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
def test_fast_walk_matches_genops(fake_torch, protocol):
    arr = np.arange(24, dtype=np.float32)
    st = Storage(fake_torch.FloatStorage, "0", 24)
    obj = {"a": Tensor(st, 0, (4, 6), (6, 1)), "b": [Tensor(st, 6, (3,), (1,)), 1.5, -7, 1 << 40],
           "c": (True, None, b"raw", "x" * 300, {1, 2}), "d": [arr.dtype.name] * 3}
    pkl = pickle_storages(obj, lambda s: ("storage", s.cls, s.key, "cpu", s.numel), protocol)
    assert _walk_outcome(pkl, 0, True).startswith("Walk(")
    check_fast_walk(pkl, seed=protocol)


def test_fast_walk_matches_genops_legacy(fake_torch):
    data = make_legacy(fake_torch, sample_tensors())
    start = 0
    for _ in range(3):  # the pickles before the state dict
        start = pickle_walk.walk(data, start).end
    check_fast_walk(data, start, seed=9)


def test_taesd_fast_walk():
    p = min(taesd_files(), key=lambda p: p.stat().st_size)
    with zipfile.ZipFile(p) as z:
        (name,) = [n for n in z.namelist() if n.endswith("/data.pkl")]
        check_fast_walk(z.read(name), seed=10, cuts=20, flips=100)
