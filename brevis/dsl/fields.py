"""Operators that take a word apart into bit fields, and put it back."""

from __future__ import annotations

import numpy as np

from ..errors import FormatError, NotApplicable, ProgramError
from .operator import Operator, ReadChild, register
from .types import Field, Tensor

try:
    from ..native import _layout
except ImportError:  # a source tree that was never built: numpy's passes
    _layout = None


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


def _extract(x: np.ndarray, low: int, w: int, pos: int, dtype: np.dtype, out=None) -> np.ndarray:
    """((x >> low) & (2^w - 1)) << pos, as `dtype`, in one or two passes.

    The shift writes straight into the (narrower) output with an unsafe
    cast: integer narrowing drops the high bits exactly, so where nothing
    survives above the range the mask is not needed at all.
    """
    xbits = 8 * x.itemsize
    word = x.dtype.type
    if out is None:
        out = np.empty(len(x), dtype)
    field_mask = ((1 << w) - 1) << pos  # fits x's word: pos + w <= the field's width <= xbits
    shift = low - pos
    if shift == 0:
        if pos == 0 and w == xbits:
            np.copyto(out, x, casting="unsafe")
        else:
            np.bitwise_and(x, word(field_mask), out=out, casting="unsafe")
        return out
    if shift > 0:
        np.right_shift(x, word(shift), out=out, casting="unsafe")
        # Bits below `low` are gone when the range lands at 0; bits above it are gone
        # when it reaches the top of x or the output is exactly w bits wide.
        clean = pos == 0 and (low + w == xbits or w == 8 * out.itemsize)
    else:
        np.left_shift(x, word(-shift), out=out, casting="unsafe")
        clean = False
    if not clean:
        out &= out.dtype.type(field_mask)
    return out


def _split(x: np.ndarray, groups: list[list[list[int]]]) -> list[np.ndarray]:
    out = []
    for group in groups:
        width = sum(w for _, w in group)
        container = Field(width).container
        if len(group) == 1 and group[0] == [0, 8 * x.itemsize] and container == x.dtype:
            out.append(x)  # the whole word: no copy
            continue
        pos = width
        acc = tmp = None
        for low, w in group:  # the first range lands in the high bits
            pos -= w
            if acc is None:
                acc = _extract(x, low, w, pos, container)
            else:
                tmp = _extract(x, low, w, pos, container, tmp)
                acc |= tmp
        out.append(acc)
    return out


def _join(n: int, t: Field, groups, values, out: np.ndarray | None = None) -> np.ndarray:
    """The words of t rebuilt from one value per group (in `out`, where
    given, by the C kernel). `values` may be an iterator that decodes each
    child when it is reached: one child is held at a time, besides the
    output and one temporary of the output's size."""
    container = t.container
    if _layout is not None:  # one pass per range in C, no temporary
        x, first = (np.empty(n, container) if out is None else out), True
        values = iter(values)
        for group in groups:
            _layout.join(np.ascontiguousarray(next(values)), [tuple(r) for r in group], x, first)
            first = False  # the child is freed before the next one is decoded
        if first:
            x[:] = 0
        return x
    word = container.type
    x = tmp = None
    values = iter(values)
    for group in groups:
        value = next(values)
        value_bits = 8 * value.itemsize
        pos = 0
        for low, w in reversed(group):
            # ((value >> pos) & mask) << low, widened to the word in the same pass as the
            # shift (the ufunc's dtype casts its input). The mask drops the bits of value
            # below pos (other ranges of the group) and above pos + w (a stream holding
            # more than its field, which must not spill into other ranges); there are
            # none when the range starts at bit 0 of value and is as wide as its container.
            if x is None:
                part = x = np.empty(n, container)  # the first range is the start of x
            else:
                if tmp is None:
                    tmp = np.empty(n, container)
                part = tmp
            mask = word(((1 << w) - 1) << low)
            whole = pos == 0 and w >= value_bits
            shift = low - pos
            if shift > 0:
                np.left_shift(value, word(shift), out=part, dtype=container, casting="unsafe")
                if not whole:
                    part &= mask
            elif shift < 0:
                np.right_shift(value, word(-shift), out=part, dtype=container, casting="unsafe")
                part &= mask
            elif whole:
                np.copyto(part, value, casting="unsafe")
            else:
                np.bitwise_and(value, mask, out=part, dtype=container, casting="unsafe")
            if part is not x:
                x |= part
            pos += w
        value = part = None  # this child is done: freed before the next one is decoded
    if x is None:
        x = np.zeros(n, dtype=container)
    return x


