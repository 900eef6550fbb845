"""The protocol every production of the DSL follows, and their registry.

A program is a tree. Inner nodes are `Operator`s: a reversible map from one
typed value to a list of typed values (its children). Leaves are `Coder`s:
a reversible map from one typed value to the bytes of one stored stream.

Each production has a stable `id` (it is written into archives: never
rename one), a JSON-clean configuration, a type rule, a forward direction
used when compressing and an exact inverse used when decompressing.
"""

from __future__ import annotations

from typing import Any, Callable, ClassVar

import numpy as np

from ..errors import ProgramError
from .types import Field

# read(i, n): the decoded value of child i, holding n elements.
ReadChild = Callable[[int, int], np.ndarray]


def read_child_into(read: ReadChild, i: int, count: int, place: np.ndarray) -> np.ndarray:
    """read(i, count), its elements in `place` (count elements of the
    child's container, writable): decoded there where the interpreter
    offers it (read.into), else copied there. Returns place."""
    into = getattr(read, "into", None)
    if into is not None:
        return into(i, count, place)
    place[:] = read(i, count)
    return place


def read_children(read: ReadChild, first: int, counts) -> list[np.ndarray]:
    """read(first, counts[0]), read(first + 1, counts[1]), ...: at once where
    the interpreter offers it (read.many: the children coded by one leaf
    decode in one call), for an inverse that holds them all together anyway."""
    many = getattr(read, "many", None)
    if many is not None:
        return many(first, counts)
    return [read(i, count) for i, count in enumerate(counts, first)]


class Production:
    id: ClassVar[str]
    # Config keys and the Python types their values must have.
    params: ClassVar[dict[str, type | tuple[type, ...]]] = {}

    def __init__(self, /, **config: Any):  # "self" may be a config key from an archive
        self._config = self.parse_config(config)

    @classmethod
    def parse_config(cls, config: dict) -> dict:
        """Check a configuration, as read from an archive or written by code."""
        if not isinstance(config, dict):
            raise ProgramError(f"{cls.id}: configuration must be an object")
        unknown = set(config) - set(cls.params)
        missing = set(cls.params) - set(config)
        if unknown or missing:
            raise ProgramError(
                f"{cls.id}: configuration keys {sorted(config)} "
                f"differ from {sorted(cls.params)}"
            )
        for key, expected in cls.params.items():
            value = config[key]
            # bool is an int in Python; keep the two apart.
            if isinstance(value, bool) and expected is not bool:
                raise ProgramError(f"{cls.id}: {key} must be {expected}, not bool")
            if not isinstance(value, expected):
                raise ProgramError(f"{cls.id}: {key} has the wrong type")
        cls.validate(config)
        return dict(config)

    @classmethod
    def validate(cls, config: dict) -> None:
        """Raise ProgramError if the values of a well-typed config are invalid."""

    @property
    def config(self) -> dict:
        return dict(self._config)

    def describe(self) -> str:
        """Readable text form, e.g. `zstd(level=3)`."""
        args = ",".join(f"{k}={v}" for k, v in self._config.items())
        return f"{self.id}({args})" if args else self.id

    def __eq__(self, other: object) -> bool:
        return type(self) is type(other) and self._config == other._config  # type: ignore[attr-defined]

    def __hash__(self) -> int:
        # Made on first use (an archive's index reads hundreds of nodes;
        # few are hashed), then kept.
        h = self.__dict__.get("_hash")
        if h is None:
            h = self.__dict__["_hash"] = hash((self.id, repr(sorted(self._config.items()))))
        return h

    def __reduce__(self):
        # Made again where unpickled: _hash is of strings, whose hashes
        # differ between processes (a spawned worker's).
        return _rebuild, (type(self), self._config)

    def __repr__(self) -> str:
        return self.describe()


