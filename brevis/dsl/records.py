"""Fixed-size records: fields that are interleaved in storage, pulled apart."""

from __future__ import annotations

import numpy as np

from ..errors import FormatError, NotApplicable, ProgramError
from .operator import Operator, read_children, register
from .types import Field

try:
    from ..native import _layout
except ImportError:  # a source tree that was never built: numpy's strided copies
    _layout = None


@register
class Records(Operator):
    """Split a byte stream of fixed-size records into one stream per field.

    `fields` lists [count, width] per field in record order: `count` items
    of `width` bytes (1, 2, 4 or 8; a little-endian word). A GGUF Q8_0
    block is [[1, 2], [32, 1]]: one f16 scale, then 32 int8 quants. Child j
    holds field j of every record, in record order, as words of 8*width
    bits. Inverse: interleave the fields back into records (all read, then
    woven in one pass). Memory of the inverse: at most 3 times its output
    (the output, and the children: together as large as it).
    """

    id = "records"
    splits_records = True
    params = {"fields": list}

    @classmethod
    def validate(cls, config):
        fields = config["fields"]
        if not 1 <= len(fields) <= 64:
            raise ProgramError("records: 1 to 64 fields")
        for f in fields:
            if (not isinstance(f, list) or len(f) != 2
                    or not all(isinstance(v, int) and not isinstance(v, bool) for v in f)
                    or not 1 <= f[0] <= 1 << 16 or f[1] not in (1, 2, 4, 8)):
                raise ProgramError("records: a field is [count 1..65536, width 1|2|4|8]")

    @property
    def record_bytes(self) -> int:
        return sum(c * w for c, w in self._config["fields"])

    def output_types(self, t):
        if t.bits != 8:
            raise ProgramError(f"records needs bytes, not {t}")
        return [Field(8 * w) for _, w in self._config["fields"]]

    def output_names(self, t):
        return [f"field{i}" for i in range(len(self._config["fields"]))]

    def forward(self, x, t):
        size = self.record_bytes
        if len(x) % size:
            raise NotApplicable("not whole records")
        fields = self._config["fields"]
        if _layout is not None:  # every field in one pass (numpy's copy of a 2-byte column: 3 ns a record)
            parts = [np.empty(len(x) // size * count * width, np.uint8) for count, width in fields]
            _layout.unweave(np.ascontiguousarray(x), [count * width for count, width in fields], parts)
            return [part.view(Field(8 * width).container) for part, (_, width) in zip(parts, fields)]
        rows = x.reshape(-1, size)
        out, pos = [], 0
        for count, width in fields:
            part = np.ascontiguousarray(rows[:, pos:pos + count * width])
            out.append(part.reshape(-1).view(Field(8 * width).container))
            pos += count * width
        return out

    def held_while_reading(self, t, i, types):
        """Bytes per element held while child i decodes (see dsl/memory.py): the
        output, and the fields before (all are read, then woven at once)."""
        return t.container.itemsize + sum(self.child_share(t, j) * types[j].container.itemsize for j in range(i))

    def child_share(self, t, i):
        return self._config["fields"][i][0] / self.record_bytes  # items of field i per byte

    def child_counts(self, n, t):
        records, rest = divmod(n, self.record_bytes)
        return None if rest else tuple(records * count for count, _ in self._config["fields"])

    # Into the chunk's place: a GGUF chunk's records, built beside and then
    # copied in, cost smollm2 (98 MB of Q4_1 blocks) a copy of every byte.
    writes_into = True

    def inverse(self, n, t, read, out=None):
        size = self.record_bytes
        if n % size:
            raise FormatError("records: not whole records")
        records = n // size
        # (A place not in one piece would make reshape copy: rebuilt beside it then.)
        place = out if out is not None and out.flags.c_contiguous else np.empty(n, np.uint8)
        fields = self._config["fields"]
        parts = read_children(read, 0, [records * count for count, _ in fields])
        if _layout is not None:  # every field at once: the records' memory crossed once
            _layout.weave([np.ascontiguousarray(p) for p in parts], [count * width for count, width in fields], place)
            return place
        rows = place.reshape(records, size)
        pos = 0
        for part, (count, width) in zip(parts, fields):
            rows[:, pos:pos + count * width] = part.view(np.uint8).reshape(records, count * width)
            pos += count * width
        return place