class BitFields(Operator):
    """Cut each word into groups of bit ranges; each group becomes a field.

    A group is a list of [low, width] ranges, packed high-to-low into one
    field. The ranges of all groups must tile the input word exactly.
    Inverse: shift every range back to its place and OR them together.
    Memory of the inverse: at most 3 times its output: the output, one
    temporary of its size, and one child at a time (a 1-bit field is held
    as bytes: the child of a u8 word's 1-bit group is as large as the
    output).
    """

    id = "bit_fields"
    keeps_order = True
    delta_children = True
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

    def held_while_reading(self, t, i, types):
        """Bytes per element held while child i decodes (see dsl/memory.py): the
        output and its temporary, once the first child is in."""
        return 2 * t.container.itemsize if i else 0

    writes_into = True

    def inverse(self, n, t, read: ReadChild, out=None):
        groups = self.groups(t)
        return _join(n, t, groups, (read(i, n) for i in range(len(groups))), out)


@register
class FloatFields(BitFields):
    """Split floats into sign (s), exponent (e) and mantissa (m) fields.

    `grouping` names the fields, groups separated by '|': "s|e|m" gives three
    fields, "e|sm" the exponent and sign+mantissa in one. Works for every
    float dtype. Inverse: reassemble the bit pattern from the fields.
    Memory of the inverse: at most 3 times its output (as bit_fields).
    """

    id = "float_fields"
    # Inherited from bit_fields but not declared: the search has never tried
    # delta on sign, exponent and mantissa fields (archives depend on it).
    delta_children = False
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
    Memory of the inverse: at most 3 times its output.
    """

    id = "low_zero_bits"
    keeps_order = True
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
        out = np.empty(len(x), Field(t.bits - shift).container)
        return [np.right_shift(x, word(shift), out=out, casting="unsafe")]

    # The child's value, widened first (the shift keeps every bit), shifted
    # straight into the chunk's place.
    writes_into = True

    def inverse(self, n, t, read, out=None):
        v = read(0, n)
        shift = t.container.type(self._config["shift"])
        if out is None:
            return v.astype(t.container) << shift
        return np.left_shift(v.astype(t.container, copy=False), shift, out=out)


@register
class PackBits(Operator):
    """Pack a field of 1, 2 or 4 bits into bytes, 8/bits values per byte.

    Inverse: unpack the bytes and drop the padding of the last byte.
    Memory of the inverse: at most 4 times its output (its output is bytes).
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

    # Packing and unpacking view groups of 8/bits bytes as one little-endian word and
    # shift the lanes onto each other: a few whole-array passes, no per-lane loop.
    _WORDS = {2: np.dtype("<u4"), 4: np.dtype("<u2")}

    def forward(self, x, t):
        bits = t.bits
        per = 8 // bits
        x = np.ascontiguousarray(x, dtype=np.uint8)
        if bits == 1:  # values are 0 or 1: packbits' "nonzero" is the bit itself
            return [np.packbits(x, bitorder="little")]
        n = len(x)
        full = n // per
        out = np.empty(self.packed_length(n, bits), np.uint8)
        words = x[: full * per].view(self._WORDS[bits])
        # Byte i of a word holds lane i; lane i belongs at bits i*bits of the packed byte,
        # i.e. it moves down by i*(8 - bits). The low byte of the OR is the packed byte.
        word = words.dtype.type
        acc = np.right_shift(words, word(8 - bits))
        if per > 2:
            tmp = np.empty_like(words)
            for i in range(2, per):
                np.right_shift(words, word(i * (8 - bits)), out=tmp)
                acc |= tmp
        np.bitwise_or(words, acc, out=out[:full], casting="unsafe")
        if full < len(out):  # the last, partly padded byte
            out[full] = sum(int(v) << (i * bits) for i, v in enumerate(x[full * per:]))
        return [out]

    def child_share(self, t, i):
        return t.bits / 8  # packed bytes per element (see dsl/memory.py)

    def child_counts(self, n, t):
        return (self.packed_length(n, t.bits),)

    def inverse(self, n, t, read):
        bits = t.bits
        packed = read(0, self.packed_length(n, bits))
        if _layout is not None:  # one pass in C
            out = np.empty(n, np.uint8)
            try:
                _layout.unpack(np.ascontiguousarray(packed, dtype=np.uint8), bits, out)
            except ValueError as e:
                raise FormatError(f"pack_bits: {e}") from None
            return out
        if bits == 1:
            return np.unpackbits(packed, bitorder="little")[:n]
        wtype = self._WORDS[bits]
        word = wtype.type
        # Widen each byte to a word, copy it into every lane shifted up by i*(8 - bits),
        # then keep the low `bits` of each lane: byte i of the word is lane i.
        acc = np.left_shift(packed, word(8 - bits), dtype=wtype)
        if bits == 2:
            tmp = np.empty_like(acc)
            for i in range(2, 4):
                acc |= np.left_shift(packed, word(i * (8 - bits)), out=tmp, dtype=wtype)
        acc |= packed  # lane 0
        lane_mask = int.from_bytes(bytes([(1 << bits) - 1]) * wtype.itemsize, "little")
        acc &= word(lane_mask)
        return acc.view(np.uint8)[:n]
