"""Temporaries of outputs being written (fs/atomic.py)."""

from __future__ import annotations

import os
import re
import tempfile

import pytest

from brevis.fs.atomic import TEMP_SUFFIX, is_temp_name, temp_prefix


@pytest.mark.parametrize("name", ["x.brv", "model", ".hidden", "a.b.c", "é.brv", os.fsdecode(b"\xff\xfe.brv"),
                                  "n" * 300])
def test_a_temporary_is_recognized_as_the_regular_expression_did(name, tmp_path):
    prefix = os.fsencode(temp_prefix(name))
    pattern = re.compile(re.escape(prefix) + rb"[a-z0-9_]{8}" + re.escape(TEMP_SUFFIX.encode()))
    fd, made = tempfile.mkstemp(prefix=temp_prefix(name), suffix=TEMP_SUFFIX, dir=tmp_path)
    os.close(fd)
    real = os.fsencode(os.path.basename(made))
    middle = real[len(prefix):len(prefix) + 8]
    others = [real, prefix + b"abcdefgh" + b".partial", prefix + b"abc_0129" + b".partial",
              prefix + b"abcdefg" + b".partial", prefix + b"abcdefghi" + b".partial",
              prefix + b"ABCDEFGH" + b".partial", prefix + b"abcd-fgh" + b".partial",
              prefix + middle + b".partia", prefix + middle + b".partial.", prefix[:-1] + middle + b".partial",
              b"x" + prefix + middle + b".partial", prefix + middle, b"", prefix + b"\xe9bcdefgh.partial"]
    for entry in others:
        assert is_temp_name(entry, prefix) == bool(pattern.fullmatch(entry)), entry
    assert is_temp_name(real, prefix)
