"""Fake PyTorch checkpoints for the tests of formats/pytorch and formats/pickle_walk:
pickles of state dicts made without torch, in zips and legacy files
(the `fake_torch` fixture, in conftest.py, names the classes they refer to)."""

from __future__ import annotations

import collections
import io
import pickle
import struct
import sys
import zipfile

import numpy as np


class Storage:
    def __init__(self, cls, key: str, numel: int):
        self.cls, self.key, self.numel = cls, key, numel


class Tensor:
    def __init__(self, storage: Storage, offset: int, size: tuple, stride: tuple):
        self.args = (storage, offset, size, stride, False, collections.OrderedDict())

    def __reduce__(self):
        return sys.modules["torch._utils"]._rebuild_tensor_v2, self.args


def pickle_storages(obj, pid, protocol: int = 2) -> bytes:
    class P(pickle.Pickler):
        def persistent_id(self, o):
            return pid(o) if isinstance(o, Storage) else None

    buf = io.BytesIO()
    P(buf, protocol=protocol).dump(obj)
    return buf.getvalue()


def make_zip(torch, tensors_: dict, *, prefix="archive", compress_pkl=False, protocol=2,
             extra: dict | None = None) -> bytes:
    """A torch.save-like zip: name -> (storage class name, np array) stored members, 64-aligned."""
    state = collections.OrderedDict()
    members = {}
    for i, (name, (cls, arr)) in enumerate(tensors_.items()):
        st = Storage(getattr(torch, cls), str(i), arr.size)
        state[name] = Tensor(st, 0, arr.shape, tuple(s // arr.itemsize for s in arr.strides))
        members[f"{prefix}/data/{i}"] = arr.tobytes()
    pkl = pickle_storages(state, lambda s: ("storage", s.cls, s.key, "cpu", s.numel), protocol)
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr(zipfile.ZipInfo(f"{prefix}/data.pkl"), pkl,
                   zipfile.ZIP_DEFLATED if compress_pkl else zipfile.ZIP_STORED)
        z.writestr(f"{prefix}/byteorder", b"little")
        for name, data in {**members, **(extra or {})}.items():
            info = zipfile.ZipInfo(name)
            pad = -(buf.tell() + 30 + len(name) + 4) % 64  # torch aligns storages to 64
            info.extra = struct.pack("<HH", 0x4246, pad) + b"Z" * pad
            z.writestr(info, data, zipfile.ZIP_STORED)
        z.writestr(f"{prefix}/version", b"3\n")
    return buf.getvalue()


def make_legacy(torch, tensors_: dict) -> bytes:
    """A pre-1.6 torch.save: five pickles, then each storage as int64 count + elements."""
    state = collections.OrderedDict()
    keys, blobs = [], []
    for i, (name, (cls, arr)) in enumerate(tensors_.items()):
        key = str(1000 + i)
        st = Storage(getattr(torch, cls), key, arr.size)
        state[name] = Tensor(st, 0, arr.shape, tuple(s // arr.itemsize for s in arr.strides))
        keys.append(key)
        blobs.append(struct.pack("<q", arr.size) + arr.tobytes())
    out = pickle.dumps(0x1950A86A20F9469CFC6C, protocol=2)
    out += pickle.dumps(1001, protocol=2)
    out += pickle.dumps({"protocol_version": 1001, "little_endian": True,
                         "type_sizes": {"short": 2, "int": 4, "long": 8}}, protocol=2)
    out += pickle_storages(state, lambda s: ("storage", s.cls, s.key, "cpu", s.numel, None))
    out += pickle.dumps(keys, protocol=2)
    return out + b"".join(blobs)


def sample_tensors():
    rng = np.random.default_rng(0)
    return {
        "conv.weight": ("HalfStorage", rng.standard_normal((8, 4, 3, 3)).astype(np.float16)),
        "conv.bias": ("FloatStorage", rng.standard_normal(16).astype(np.float32)),
        "bn.num_batches_tracked": ("LongStorage", np.array(7, dtype=np.int64)),
        "emb": ("BFloat16Storage", rng.integers(0, 1 << 16, (16, 5), dtype=np.uint16)),
        "mask": ("BoolStorage", rng.integers(0, 2, 100).astype(np.bool_)),
        "q": ("CharStorage", rng.integers(-128, 128, 65, dtype=np.int8)),
    }


# num_batches_tracked (8 bytes) is under MIN_TENSOR_BYTES: it stays in the bytes around it
EXPECT = {"conv.weight": ("F16", (8, 4, 3, 3)), "conv.bias": ("F32", (16,)),
          "emb": ("BF16", (16, 5)), "mask": ("BOOL", (100,)), "q": ("I8", (65,))}
