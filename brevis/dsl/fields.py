"""Operators that take a word apart into bit fields, and put it back."""

from __future__ import annotations

import numpy as np

from ..errors import NotApplicable, ProgramError
from .operator import Operator, ReadChild, register
from .types import Field, Tensor


def _check_ranges(groups: list) -> None:
    if not isinstance(groups, list) or not groups:
        raise ProgramError("bit_fields: groups must be a non-empty list")
    for group in groups:
        if not isinstance(group, list) or not group:
            raise ProgramError("bit_fields: each group is a non-empty list of [low, width]")
        width_sum = 0
        for r in group:
            if (not isinstance(r, list) or len(r) != 2
                    or not all(isinstance(v, int) and not isinstance(v, bool) for v in r)):
                raise ProgramError("bit_fields: a range is [low, width] of integers")
            low, width = r
            if low < 0 or width < 1 or low + width > 64:
                raise ProgramError(f"bit_fields: range {r} is outside a 64-bit word")
            width_sum += width
        if width_sum > 64:
            raise ProgramError("bit_fields: a group is wider than 64 bits")


def check_tiling(groups: list, t: Field, who: str) -> None:
    """ProgramError unless the bit ranges of the groups tile t's word exactly."""
    pos = 0
    for low, width in sorted(r for g in groups for r in g):
        if low != pos:
            break
        pos += width
    else:
        if pos == t.bits:
            return
    raise ProgramError(f"{who}: ranges do not tile a {t.bits}-bit word")


def _split(x: np.ndarray, groups: list[list[list[int]]]) -> list[np.ndarray]:
    word = x.dtype.type
    out = []
    for group in groups:
        width = sum(w for _, w in group)
        acc = None
        for low, w in group:  # the first range lands in the high bits
            part = (x >> word(low)) & word((1 << w) - 1) if low or w < 8 * x.itemsize else x
            acc = part if acc is None else (acc << word(w)) | part
        out.append(acc.astype(Field(width).container, copy=False))
    return out


def _join(n: int, t: Field, groups, values: list[np.ndarray]) -> np.ndarray:
    word = t.container.type
    x = np.zeros(n, dtype=t.container)
    for group, value in zip(groups, values):
        v = value.astype(t.container, copy=False)
        for low, w in reversed(group):
            x |= (v & word((1 << w) - 1)) << word(low)
            v = v >> word(w)
    return x


class BitFields(Operator):
    """Cut each word into groups of bit ranges; each group becomes a field.

    A group is a list of [low, width] ranges, packed high-to-low into one
    field. The ranges of all groups must tile the input word exactly.
    Inverse: shift every range back to its place and OR them together.
    """

    id = "bit_fields"
    params = {"groups": list}

    @classmethod
    def validate(cls, config):
        _check_ranges(config["groups"])

    def groups(self, t: Field) -> list[list[list[int]]]:
        return self._config["groups"]

    def output_types(self, t: Field) -> list[Field]:
        groups = self.groups(t)
        check_tiling(groups, t, self.id)
        return [Field(sum(w for _, w in g)) for g in groups]

    def forward(self, x, t):
        return _split(x, self.groups(t))

    def inverse(self, n, t, read: ReadChild):
        groups = self.groups(t)
        return _join(n, t, groups, [read(i, n) for i in range(len(groups))])


@register
class FloatFields(BitFields):
    """Split floats into sign (s), exponent (e) and mantissa (m) fields.

    `grouping` names the fields, groups separated by '|': "s|e|m" gives three
    fields, "e|sm" the exponent and sign+mantissa in one. Works for every
    float dtype. Inverse: reassemble the bit pattern from the fields.
    """

    id = "float_fields"
    params = {"grouping": str}

    @classmethod
    def validate(cls, config):
        g = config["grouping"]
        if sorted(g.replace("|", "")) != ["e", "m", "s"] or "" in g.split("|"):
            raise ProgramError(f"float_fields: bad grouping {g!r}")

    def groups(self, t: Field) -> list[list[list[int]]]:
        if not isinstance(t, Tensor) or not t.dtype.is_float:
            raise ProgramError(f"float_fields needs a float tensor, not {t}")
        m = t.dtype.mantissa_bits
        e = t.dtype.exponent_bits
        ranges = {"s": [m + e, 1], "e": [m, e], "m": [0, m]}
        return [[ranges[c] for c in g] for g in self._config["grouping"].split("|")]

    def output_names(self, t):
        names = {"s": "sign", "e": "exponent", "m": "mantissa"}
        return ["_".join(names[c] for c in g) for g in self._config["grouping"].split("|")]


register(BitFields)


@register
class LowZeroBits(Operator):
    """Drop low bits that are zero in every element (an f32 upcast from bf16).

    Forward: x >> shift, refused if a dropped bit is set. Inverse: x << shift.
    """

    id = "low_zero_bits"
    params = {"shift": int}

    @classmethod
    def validate(cls, config):
        if not 1 <= config["shift"] <= 63:
            raise ProgramError("low_zero_bits: shift must be in 1..63")

    def output_types(self, t):
        if self._config["shift"] >= t.bits:
            raise ProgramError(f"low_zero_bits: cannot drop {self._config['shift']} of {t} bits")
        return [Field(t.bits - self._config["shift"])]

    def forward(self, x, t):
        word = x.dtype.type
        shift = self._config["shift"]
        if np.any(x & word((1 << shift) - 1)):
            raise NotApplicable("low bits are not all zero")
        return [(x >> word(shift)).astype(Field(t.bits - shift).container)]

    def inverse(self, n, t, read):
        v = read(0, n).astype(t.container)
        return v << t.container.type(self._config["shift"])


@register
class PackBits(Operator):
    """Pack a field of 1, 2 or 4 bits into bytes, 8/bits values per byte.

    Inverse: unpack the bytes and drop the padding of the last byte.
    """

    id = "pack_bits"
    params: dict = {}

    def output_types(self, t):
        if t.bits not in (1, 2, 4):
            raise ProgramError(f"pack_bits needs a 1, 2 or 4-bit field, not {t}")
        return [Field(8)]

    def output_names(self, t):
        return ["packed"]

    @staticmethod
    def packed_length(n: int, bits: int) -> int:
        per = 8 // bits
        return (n + per - 1) // per

    def forward(self, x, t):
        per = 8 // t.bits
        padded = np.zeros(self.packed_length(len(x), t.bits) * per, np.uint8)
        padded[: len(x)] = x
        lanes = padded.reshape(-1, per)
        out = np.zeros(len(lanes), np.uint8)
        for i in range(per):
            out |= lanes[:, i] << np.uint8(i * t.bits)
        return [out]

    def inverse(self, n, t, read):
        per = 8 // t.bits
        packed = read(0, self.packed_length(n, t.bits))
        if t.bits == 1:
            return np.unpackbits(packed, bitorder="little")[:n]
        mask = np.uint8((1 << t.bits) - 1)
        lanes = np.empty((len(packed), per), np.uint8)
        for i in range(per):
            np.bitwise_and(packed >> np.uint8(i * t.bits), mask, out=lanes[:, i])
        return lanes.reshape(-1)[:n]