class Operator(Production):
    """An inner node: one value in, a list of values out.

    Facts about an operator are declared here, as class attributes, and set
    by each operator class that differs from the default. False claims
    nothing: the operator may have the property, but no one relies on it.
    The interpreter, the type checker and the search read them from the
    node, never from lists of ids; tests/dsl/test_facts.py checks them.
    """

    # Coding needs the base tensor's elements at the chunk's places
    # (`reference` in forward_ref and inverse_ref); only a root may do this.
    uses_reference: ClassVar[bool] = False
    # Every child holds the input's n elements in their places (child
    # element i is made from input elements i and before), so a row length
    # of the input still applies to the children.
    keeps_order: ClassVar[bool] = False
    # Search hints about the children, read by brevis/synth/proposals.py:
    # they are the fields of fixed-size records (quants, scales).
    splits_records: ClassVar[bool] = False
    # ... they are integers whose neighbours may be close (bytes of a word,
    # bit fields, ranks): delta and xor_delta are worth trying on them.
    delta_children: ClassVar[bool] = False
    # ... they are two's-complement differences, small of either sign:
    # zigzag is worth trying on them.
    signed_children: ClassVar[bool] = False
    # ... they are frequency ranks already: ranking them again cannot pay.
    ranked_children: ClassVar[bool] = False
    # ... its one child is a typed tensor read out of bytes: what is tried
    # at a segment's root (ranks and sparsity of wide values, deltas of
    # floats) is tried on it.
    typed_children: ClassVar[bool] = False

    def output_types(self, t: Field) -> list[Field]:
        """Types of the children for input type t; ProgramError if t is not accepted."""
        raise NotImplementedError

    def child_types(self, t: Field) -> tuple[Field, ...]:
        """output_types(t), computed once per input type: decoding asks for
        them at every node of every chunk, and a production never changes."""
        cache = self.__dict__.setdefault("_child_types", {})
        types = cache.get(t)
        if types is None:
            types = cache[t] = tuple(self.output_types(t))
        return types

    def output_names(self, t: Field) -> list[str]:
        return [f"{i}" for i in range(len(self.output_types(t)))]

    def child_counts(self, n: int, t: Field) -> tuple[int | None, ...] | None:
        """The element counts inverse(n, t, ...) reads its children with,
        where n alone decides them (None for a child whose count the data
        decides: a rank's exceptions), or None where none is known. The
        reader decodes the leaves under known counts ahead, many chunks'
        in one call (interpreter.leaves_ahead); a wrong claim costs time,
        not bytes: a leaf decoded ahead is taken only where its count is
        the one read (tests/helpers.roundtrip holds every claim to the
        reads). An operator whose children keep the order holds n each."""
        return (n,) * len(self.child_types(t)) if self.keeps_order else None

    def forward(self, x: np.ndarray, t: Field) -> list[np.ndarray]:
        """Split x (n elements of type t) into the children's values.

        Raises NotApplicable when this input cannot be represented.
        """
        raise NotImplementedError

    def inverse(self, n: int, t: Field, read: ReadChild) -> np.ndarray:
        """Rebuild the n elements of type t from the children."""
        raise NotImplementedError

    def forward_ref(self, x: np.ndarray, t: Field, reference: np.ndarray | None) -> list[np.ndarray]:
        """forward() given the base tensor's elements at x's places (None
        without a base). The interpreter always calls this one; an operator
        with uses_reference overrides it, the others ignore the reference."""
        return self.forward(x, t)

    def inverse_ref(self, n: int, t: Field, read: ReadChild, reference: np.ndarray | None) -> np.ndarray:
        """inverse() given the base tensor's elements (as in forward_ref)."""
        return self.inverse(n, t, read)

    # Whether inverse() takes `out=`: n elements of t's container to rebuild
    # the elements in where it can (it may return a new array instead). A
    # chunk's root then writes straight into the chunk's place in its file.
    writes_into: ClassVar[bool] = False

    def inverse_into(self, n: int, t: Field, read: ReadChild, reference: np.ndarray | None,
                     out: np.ndarray) -> np.ndarray:
        """inverse_ref()'s elements in `out` (returned; undefined if this raises)."""
        if self.writes_into and reference is None:
            value = self.inverse(n, t, read, out=out)
        else:
            value = self.inverse_ref(n, t, read, reference)
        if value is not out:
            out[:] = value
        return out


class Coder(Production):
    """A leaf: one value in, the bytes of one stream out."""

    # Whether the search keeps this coder's estimates in its memo of
    # digests (synth/estimates.py): not where the estimate costs less
    # than the digest.
    remembered = True

    def accepts(self, t: Field) -> None:
        """ProgramError if this coder cannot code values of type t."""

    def encode(self, x: np.ndarray, t: Field) -> bytes:
        raise NotImplementedError

    def decode(self, data: memoryview, n: int, t: Field) -> np.ndarray:
        """Exactly n elements in t's container, or FormatError."""
        raise NotImplementedError

    def decode_into(self, data: memoryview, n: int, t: Field, out: np.ndarray) -> None:
        """decode() into `out` (n elements of t's container, writable): a
        chunk's bytes go straight to their place where a leaf alone codes
        them. By default decoded, then copied."""
        out[:] = self.decode(data, n, t)

    def estimate(self, x: np.ndarray, t: Field) -> tuple[int, int]:
        """(stream bytes, fixed_bytes of them) that encode(x, t) would give:
        the search's cost of this leaf. Exact by default; a coder whose
        encoding is dear may estimate."""
        stream = self.encode(x, t)
        return len(stream), self.fixed_bytes(stream)

    def fixed_bytes(self, stream: bytes) -> int:
        """The bytes of one of this coder's streams that do not grow with
        the value (a model): the search counts them once per chunk instead
        of scaling them up from a sample."""
        return 0


REGISTRY: dict[str, type[Production]] = {}


def _rebuild(cls: type[Production], config: dict) -> Production:
    return cls(**config)


def register(cls: type[Production]) -> type[Production]:
    if cls.id in REGISTRY:
        raise ValueError(f"production id {cls.id!r} registered twice")
    REGISTRY[cls.id] = cls
    return cls


def production(ident: str, config: dict) -> Production:
    cls = REGISTRY.get(ident)
    if cls is None:
        raise ProgramError(f"unknown production {ident!r}")
    return cls(**config) if isinstance(config, dict) else cls.parse_config(config)
