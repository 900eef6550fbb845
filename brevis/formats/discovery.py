"""Cutting a file no parser knows, from its bytes alone.

Numbers stored by an unknown format are words of 2, 4 or 8 bytes from
some offset on; the search reads an opaque span as 2- and 4-byte words
(see synth/proposals.py, WORD_VIEWS), which only works where the words
start at the span's start. Here a sample of the file tells the offset:
at the right phase, one byte of every word (a float's exponent, an
integer's high byte) is far more predictable than at the others. The
file is then cut into the bytes before that phase and the rest, so that
the rest starts on a word. A wrong guess only costs ratio: the cut is
just two byte segments.
"""

from __future__ import annotations

from typing import BinaryIO

import numpy as np

from . import Segment, opaque

SAMPLE_BYTES = 1 << 18  # from the middle of the file
MIN_FILE_BYTES = 1 << 16  # smaller files keep one segment
STRIDES = (4, 2)
MIN_GAIN = 0.01  # of the sample's bits: a phase must win by this much to cut


def _pair_bits(sample: np.ndarray, stride: int, at: int) -> float:
    """Order-0 entropy, in bits, of the little-endian 16-bit pairs that
    start `at` bytes into every `stride`-byte step of the sample."""
    n = (len(sample) - at - 2) // stride
    pairs = sample[at: at + n * stride].reshape(n, stride)[:, :2] if stride > 2 else \
        sample[at: at + n * 2].reshape(n, 2)
    values = pairs[:, 0].astype(np.intp) | pairs[:, 1].astype(np.intp) << 8
    counts = np.bincount(values, minlength=1 << 16).astype(np.float64)
    counts = counts[counts > 0]
    return (n * np.log2(n) - (counts * np.log2(counts)).sum()) / n


def phase(sample: np.ndarray) -> int:
    """The offset (mod the word size) at which the sample's bytes read best
    as words; 0 where no offset wins clearly. Order-0 statistics of each
    byte plane do not change with the phase (the same planes, rotated);
    the joint statistics of a word's top two bytes do: at the right phase
    they are a float's sign, exponent and top mantissa bits together (or
    an integer's high bytes), at a wrong one two unrelated bytes."""
    best_phase, best_bits = 0, None
    for stride in STRIDES:
        top = stride - 2  # the top two bytes of a little-endian word
        bits = [_pair_bits(sample, stride, p + top) for p in range(stride)]
        p = int(np.argmin(bits))
        if p and bits[0] - bits[p] > MIN_GAIN * 16 and (best_bits is None or bits[p] < best_bits):
            best_phase, best_bits = p, bits[p]
    return best_phase


def cut(f: BinaryIO, size: int) -> list[Segment]:
    """The segments of an unparsed file: one, or the bytes before the
    phase its words start at and the rest."""
    if size < MIN_FILE_BYTES:
        return opaque(size)
    start = max(0, size // 2 - SAMPLE_BYTES // 2)
    start -= start % 8  # the sample's phase is the file's
    f.seek(start)
    sample = np.frombuffer(f.read(SAMPLE_BYTES), dtype=np.uint8)
    if len(sample) < 1024:
        return opaque(size)
    p = phase(sample)
    if not p:
        return opaque(size)
    return [Segment(0, p, "__header__"), Segment(p, size - p)]
