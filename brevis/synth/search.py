"""Bounded A* search for the smallest program that rebuilds a value.

Open values of a program are independent, so the search runs per value
and shares solved sub-values: for a value v, a node is v with one
production chosen (a partial program) and
  g = description length of the production under the prior (-log2 P bits)
      + cost of what is finished (a coder's bytes on the sample, scaled
      to the whole segment, its model counted once per chunk, plus its
      index entries: exact, or Coder.estimate's for a coder dear to run;
      or the solved children of an operator)
  h = the order-0 entropy of the children not yet solved: a cheap,
      optimistic guess of what they will cost.
Nodes are taken cheapest f = g + h first; an operator node is refined in
two steps (run it on the sample to know its children and their h, then
solve the children recursively), so the first finished node taken is the
best under the estimates. The prior orders and prunes the productions;
limits on expansions and time keep it fast: past them, every value still
open takes its cheapest coder. A segment too large to prune is searched
wide; where that runs out, a pruned search with the same budget backs it.
"""

from __future__ import annotations

import heapq
import itertools
import time
from dataclasses import dataclass

from ..dsl import BytePlanes, Delta, FloatFields, Tensor
from ..dsl.operator import Coder, Operator, Production
from ..dsl.program import Program
from ..dsl.interpreter import forward
from ..errors import NotApplicable
from .estimates import leaf_estimate
from .prior import Prior
from .proposals import DETECTED, Value, child_row, coders_for, proposals

STREAM_INDEX_BYTES = 6  # what one stream location costs in the (compressed) index
PRUNE_MAX_BYTES = 8 << 20  # the prior prunes productions only in searches of smaller segments
NEIGHBOURS = Delta(stride=1)  # tried after the search where a float tensor's neighbours are alike (differences)


@dataclass
class Budget:
    expansions: int = 48
    seconds: float = 1.0


@dataclass
class SearchResult:
    program: Program
    estimate: float  # predicted bytes for the whole segment, description included
    expanded: int
    generated: int
    exhausted: bool  # a limit was hit somewhere and a value was closed greedily


# Stages of a node: an operator not yet run on the sample, an operator whose
# children are known but not solved, and a finished sub-program.
_UNRUN, _OPEN, _DONE = 0, 1, 2


