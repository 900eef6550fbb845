"""Recoding symbols: frequency ranks with a bound, and context partitions."""

from __future__ import annotations

import numpy as np

from ..errors import FormatError, ProgramError
from .fields import _check_ranges, _join, _split, check_tiling
from .operator import Operator, read_children, register
from .types import Field

try:
    from ..native import _layout
except ImportError:  # a source tree that was never built: numpy's passes
    _layout = None

MAX_LUT_BITS = 16  # lookup tables index values of at most this many bits
# Gathers and sorts run block by block: np.take converts its indices to intp and a
# stable argsort of bytes writes intp positions, and on a block that fits in cache
# both run about twice as fast as on a whole chunk at once.
BLOCK = 1 << 16
FEW_CLASSES = 12  # partition: up to this many sub-streams, no sort (see Partition)


def _take(table: np.ndarray, index: np.ndarray) -> np.ndarray:
    """table[index], block by block."""
    out = np.empty(len(index), dtype=table.dtype)
    for i in range(0, len(index), BLOCK):
        np.take(table, index[i:i + BLOCK], out=out[i:i + BLOCK])
    return out


def _table(keys: list[int], codes: np.ndarray, default: int, bits: int) -> np.ndarray:
    lut = np.full(1 << bits, default, dtype=codes.dtype)
    if keys:
        lut[np.array(keys, dtype=np.int64)] = codes
    return lut


def _lookup(values: np.ndarray, keys: list[int], codes: np.ndarray, default: int, bits: int) -> np.ndarray:
    """codes[j] where values == keys[j], `default` elsewhere."""
    if bits <= MAX_LUT_BITS:
        return _take(_table(keys, codes, default, bits), values)
    out = np.full(len(values), default, dtype=codes.dtype)
    if keys:
        order = np.argsort(keys)
        sorted_keys = np.array(keys, dtype=np.uint64)[order]
        at = np.searchsorted(sorted_keys, values.astype(np.uint64, copy=False))
        at_clipped = np.minimum(at, len(keys) - 1)
        hit = sorted_keys[at_clipped] == values
        out[hit] = codes[order][at_clipped[hit]]
    return out


@register
class Rank(Operator):
    """Replace symbols by their rank in `symbols` (most frequent first).

    Ranks below T = len(symbols) go to the first child; a symbol outside the
    table gets rank T and its value goes to the exceptions child. Inverse:
    look ranks up in the table, take escaped values from the exceptions.
    Memory of the inverse: at most 4 times its output (bytes: the ranks,
    which are escaped, the exceptions, the output).
    """

    id = "rank"
    delta_children = True
    ranked_children = True
    params = {"symbols": list}

    @classmethod
    def validate(cls, config):
        s = config["symbols"]
        if len(s) > 255 or not all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 1 << 64 for v in s):
            raise ProgramError("rank: symbols are at most 255 unsigned 64-bit integers")
        if len(set(s)) != len(s):
            raise ProgramError("rank: symbols repeat")

    def output_types(self, t):
        if any(v >> t.bits for v in self._config["symbols"]):
            raise ProgramError(f"rank: a symbol does not fit in {t}")
        return [Field(max(1, len(self._config["symbols"]).bit_length())), Field(t.bits)]

    def output_names(self, t):
        return ["ranks", "exceptions"]

    def forward(self, x, t):
        symbols = self._config["symbols"]
        ranks = _lookup(x, symbols, np.arange(len(symbols), dtype=np.uint8), len(symbols), t.bits)
        return [ranks, x[ranks == len(symbols)].astype(t.container, copy=False)]

    def held_while_reading(self, t, i, types):
        """Bytes per element held while child i decodes (see dsl/memory.py): for the
        exceptions, the ranks, the output and which elements are escaped."""
        return types[0].container.itemsize + t.container.itemsize + 1 if i else 0

    def child_counts(self, n, t):
        return (n, None)  # the exceptions: as many as ranks escape

    writes_into = True

    def inverse(self, n, t, read, out=None):
        symbols = self._config["symbols"]
        T = len(symbols)
        ranks = read(0, n)  # small unsigned integers: index the table directly
        table = np.array(symbols + [0], dtype=t.container)
        if _layout is not None:  # one pass in C, and one more only where ranks escape
            out = np.empty(n, t.container) if out is None else out
            ranks = np.ascontiguousarray(ranks, dtype=np.uint8)
            try:
                count = _layout.lookup(ranks, table, out)
            except ValueError:
                raise FormatError("rank: rank above the table") from None
            exceptions = read(1, count)
            if count:
                _layout.patch(ranks, T, np.ascontiguousarray(exceptions, dtype=t.container), out)
            return out
        if n and int(ranks.max()) > T:
            raise FormatError("rank: rank above the table")
        out = _take(table, ranks)
        escaped = ranks == T
        count = int(np.count_nonzero(escaped))
        exceptions = read(1, count)
        if count:
            out[escaped] = exceptions
        return out


