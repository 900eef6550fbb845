"""Programs: trees of operators ending in coder leaves.

Serialized form (JSON-clean, stored in the archive index):
    [production_id, config]                 a coder leaf
    [production_id, config, [child, ...]]   an operator and its children
Children appear in the order of the operator's outputs. The streams a
program writes are its leaves in depth-first order.
"""

from __future__ import annotations

import marshal
from dataclasses import dataclass, field

from ..errors import ProgramError
from .operator import Coder, Operator, Production, production
from .types import Field

MAX_DEPTH = 16
MAX_NODES = 256


@dataclass(frozen=True)
class Program:
    node: Production
    children: tuple["Program", ...] = field(default=())

    def __hash__(self) -> int:
        # Made once: a program is a cache key (plan.program_text, once a
        # segment), and dataclass's hash walks the whole tree each time.
        h = self.__dict__.get("_hash")
        if h is None:
            h = self.__dict__["_hash"] = hash((self.node, self.children))
        return h

    def __reduce__(self):
        # Without the cached hash: string hashes differ between processes.
        return Program, (self.node, self.children)

    # ---------------------------------------------------------------- build
    @staticmethod
    def leaf(coder: Coder) -> "Program":
        return Program(coder)

    @staticmethod
    def op(operator: Operator, *children: "Program") -> "Program":
        return Program(operator, tuple(children))

    # ----------------------------------------------------------- structure
    @property
    def is_leaf(self) -> bool:
        return isinstance(self.node, Coder)

    @property
    def uses_reference(self) -> bool:
        """Whether decoding needs the base tensor (only a root can use it)."""
        return isinstance(self.node, Operator) and self.node.uses_reference

    def leaves(self) -> list[Coder]:
        if self.is_leaf:
            return [self.node]  # type: ignore[list-item]
        return [c for child in self.children for c in child.leaves()]

    def check(self, t: Field, depth: int = 0) -> int:
        """Type-check against input type t; return the number of streams."""
        if depth == 0 and self._count_nodes(MAX_NODES + 1) > MAX_NODES:
            # The same limit as from_json: never write what no reader accepts.
            raise ProgramError(f"program has more than {MAX_NODES} nodes")
        if depth > MAX_DEPTH:
            raise ProgramError(f"program deeper than {MAX_DEPTH}")
        if isinstance(self.node, Coder):
            if self.children:
                raise ProgramError(f"coder {self.node.id} cannot have children")
            self.node.accepts(t)
            return 1
        if not isinstance(self.node, Operator):
            raise ProgramError(f"{self.node!r} is not a production")
        if depth and self.node.uses_reference:
            raise ProgramError(f"{self.node.id} codes against a base tensor: only at the root")
        types = self.node.child_types(t)
        if len(types) != len(self.children):
            raise ProgramError(
                f"{self.node.id} on {t} gives {len(types)} values but has {len(self.children)} children")
        return sum(child.check(ct, depth + 1) for child, ct in zip(self.children, types))

    def _count_nodes(self, stop: int) -> int:
        """Number of nodes, counting no further than `stop` (no recursion)."""
        count, todo = 0, [self]
        while todo and count < stop:
            node = todo.pop()
            count += 1
            todo.extend(node.children)
        return count

    # ------------------------------------------------------ serialization
    def to_json(self) -> list:
        if self.is_leaf:
            return [self.node.id, self.node.config]
        return [self.node.id, self.node.config, [c.to_json() for c in self.children]]

    @staticmethod
    def from_json(obj, memo: dict | None = None) -> "Program":
        """The program of a JSON value, checked for form (not for types:
        check). `memo`: subtrees already read, by their JSON (an index's
        programs share most of theirs: ppocr's 27 distinct programs are 311
        nodes and 48 distinct subtrees), each read once per memo."""
        budget = [MAX_NODES]
        return _from_json(obj, 0, budget, memo)

    # ------------------------------------------------------------- display
    def describe(self, t: Field | None = None) -> str:
        """Readable text, e.g. float_fields(grouping=e|sm)[exponent: zstd(level=1), ...]."""
        if self.is_leaf:
            return self.node.describe()
        names = None
        types: list = [None] * len(self.children)
        if t is not None:
            try:
                types = self.node.output_types(t)  # type: ignore[union-attr]
                names = self.node.output_names(t)  # type: ignore[union-attr]
            except ProgramError:
                pass
            if len(types) != len(self.children):  # ill-typed: show every child, unnamed
                types, names = [None] * len(self.children), None
        parts = []
        for i, (child, ct) in enumerate(zip(self.children, types)):
            text = child.describe(ct)
            parts.append(f"{names[i]}: {text}" if names else text)
        return f"{self.node.describe()}[{', '.join(parts)}]" if parts else self.node.describe()


def _from_json(obj, depth: int, budget: list[int], memo: dict | None = None) -> Program:
    if memo is not None:
        # marshal (version 2: no back-references) is an exact, typed image
        # of a JSON value. A subtree found again costs its nodes and its
        # height against the limits, as reading it again would.
        try:
            key = marshal.dumps(obj, 2)
        except ValueError:  # nested deeper than marshal goes: far past MAX_DEPTH
            raise ProgramError(f"program deeper than {MAX_DEPTH}") from None
        found = memo.get(key)
        if found is None:
            program = _read_node(obj, depth, budget, memo)
            memo[key] = (program, program._count_nodes(MAX_NODES + 1), _height(program))
            return program
        program, nodes, height = found
        budget[0] -= nodes
        if budget[0] < 0:
            raise ProgramError(f"program has more than {MAX_NODES} nodes")
        if depth + height > MAX_DEPTH:
            raise ProgramError(f"program deeper than {MAX_DEPTH}")
        return program
    return _read_node(obj, depth, budget, memo)


def _read_node(obj, depth: int, budget: list[int], memo: dict | None) -> Program:
    budget[0] -= 1
    if budget[0] < 0:
        raise ProgramError(f"program has more than {MAX_NODES} nodes")
    if depth > MAX_DEPTH:
        raise ProgramError(f"program deeper than {MAX_DEPTH}")
    if not isinstance(obj, list) or len(obj) not in (2, 3) or not isinstance(obj[0], str):
        raise ProgramError("a program node is [id, config] or [id, config, children]")
    node = production(obj[0], obj[1])
    if isinstance(node, Coder):
        if len(obj) != 2:
            raise ProgramError(f"coder {node.id} cannot have children")
        return Program(node)
    if len(obj) != 3 or not isinstance(obj[2], list):
        raise ProgramError(f"operator {node.id} needs a list of children")
    return Program(node, tuple(_from_json(c, depth + 1, budget, memo) for c in obj[2]))


def _height(program: Program) -> int:
    """Levels below the root (0 for a leaf)."""
    return 1 + max(map(_height, program.children)) if program.children else 0