class Search:
    def __init__(self, prior: Prior, role: str, scale: float, chunks: int, budget: Budget, narrow: bool = False):
        self.prior, self.role, self.scale, self.chunks, self.budget = prior, role, scale, chunks, budget
        self.narrow = narrow  # the prior prunes productions whatever the segment's size
        self.segment_bytes = 0  # set by run(): the size of the segment searched
        self.expanded = self.generated = 0
        self.exhausted = False
        self.deadline = time.perf_counter() + budget.seconds
        self.tie = itertools.count()

    def out_of_budget(self) -> bool:
        if self.expanded >= self.budget.expansions or time.perf_counter() > self.deadline:
            self.exhausted = True
        return self.exhausted

    # ------------------------------------------------------------ costs
    def leaf_cost(self, v: Value, coder: Coder) -> float:
        key = ("coder", coder)
        if key not in v.memo:
            sizes = [leaf_estimate(coder, s, v.t) for s in v.slices]
            fixed = sum(model for _, model in sizes)
            size = sum(length for length, _ in sizes) - fixed
            v.memo[key] = size * self.scale + (fixed / len(sizes) + STREAM_INDEX_BYTES) * self.chunks
        return v.memo[key]

    def children(self, v: Value, op: Operator) -> list[Value] | None:
        key = ("op", op)
        if key not in v.memo:
            try:
                types = op.output_types(v.t)
                refs = v.reference if v.reference is not None else [None] * len(v.slices)
                per_slice = [forward(op, s, v.t, r) for s, r in zip(v.slices, refs)]
            except NotApplicable:
                v.memo[key] = None
            else:
                row = child_row(op, v)
                depth = v.depth if op.typed_children else v.depth + 1  # a typed tensor: searched as a root
                v.memo[key] = [Value([parts[j] for parts in per_slice], ct, row, op, depth)
                               for j, ct in enumerate(types)]
        return v.memo[key]

    def h(self, v: Value) -> float:
        return v.entropy_bytes * self.scale

    def described(self, v: Value) -> tuple[list[Production], dict[str, float], dict[str, int]]:
        """Proposals for v, the prior's probability of each id, and how many
        proposals share each id (memoized per role and prior)."""
        key = ("described", self.role, self.prior)
        if key not in v.memo:
            props = proposals(v)
            ids = sorted({p.id for p in props})
            probs = self.prior.probabilities(Prior.context(v.parent_id, v.t, self.role), ids)
            v.memo[key] = props, probs, {i: sum(1 for p in props if p.id == i) for i in ids}
        return v.memo[key]

    def options(self, v: Value) -> list[tuple[Production, float]]:
        """Proposals for v with their description cost in bytes, pruned by the prior."""
        props, probs, share = self.described(v)
        ctx = Prior.context(v.parent_id, v.t, self.role)
        # Pruning saves search time at the risk of missing a production the
        # sample did not show; on large segments the bytes at stake outweigh it.
        prune = self.prior.informed(ctx) and (self.narrow or self.segment_bytes < PRUNE_MAX_BYTES)
        likeliest = max(probs.values())
        # Never pruned: coders, and the productions proposed only where the
        # sample shows their structure (few values, a dominant value, dead
        # low bits, repeated rows, a progression): a prior learned on other
        # tensors has not seen that structure, so it cannot judge it.
        out = [(p, Prior.bits(probs[p.id] / share[p.id]) / 8) for p in props
               if not prune or isinstance(p, Coder) or isinstance(p, DETECTED) or Prior.keep(probs[p.id], likeliest)]
        if not any(isinstance(p, Coder) for p, _ in out):  # a value must always be closable
            best = max((p for p in props if isinstance(p, Coder)), key=lambda c: probs[c.id])
            out.append((best, Prior.bits(probs[best.id] / share[best.id]) / 8))
        out.sort(key=lambda pd: pd[1])  # likeliest first
        return out

    # ----------------------------------------------------------- search
    def solve(self, v: Value) -> tuple[float, Program]:
        """The cheapest program found for v and its estimated cost (memoized)."""
        key = ("best", self.narrow)  # a narrow and a wide search share coder costs and children, not results
        if key in v.memo:
            return v.memo[key]
        frontier: list = []
        options = self.options(v)
        for prod, desc in options:
            f = desc + (self.h(v) if isinstance(prod, Coder) else 0.0)
            heapq.heappush(frontier, (f, next(self.tie), _UNRUN, prod, desc, None))
        result = None
        while frontier:
            f, _, stage, prod, desc, kids = heapq.heappop(frontier)
            if stage == _DONE:
                result = (f, kids)
                break
            if self.out_of_budget():
                break
            self.expanded += 1
            if isinstance(prod, Coder):
                push = (desc + self.leaf_cost(v, prod), _DONE, Program.leaf(prod))
            elif stage == _UNRUN:
                values = self.children(v, prod)  # type: ignore[arg-type]
                if values is None:
                    continue
                push = (desc + sum(self.h(c) for c in values), _OPEN, values)
            else:
                solved = [self.solve(c) for c in kids]
                push = (desc + sum(cost for cost, _ in solved), _DONE,
                        Program.op(prod, *(p for _, p in solved)))  # type: ignore[arg-type]
            self.generated += 1
            heapq.heappush(frontier, (push[0], next(self.tie), push[1], prod, desc, push[2]))
        if result is None:  # out of budget: the cheapest coder, or a finished node if cheaper
            done = [(f, p) for f, _, stage, _, _, p in frontier if stage == _DONE]
            coders = [(desc + self.leaf_cost(v, p), Program.leaf(p)) for p, desc in options if isinstance(p, Coder)]
            result = min(done + coders, key=lambda fp: fp[0])
        v.memo[key] = result
        return result

    def baseline(self, v: Value) -> tuple[float, Program]:
        """A fixed pipeline, costed without spending budget: float fields
        (exponent, sign+mantissa) or byte planes, each leaf its best coder.
        A search cut short by its budget never returns worse than this."""
        leaf = min(((self.leaf_cost(v, c), Program.leaf(c)) for c in coders_for(v.t, v.opaque)), key=lambda cp: cp[0])
        if isinstance(v.t, Tensor) and v.t.dtype.is_float and v.t.bits > 8:
            op: Operator = FloatFields(grouping="e|sm")
        elif v.t.bits > 8:
            op = BytePlanes()
        else:
            return leaf
        kids = self.children(v, op)
        if not kids:
            return leaf
        solved = [self.baseline(c) for c in kids]
        split = (sum(cost for cost, _ in solved), Program.op(op, *(p for _, p in solved)))
        return min(leaf, split, key=lambda cp: cp[0])

    def run(self, root: Value) -> SearchResult:
        self.segment_bytes = sum(s.nbytes for s in root.slices) * self.scale
        cost, program = self.solve(root)
        if self.exhausted and not self.narrow and self.prior.learned and self.segment_bytes >= PRUNE_MAX_BYTES:
            # A wide search that ran out of budget closed its values
            # greedily; the pruned search, with the same budget, goes
            # deeper where the prior points (a 33 MB conv weight: exponent
            # classes and dead bits, 1.7 % smaller than what the wide
            # search's budget reached). The better of the two is kept.
            # A prior with no counts prunes nothing (learning's searches):
            # there the pruned search would repeat the wide one.
            narrow = Search(self.prior, self.role, self.scale, self.chunks, self.budget, narrow=True)
            narrow.segment_bytes = self.segment_bytes
            narrow_cost, narrow_program = narrow.solve(root)
            self.expanded += narrow.expanded
            self.generated += narrow.generated
            if narrow_cost < cost:
                cost, program = narrow_cost, narrow_program
        if self.exhausted:
            fixed_cost, fixed = self.baseline(root)
            if fixed_cost < cost:
                cost, program = fixed_cost, fixed
        informed = self.prior.informed(Prior.context(root.parent_id, root.t, self.role))
        if (informed and not isinstance(program.node, Delta) and root.neighbours_alike
                and root.difference_bytes * self.scale < cost):  # (their entropy: what delta's child costs at best)
            found = self.differences(root)
            if found is not None and found[0] < cost:
                cost, program = found
        return SearchResult(program, cost, self.expanded, self.generated, self.exhausted)

    def differences(self, root: Value) -> tuple[float, Program] | None:
        """`delta` of neighbours at a float tensor's root whose neighbours
        are alike (Value.neighbours_alike), its child searched with a
        budget of its own, a quarter of this one's. A prior learned on
        other tensors prunes `delta` (a float tensor's differences rarely
        pay; sevenn's exp_avg_sq: 8 % smaller with it), and keeping it in
        the search spent the budget that found the program without it
        (nudenet: 0.07 % larger on a tensor where it did not win). Found
        after the search, it can only replace a costlier program; not in
        the prior's learning (an uninformed prior prunes nothing), whose
        programs teach the prior as before."""
        props, probs, share = self.described(root)
        delta = next((p for p in props if p == NEIGHBOURS), None)
        kids = self.children(root, delta) if delta is not None else None
        if not kids:
            return None
        desc = Prior.bits(probs[delta.id] / share[delta.id]) / 8
        budget = Budget(max(16, self.budget.expansions // 4), self.budget.seconds / 4)
        child = Search(self.prior, self.role, self.scale, self.chunks, budget, narrow=self.narrow)
        child.segment_bytes = self.segment_bytes
        cost, program = child.solve(kids[0])
        self.expanded += child.expanded
        self.generated += child.generated
        return desc + cost, Program.op(delta, program)


def search(root: Value, prior: Prior, role: str, scale: float, chunks: int = 1,
           budget: Budget | None = None) -> SearchResult:
    return Search(prior, role, scale, chunks, budget or Budget()).run(root)
