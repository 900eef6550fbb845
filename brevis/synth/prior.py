"""The production prior: how likely each production is in each context.

A context is (parent production, kind of value, tensor role). The prior is
learned per checkpoint by searching widely on a sample of its tensors and
counting which productions the winning programs use. In the search it
orders and prunes expansions and prices a program's description: a
production costs -log2 P(production | context) bits. With no counts it
is uniform over the proposals, which is also what learning starts from.
"""

from __future__ import annotations

import json
import math
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path

from ..dsl.program import Program
from ..dsl.types import Field, Tensor
from ..errors import InvalidArgument, ProgramError

SMOOTHING = 0.1  # add-alpha: an unseen production stays possible, just dear
# Where the prior has seen the context, operators less likely than this share
# of the likeliest production are not tried (coders always are: they are cheap
# and close a value).
PRUNE_BELOW = 0.2


def value_kind(t: Field) -> str:
    return f"T:{t.dtype.name}" if isinstance(t, Tensor) else f"F:{t.bits}"


class Prior:
    def __init__(self, counts: dict[str, dict[str, float]] | None = None, samples: int = 0,
                 programs: list["LearnedProgram"] | None = None):
        self.counts: dict[str, Counter] = defaultdict(Counter)
        for ctx, c in (counts or {}).items():
            self.counts[ctx].update(c)
        self.samples = samples  # tensors the prior was learned on
        # The winning programs of the sample: a library that most tensors of
        # the checkpoint (and of the next one, with --prior) take after one
        # trial encoding instead of a search.
        self.programs: list[LearnedProgram] = list(programs or [])

    @property
    def learned(self) -> bool:
        return bool(self.counts)

    @staticmethod
    def context(parent: str, t: Field, role: str) -> str:
        return f"{parent}|{value_kind(t)}|{role}"

    def _table(self, ctx: str) -> Counter | None:
        if self.counts.get(ctx):
            return self.counts[ctx]
        general = ctx.rsplit("|", 1)[0] + "|*"  # back off to any role
        return self.counts.get(general) or None

    def probabilities(self, ctx: str, ids: list[str]) -> dict[str, float]:
        """P(id | ctx) over the proposed ids."""
        table = self._table(ctx)
        if not table:
            return {i: 1 / len(ids) for i in ids}
        weights = {i: table.get(i, 0) + SMOOTHING for i in ids}
        total = sum(weights.values())
        return {i: w / total for i, w in weights.items()}

    def informed(self, ctx: str) -> bool:
        """Whether the prior has counts for this context (or its any-role fallback)."""
        return self._table(ctx) is not None

    @staticmethod
    def keep(probability: float, likeliest: float) -> bool:
        return probability >= PRUNE_BELOW * likeliest

    @staticmethod
    def bits(probability: float) -> float:
        return -math.log2(probability)

    # ----------------------------------------------------------- learning
    def observe(self, program: Program, t: Field, role: str, parent: str = "root") -> None:
        node = program.node
        for ctx in (self.context(parent, t, role), self.context(parent, t, "*")):
            self.counts[ctx][node.id] += 1
        if program.children:
            for child, ct in zip(program.children, node.output_types(t)):  # type: ignore[union-attr]
                self.observe(child, ct, role, node.id)

    def remember(self, program: Program, t: Field, role: str, relative: float) -> None:
        """Keep a winning program in the library (once per kind and program)."""
        kind = value_kind(t)
        if not any(p.kind == kind and p.program == program for p in self.programs):
            # Rounded as stored, so a prior reloaded from its file acts the same.
            self.programs.append(LearnedProgram(kind, role, program, round(relative, 6)))

    def library(self, t: Field) -> list["LearnedProgram"]:
        kind = value_kind(t)
        return [p for p in self.programs if p.kind == kind]

    # ------------------------------------------------------- persistence
    def to_json(self) -> dict:
        return {"format": "brevis-prior", "version": 1, "samples": self.samples,
                "counts": {ctx: dict(sorted(c.items())) for ctx, c in sorted(self.counts.items())},
                "programs": [p.to_json() for p in self.programs]}

    @staticmethod
    def from_json(obj) -> "Prior":
        if not (isinstance(obj, dict) and obj.get("format") == "brevis-prior" and obj.get("version") == 1):
            raise InvalidArgument("not a Brevis prior (version 1)")
        counts = obj.get("counts")
        if not isinstance(counts, dict) or not all(
                isinstance(c, dict) and all(isinstance(v, (int, float)) and not isinstance(v, bool)
                                            and 0 <= v < math.inf for v in c.values())
                for c in counts.values()):
            raise InvalidArgument("prior: malformed counts")
        programs = obj.get("programs", [])  # absent in priors written before the library
        if not isinstance(programs, list):
            raise InvalidArgument("prior: malformed programs")
        samples = obj.get("samples", 0)
        if not (isinstance(samples, int) and not isinstance(samples, bool) and samples >= 0):
            raise InvalidArgument("prior: samples must be a non-negative integer")
        return Prior(counts, samples, [LearnedProgram.from_json(p) for p in programs])

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_json(), indent=1) + "\n")

    @staticmethod
    def load(path: str | Path) -> "Prior":
        try:
            obj = json.loads(Path(path).read_text())
        except FileNotFoundError:
            raise InvalidArgument(f"{path}: no such prior file") from None
        except (OSError, ValueError, RecursionError) as e:
            raise InvalidArgument(f"{path}: cannot read prior ({type(e).__name__}: {e})"
                                  if isinstance(e, RecursionError) else f"{path}: cannot read prior ({e})") from None
        return Prior.from_json(obj)


@dataclass(frozen=True)
class LearnedProgram:
    """A program that won the wide search on a sample tensor, with how close
    it came there to the order-0 estimate (estimated bytes / entropy bytes):
    another tensor takes it when it does as well on that tensor's sample."""

    kind: str  # value_kind of the tensor it was found on
    role: str
    program: Program
    relative: float

    def to_json(self) -> dict:
        return {"kind": self.kind, "role": self.role, "program": self.program.to_json(),
                "relative": self.relative}

    @staticmethod
    def from_json(obj) -> "LearnedProgram":
        try:
            relative = float(obj["relative"])
            if not (isinstance(obj["kind"], str) and isinstance(obj["role"], str) and 0 <= relative < math.inf):
                raise ValueError
            return LearnedProgram(obj["kind"], obj["role"], Program.from_json(obj["program"]), relative)
        except (KeyError, TypeError, ValueError, ProgramError):
            raise InvalidArgument("prior: malformed learned program") from None