@register
class Partition(Operator):
    """Split one field into sub-streams by the value of another (the context).

    `context` and `rest` are lists of [low, width] bit ranges that tile the
    word. Children: the context field, then one sub-stream of `rest` per
    class in `classes` (lists of context values) and a last one for values
    in no class. Each sub-stream keeps its own statistics (e.g. mantissa
    bits by exponent). Inverse: decode the context, count each class, read
    the sub-streams and put every element back in its place. Memory of the
    inverse: at most 6 times its output (bytes: context, classes,
    sub-streams, the rest field, then the output and one temporary).
    """

    id = "partition"
    params = {"context": list, "rest": list, "classes": list}

    @classmethod
    def validate(cls, config):
        _check_ranges([config["context"], config["rest"]])
        width = sum(w for _, w in config["context"])
        if width > MAX_LUT_BITS:
            raise ProgramError(f"partition: context wider than {MAX_LUT_BITS} bits")
        seen: set[int] = set()
        classes = config["classes"]
        if not isinstance(classes, list) or len(classes) > 255:
            raise ProgramError("partition: classes must be a list of at most 255 lists")
        for c in classes:
            if not isinstance(c, list) or not all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 1 << width for v in c):
                raise ProgramError("partition: a class is a list of context values")
            if seen & set(c):
                raise ProgramError("partition: a context value is in two classes")
            seen |= set(c)

    def _groups(self):
        return [self._config["context"], self._config["rest"]]

    def output_types(self, t):
        check_tiling(self._groups(), t, self.id)
        context = Field(sum(w for _, w in self._config["context"]))
        rest = Field(sum(w for _, w in self._config["rest"]))
        return [context] + [rest] * (len(self._config["classes"]) + 1)

    def output_names(self, t):
        return ["context"] + [f"class{i}" for i in range(len(self._config["classes"]))] + ["other"]

    def _class_table(self, bits: int) -> np.ndarray:
        """The class of every context value (len(classes) for none), made
        once per width: decoding needs it for every chunk."""
        tables = self.__dict__.setdefault("_tables", {})
        if bits not in tables:
            table = self._make_class_table(bits)
            table.flags.writeable = False  # shared by every chunk and thread
            tables[bits] = table
        return tables[bits]

    def _make_class_table(self, bits: int) -> np.ndarray:
        keys, codes = [], []
        for j, c in enumerate(self._config["classes"]):
            keys += c
            codes += [j] * len(c)
        return _table(keys, np.array(codes, dtype=np.uint8), len(self._config["classes"]), bits)

    # Both directions work block by block (see BLOCK), and within a block take each
    # class's positions in increasing order, so every sub-stream holds its elements in
    # order, as one stable sort of the whole chunk by class would. With few classes
    # one flatnonzero per class is about 3x faster than a stable argsort of the block
    # (numpy's for bytes costs about 12 ns an element); from about a dozen on, the
    # argsort is.

    def forward(self, x, t):
        context, rest = _split(x, self._groups())
        table = self._class_table(sum(w for _, w in self._config["context"]))
        k = len(self._config["classes"]) + 1
        if _layout is not None and rest.dtype.itemsize in (1, 2, 4, 8):
            # In C: each element's class, then every class's elements in one
            # pass (easyocr's compression spent 8 % in the loops below).
            context, rest = np.ascontiguousarray(context), np.ascontiguousarray(rest)
            cls = np.empty(len(x), np.uint8)
            totals = _layout.classify(context, table, cls)
            subs = [np.empty(totals[j], rest.dtype) for j in range(k)]
            _layout.split_classes(cls, rest, subs)
            return [context] + subs
        pieces: list[list[np.ndarray]] = [[] for _ in range(k)]
        for i in range(0, len(x), BLOCK):
            cls = np.take(table, context[i:i + BLOCK])
            block = rest[i:i + BLOCK]
            if k <= FEW_CLASSES:
                for j in range(k):
                    at = np.flatnonzero(cls == j)
                    if len(at):
                        pieces[j].append(np.take(block, at))
                continue
            grouped = np.take(block, np.argsort(cls, kind="stable"))
            counts = np.bincount(cls, minlength=k)
            start = 0
            for j in np.flatnonzero(counts).tolist():
                pieces[j].append(grouped[start:start + counts[j]])
                start += counts[j]
        subs = [np.concatenate(p) if len(p) > 1 else p[0] if p else rest[:0] for p in pieces]
        return [context] + subs

    def held_while_reading(self, t, i, types):
        """Bytes per element held while child i decodes (see dsl/memory.py): the
        context, each element's class, the sub-streams before it (together at
        most one element per element)."""
        if not i:
            return 0
        return types[0].container.itemsize + 1 + (types[1].container.itemsize if i > 1 else 0)

    def child_counts(self, n, t):
        return (n,) + (None,) * len(self._config["classes"]) + (None,)  # the classes: as the context says

    writes_into = True

    def inverse(self, n, t, read, out=None):
        types = self.child_types(t)
        context = read(0, n)
        k = len(types) - 1
        classes = self._config["classes"]
        rest_type = types[1].container
        if _layout is not None and rest_type.itemsize in (1, 2, 4, 8):  # one pass in C
            cls = np.empty(n, np.uint8)
            try:
                totals = _layout.classify(np.ascontiguousarray(context), self._class_table(types[0].bits), cls)
            except ValueError as e:
                raise FormatError(f"partition: {e}") from None
            parts = [np.ascontiguousarray(part, dtype=rest_type) for part in read_children(read, 1, totals[:k])]
            # Each element's class part and context put together into its word at once.
            out = np.empty(n, t.container) if out is None else out
            _layout.scatter_join(cls, parts, [tuple(r) for r in self._config["rest"]], np.ascontiguousarray(context),
                                 [tuple(r) for r in self._config["context"]], out)
            return out
        if k <= FEW_CLASSES and all(len(c) == 1 for c in classes):
            rest = self._inverse_singletons(n, types, context, [c[0] for c in classes], read)
            return _join(n, t, self._groups(), [context, rest], out)
        table = self._class_table(types[0].bits)
        cls = _take(table, context)
        starts = range(0, n, BLOCK)
        if k <= FEW_CLASSES:
            totals = [int(np.count_nonzero(cls == j)) for j in range(k)]
        else:
            block_counts = [np.bincount(cls[i:i + BLOCK], minlength=k) for i in starts]
            totals = np.sum(block_counts, axis=0, dtype=np.int64).tolist() if block_counts else [0] * k
        parts = [read(j + 1, count) for j, count in enumerate(totals)]
        rest = np.empty(n, dtype=types[1].container)
        used = [0] * k  # elements of each part placed so far
        for b, i in enumerate(starts):
            block = cls[i:i + BLOCK]
            place = rest[i:i + BLOCK]
            if k <= FEW_CLASSES:
                for j in range(k):
                    at = np.flatnonzero(block == j)
                    if len(at):
                        place[at] = parts[j][used[j]:used[j] + len(at)]
                        used[j] += len(at)
                continue
            gathered = []
            for j in np.flatnonzero(block_counts[b]).tolist():
                c = int(block_counts[b][j])
                gathered.append(parts[j][used[j]:used[j] + c])
                used[j] += c
            place[np.argsort(block, kind="stable")] = np.concatenate(gathered) if len(gathered) > 1 else gathered[0]
        parts = cls = None  # freed before the output is made
        return _join(n, t, self._groups(), [context, rest], out)

    @staticmethod
    def _inverse_singletons(n, types, context, values, read) -> np.ndarray:
        """The rest field where every class is one context value (the usual
        case): comparing the context with each value finds a class's elements
        without looking every context value up in the class table."""
        totals = [int(np.count_nonzero(context == v)) for v in values]
        totals.append(n - sum(totals))  # in no class
        parts = [read(j + 1, count) for j, count in enumerate(totals)]
        rest = np.empty(n, dtype=types[1].container)
        used = [0] * len(parts)  # elements of each part placed so far
        for i in range(0, n, BLOCK):
            block = context[i:i + BLOCK]
            out = rest[i:i + BLOCK]
            classed = None
            for j, v in enumerate(values + [None]):
                if v is None:  # the elements of no class: what the values left
                    if classed is None:
                        at = np.arange(len(block))
                    else:
                        at = np.flatnonzero(np.logical_not(classed, out=classed))
                else:
                    mask = block == v
                    at = np.flatnonzero(mask)
                    if classed is None:
                        classed = mask
                    else:
                        classed |= mask
                if len(at):
                    out[at] = parts[j][used[j]:used[j] + len(at)]
                    used[j] += len(at)
        return rest
