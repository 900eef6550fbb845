"""Fixtures of the format tests (tests/formats is on sys.path)."""

from __future__ import annotations

import sys
import types

import pytest

from brevis.formats.pytorch import STORAGE_DTYPES


@pytest.fixture
def fake_torch(monkeypatch):
    """Just enough of a `torch` module for pickle to name its classes (nothing is loaded back)."""
    torch = types.ModuleType("torch")
    utils = types.ModuleType("torch._utils")

    def _rebuild_tensor_v2(*args):  # pragma: no cover - never called
        raise AssertionError("unpickled")

    _rebuild_tensor_v2.__module__ = "torch._utils"
    _rebuild_tensor_v2.__qualname__ = "_rebuild_tensor_v2"
    utils._rebuild_tensor_v2 = _rebuild_tensor_v2
    torch._utils = utils
    for name in STORAGE_DTYPES:
        cls = type(name, (), {"__module__": "torch"})
        setattr(torch, name, cls)
    monkeypatch.setitem(sys.modules, "torch", torch)
    monkeypatch.setitem(sys.modules, "torch._utils", utils)
    return torch
