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


class Production:
    id: ClassVar[str]
    # Config keys and the Python types their values must have.
    params: ClassVar[dict[str, type | tuple[type, ...]]] = {}

    def __init__(self, /, **config: Any):  # "self" may be a config key from an archive
        self._config = self.parse_config(config)
        self._hash = hash((self.id, repr(sorted(self._config.items()))))

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
        return self._hash

    def __repr__(self) -> str:
        return self.describe()


class Operator(Production):
    """An inner node: one value in, a list of values out."""

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

    def forward(self, x: np.ndarray, t: Field) -> list[np.ndarray]:
        """Split x (n elements of type t) into the children's values.

        Raises NotApplicable when this input cannot be represented.
        """
        raise NotImplementedError

    def inverse(self, n: int, t: Field, read: ReadChild) -> np.ndarray:
        """Rebuild the n elements of type t from the children."""
        raise NotImplementedError


class Coder(Production):
    """A leaf: one value in, the bytes of one stream out."""

    def accepts(self, t: Field) -> None:
        """ProgramError if this coder cannot code values of type t."""

    def encode(self, x: np.ndarray, t: Field) -> bytes:
        raise NotImplementedError

    def decode(self, data: memoryview, n: int, t: Field) -> np.ndarray:
        """Exactly n elements in t's container, or FormatError."""
        raise NotImplementedError


REGISTRY: dict[str, type[Production]] = {}


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
