"""Planning a checkpoint: learn the prior on a sample, then choose every
segment's program: a sibling's (same family), else a program learned on
the sample that fits as well here as there, else a search.

Effort levels trade search time for ratio:
  0  no search: every segment is coded by zstd's entropy preset
  1  prior learned on up to 8 tensors (300 expansions), budget 64, small samples
  2  default: prior learned on up to 8 tensors (400), budget 400 expansions
  3  prior learned on up to 32 tensors (5000), budget 2000, more slices
The result does not depend on the number of threads: families are led by
their first segment in archive order, and limits are counted in
expansions (time is only a guard against pathological inputs).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from functools import partial
from typing import Callable

import numpy as np

from ..archive.schema import SearchKind
from ..dsl import Ans, BytePlanes, FloatFields, LowZeroBits, Lzma, Partition, Raw, Records, View, Zstd
from ..dsl.delta import Delta, ZigZag
from ..dsl.interpreter import encode, estimate
from ..dsl.reference import SubBase, XorBase
from ..dsl.program import Program
from ..dsl.types import BYTES, Field, Tensor
from ..errors import InvalidArgument, NotApplicable, ProgramError
from ..workers.pool import Threads
from .estimates import leaf_estimate
from .prior import Prior
from .proposals import WORD_VIEWS, Value, _float_partition, halves, low_zeros
from .roles import leaf_name, role_of, shape_class
from .search import PRUNE_MAX_BYTES, STREAM_INDEX_BYTES, Budget, SearchResult, search
from ..defaults import DEFAULT_EFFORT

FALLBACK = Program.leaf(Zstd.entropy())  # always applies
PLAIN = Program.leaf(Raw())  # never larger than the data
TINY = 4096  # bytes: too small for a search to pay; raw or zstd, measured
TINY_PROGRAM = Program.leaf(Zstd.at_level(3))
TINY_ANS = Program.leaf(Ans())
# Byte spans are coded with the best of these and the searched program,
# measured on the whole span up to this size, else on two windows of it
# (zstd -19 runs at a few MB/s: only where it codes all of a span).
WHOLE_TRIAL_BYTES = 1 << 20
# A difference against a base tensor coded by one `ans` over its words
# (zigzag: small differences of either sign become small numbers) decodes
# about twice as fast as the bit fields a search tends to split it into,
# for the same size within 0.1 % (MiniLM fine-tuning steps: 543 against
# 277 MB/s). A training run decodes such differences link after link, so
# within FAST_SLACK of the best it is taken.
FAST_REFERENCE = (Program.op(SubBase(), Program.op(ZigZag(), TINY_ANS)), Program.op(XorBase(), TINY_ANS))
FAST_SLACK = 0.005
# Measured on small tensors against the plan's estimate. Level 3: these
# trials named levels 9 and 19 but coded at level 3 until 2026-12-06 (see
# coders.Zstd); honoured, they cost far more than they gained (BYTE_CODERS).
REPEATS = Program.leaf(Zstd.at_level(3))
WHOLE_TRIAL_PROGRAMS = (Program.leaf(Zstd.entropy()), Program.leaf(Zstd.at_level(3)))
# ... and the bytes read as 2- or 4-byte words, their joint statistics
# coded by ans (numbers in a format no parser knows; a shortcut taken on the
# sample may have missed them).
WORD_TRIALS = (Program.op(WORD_VIEWS[0], TINY_ANS),
               Program.op(WORD_VIEWS[1], Program.op(halves(32), TINY_ANS, TINY_ANS)))
# ... and as F32, its exponent apart (what a float tensor's search finds
# first; a shortcut on bytes must do as well).
FLOAT_TRIAL = Program.op(View(dtype="F32"), Program.op(FloatFields(grouping="e|sm"), TINY_ANS, TINY_ANS))
# A short byte span of a file no parser knows is coded with the best of
# these, measured on all of it (from this long: shorter, no model pays).
TINY_WORDS = (TINY_PROGRAM, Program.op(View(dtype="F32"), TINY_ANS), WORD_TRIALS[0])
TINY_WORDS_LEAST = 256
# ... and where discovery asks whether LZMA wins on a span whole, the byte
# planes of 4- and 2-byte words too: floats' exponents and mantissas apart,
# which the search finds on the pieces.
PLANE_TRIALS = (Program.op(WORD_VIEWS[1], Program.op(BytePlanes(), *[TINY_ANS] * 4)),
                Program.op(WORD_VIEWS[0], Program.op(BytePlanes(), TINY_ANS, TINY_ANS)))
# ... and, in files no parser knows, LZMA: with xz's literal context, the
# one its manual gives for text (lc = 4, pb = 0) or a 4-byte word's lane as
# context (lp = pb = 2: floats at any alignment), the best of the three on
# LZMA_PROBES probes of LZMA_PROBE_BYTES over the span (it codes at about
# 3 MB/s), taken only where it is the effort's lzma_margin smaller than the
# best of the rest: it decodes 16-50 MB/s, 10 to 40 times slower than `ans`
# and zstd, and users load a checkpoint far more often than they archive
# it. Up to the default effort LZMA_MARGIN (5 %); at the highest, for the
# smallest archive, LZMA_MARGIN_MOST (0.5 %). On the held-out corpus (whose
# unparsed files alone LZMA codes), 5 % against 0.5 %: 0.43 % larger
# overall, decoding 2.8x faster (298 MB/s against 107); vosk's Kaldi
# model 1.0 % larger for 579 MB/s instead of 46, PaddleOCR's 1.7 % for 382
# instead of 38, a Keras H5 3.1 % for 172 instead of 21. Not in a parsed file,
# at any effort: there the byte spans are headers and framing between
# tensors, where it gains little for its time (gemma's GGUF: its
# vocabulary 22 % smaller, the item 0.19 %, compression 4x slower).
LZMA_TRIALS = tuple(Program.leaf(Lzma(preset=6, lc=lc, lp=lp, pb=pb)) for lc, lp, pb in ((3, 0, 2), (4, 0, 0), (2, 2, 2)))
LZMA_PROBES = 4
LZMA_PROBE_BYTES = 1 << 18
LZMA_MARGIN = 0.05
LZMA_MARGIN_MOST = 0.005
LZMA_CONTEXT_BYTES = 1 << 18  # the bytes a literal context is chosen on (_lzma_best)
# Its chunks are longer: its window then reaches as far as xz -6's (a 1 MiB
# chunk of a tokenizer's vocabulary is 14 % larger than xz -6 on 1.7 MB).
LZMA_CHUNK_BYTES = 8 << 20
REUSE_TOLERANCE = 1.02  # a sibling's program is kept if within 2 % of its cost on the sibling
BYTES_PER_EXPANSION = 1024  # small segments get small search budgets
WIDE_BUDGET_MOST = 4  # ... and those searched unpruned up to this many times the effort's
BYTES_LEARN_FACTOR = 4  # ... and byte spans a wider one when the prior is learned on them
ENTROPY_SLACK = 1.05  # ... and within 5 % of this segment's own order-0 entropy estimate
LIBRARY_TRIALS = 8  # learned programs tried on a segment before searching
ENTROPY_FLOOR = 64  # bytes added to entropy estimates: a constant tensor's is 0
SPIKE_BITS = 0.1  # bits a value a plain `ans` may pay for its commonest word's low bits


@dataclass(frozen=True)
class Effort:
    level: int
    expansions: int
    learn_tensors: int
    learn_expansions: int
    slices: int
    slice_bytes: int
    seconds: float = 10.0
    lzma_margin: float = LZMA_MARGIN  # how much smaller than the best fast coder LZMA must code a span


EFFORTS = {
    0: Effort(0, 0, 0, 0, 1, 4096),
    1: Effort(1, 64, 8, 300, 4, 16384),
    2: Effort(2, 400, 8, 400, 4, 65536),
    3: Effort(3, 2000, 32, 5000, 16, 32768, lzma_margin=LZMA_MARGIN_MOST),
}


def effort(level: int) -> Effort:
    if level not in EFFORTS:
        raise InvalidArgument(f"effort must be one of {sorted(EFFORTS)}, not {level}")
    return EFFORTS[level]


@dataclass
class SegmentInfo:
    """What the planner needs to know of a segment."""

    name: str
    t: Field
    shape: tuple[int, ...] | None
    length: int
    chunks: int
    read: Callable[[int, int], bytes]  # (offset within the segment, length) -> bytes
    records: tuple[tuple[int, int], ...] | None = None  # field layout of fixed-size records
    reference: Callable[[int, int], bytes] | None = None  # the base tensor's bytes, like `read`
    parsed: bool = False  # its file's format was parsed (a byte span is then a header or framing)
    lzma: bool = True  # False: discovery measured LZMA losing on the span this piece was cut from

    @property
    def role(self) -> str:
        return role_of(self.name, isinstance(self.t, Tensor))

    @property
    def row(self) -> int | None:
        if self.records:
            return sum(c * w for c, w in self.records)
        return self.shape[-1] if self.shape and self.shape[-1] > 1 else None

    @property
    def family(self) -> tuple | None:
        """Segments that share a program: same dtype, role, shape and leaf
        name (an optimizer's `exp_avg` and `exp_avg_sq` of one parameter
        are alike in shape only: one is signed and fresh, the other
        positive and slow to change)."""
        if self.reference is not None:
            return ("base", self.t.dtype.name, self.role, self.shape, leaf_name(self.name))
        if self.records:
            return ("records", repr(self.records), self.role)
        if not isinstance(self.t, Tensor) or self.length <= TINY:
            return None
        return (self.t.dtype.name, self.role, self.shape, leaf_name(self.name))

    @property
    def stratum(self) -> str:
        kind = self.t.dtype.name if isinstance(self.t, Tensor) else "bytes"
        return f"{kind}/{self.role}/{shape_class(self.shape, self.length)}"


@dataclass
class Plan:
    program: Program | None  # None for an empty segment
    stats: dict = field(default_factory=dict)
    estimate: float | None = None  # predicted bytes, where a search or a trial predicted them
    chunk_bytes: int | None = None  # longer chunks than the archive's, where the program gains by them


def sample(seg: SegmentInfo, e: Effort, read=None) -> list[np.ndarray]:
    """Evenly spaced contiguous slices of a segment, whole rows where rows are short
    (of the base tensor at the same places, with read=seg.reference)."""
    read = read or seg.read
    itemsize = seg.t.container.itemsize
    elements = seg.length // itemsize
    per = max(1, e.slice_bytes // itemsize)
    # Whole rows; and a byte span's slices start on whole 8-byte words, as
    # its chunks do (discovery cut it at its words' phase): read as words,
    # a slice one byte off would show the search numbers that are not there.
    step = seg.row if seg.row and seg.row <= per else 8 if itemsize == 1 and per >= 8 else 1
    per = per // step * step
    if elements <= per * e.slices:
        starts, per = [0], elements
    else:
        k = e.slices
        starts = [(elements - per) * i // (k - 1) for i in range(k)] if k > 1 else [(elements - per) // 2]
        starts = [s // step * step for s in starts]
    return [np.frombuffer(read(s * itemsize, per * itemsize), dtype=seg.t.container) for s in starts]


def _tiny_plan(seg: SegmentInfo) -> Plan:
    # The encoder stores any chunk that a coder would make larger as it is
    # (its raw guard). A small tensor (a norm's weights) may still have
    # 16-bit values of 10 bits of entropy, which zstd does not see and
    # `ans` does: one trial encoding of each on the whole segment.
    # So may a short byte span no parser typed (a norm's weights discovery
    # cut out as a repeat): `ans` on its words, read as F32 or 2-byte words.
    if isinstance(seg.t, Tensor) and seg.t.bits <= 32 and seg.length:
        x = np.frombuffer(seg.read(0, seg.length), dtype=seg.t.container)
        if len(TINY_ANS.node.encode(x, seg.t)) < len(TINY_PROGRAM.node.encode(x, seg.t)):
            return Plan(TINY_ANS, {"search": SearchKind.TINY})
    elif not isinstance(seg.t, Tensor) and not seg.parsed and not seg.records and seg.length >= TINY_WORDS_LEAST:
        x = [np.frombuffer(seg.read(0, seg.length), dtype=np.uint8)]
        sizes = [(n, i) for i, p in enumerate(TINY_WORDS) if (n := _coded(p, x, seg.t)) is not None]
        _, i = min(sizes)
        return Plan(TINY_WORDS[i], {"search": SearchKind.TINY})
    return Plan(TINY_PROGRAM, {"search": SearchKind.TINY})


class _Family:
    def __init__(self):
        self.ready = threading.Event()
        self.program: Program | None = None
        self.bytes_per_byte = 0.0


def publish(family: _Family, plan: Plan | None, seg: SegmentInfo) -> None:
    """The leader's plan (None: it failed) made known to its family's followers."""
    if plan is not None and plan.program is not None:
        family.program = plan.program
        estimate = plan.estimate if plan.estimate is not None else plan.stats.get("estimate", 0)
        family.bytes_per_byte = estimate / seg.length
    family.ready.set()


def published(program: Program, bytes_per_byte: float) -> _Family:
    """A family whose leader's program is known (a follower planned in
    another process gets it with its task)."""
    family = _Family()
    family.program, family.bytes_per_byte = program, bytes_per_byte
    family.ready.set()
    return family


class Planner:
    def __init__(self, level: int = DEFAULT_EFFORT, prior: Prior | None = None):
        self.effort = effort(level)
        self.prior = prior or Prior()
        self.families: dict[tuple, _Family] = {}
        self.lock = threading.Lock()
        # Threads the LZMA trials of a byte span may take (_lzma_best): more
        # than one only where this planner plans on one thread of a process
        # with cores to spare (compress sets it), never per thread of a pool.
        self.trial_threads = 1

    # ------------------------------------------------------------ learning
    def strata(self, segments: list[SegmentInfo]) -> list[SegmentInfo]:
        """One representative per stratum, the strata holding most bytes first."""
        groups: dict[str, list[SegmentInfo]] = {}
        for s in segments:
            if s.length > TINY:
                groups.setdefault(s.stratum, []).append(s)
        ranked = sorted(groups.values(), key=lambda g: -sum(s.length for s in g))
        return [g[len(g) // 2] for g in ranked[: self.effort.learn_tensors]]

    def learn_one(self, seg: SegmentInfo) -> tuple[SearchResult, float | None]:
        """Wide search with a uniform prior on one representative tensor:
        its result, and the winner's estimate relative to the entropy."""
        most = self.effort.learn_expansions
        if not isinstance(seg.t, Tensor) and not seg.records:
            # Bytes: the search first finds what they are (floats of which
            # width, words), then their structure, and every byte span is
            # searched with what this prior learns (none takes a learned
            # program), so its few searches here go further.
            most *= BYTES_LEARN_FACTOR
        expansions = min(most, max(64, 4 * seg.length // BYTES_PER_EXPANSION))
        budget = Budget(expansions, self.effort.seconds)
        root, scale = self.root(seg)
        result = search(root, Prior(), seg.role, scale, seg.chunks, budget)
        trial, trial_scale = _trial(root, seg)
        return result, _relative(result.program, trial, seg, trial_scale)

    def learn(self, segments: list[SegmentInfo], map_fn=map) -> Prior:
        chosen = self.strata(segments)
        prior = Prior(samples=len(chosen))
        for seg, (result, relative) in zip(chosen, map_fn(self.learn_one, chosen)):
            prior.observe(result.program, seg.t, seg.role)
            if relative is not None and seg.reference is None:
                prior.remember(result.program, seg.t, seg.role, relative)
        self.prior = prior
        return prior

    # ------------------------------------------------------------ planning
    def root(self, seg: SegmentInfo) -> tuple[Value, float]:
        """The segment's sample as a search value, and the factor from sample to segment bytes."""
        slices = sample(seg, self.effort)
        scale = seg.length / max(1, sum(s.nbytes for s in slices))
        records = [list(f) for f in seg.records] if seg.records else None
        reference = sample(seg, self.effort, seg.reference) if seg.reference else None
        return Value(slices, seg.t, seg.row, opaque=not isinstance(seg.t, Tensor), records=records,
                     reference=reference), scale

    def claim_family(self, seg: SegmentInfo) -> tuple[_Family | None, bool]:
        """Called in archive order: the first segment of a family leads it."""
        key = seg.family
        if key is None or self.effort.level == 0:
            return None, False
        with self.lock:
            if key in self.families:
                return self.families[key], False
            fam = self.families[key] = _Family()
            return fam, True

    def plan(self, seg: SegmentInfo, family: _Family | None = None, leader: bool = False) -> Plan:
        """The segment's program. A family's leader publishes its program
        before its followers (waiting for it) go on, even when it fails."""
        plan = None
        try:
            plan = self._plan(seg, family, leader)
            return plan
        finally:
            if leader and family is not None:
                publish(family, plan, seg)

    def _plan(self, seg: SegmentInfo, family: _Family | None, leader: bool) -> Plan:
        plan = self._choose(seg, family, leader)
        if plan.program is None or plan.stats.get("search") in (SearchKind.TINY, SearchKind.NONE) or seg.records:
            return plan
        if not isinstance(seg.t, Tensor):
            return _measured(seg, plan.program, plan.stats, lzma=seg.lzma and not seg.parsed,
                             lzma_margin=self.effort.lzma_margin, threads=self.trial_threads)
        estimate = plan.estimate
        if seg.length <= WHOLE_TRIAL_BYTES and estimate is not None and seg.reference is None:
            # A tensor's long-range repeats (a basis of sines, tiled rows)
            # show to zstd's window on all of it, not on a sample's slices.
            x = np.frombuffer(seg.read(0, seg.length), dtype=seg.t.container)
            size = len(REPEATS.node.encode(x, seg.t))
            if size < estimate * 0.98:
                return Plan(REPEATS, dict(plan.stats, estimate=size), size)
        return plan

    def _choose(self, seg: SegmentInfo, family: _Family | None, leader: bool) -> Plan:
        if seg.length == 0:
            return Plan(None, {})
        if seg.length <= TINY:
            return _tiny_plan(seg)
        if self.effort.level == 0:
            return Plan(FALLBACK, {"search": SearchKind.NONE})
        root, scale = self.root(seg)
        trial, trial_scale = _trial(root, seg)
        if family is not None and not leader:
            family.ready.wait()
            reused = self._try_reuse(family, trial, seg, trial_scale)
            if reused is not None:
                return reused
        # Bytes no parser typed are searched, never given a learned
        # program: what a program gains on them depends on what discovery
        # found in them (floats, their phase, dead bits), which differs
        # from span to span more than from tensor to tensor.
        shortcut = seg.reference is None and (isinstance(seg.t, Tensor) or seg.parsed or seg.records is not None)
        learned = self._try_library(trial, seg, trial_scale) if shortcut else None
        if learned is not None:
            return learned
        # What a search can win is proportional to the bytes at stake.
        expansions = min(self.effort.expansions, max(32, seg.length // BYTES_PER_EXPANSION))
        if seg.length > PRUNE_MAX_BYTES:
            # ... and a segment this large is searched unpruned (wider), so
            # its budget grows with it: a 33 MB conv weight reached its
            # exponent classes at 800 expansions, 1 % smaller than at 400.
            expansions = int(expansions * min(WIDE_BUDGET_MOST, seg.length / PRUNE_MAX_BYTES))
        result = search(root, self.prior, seg.role, scale, seg.chunks, Budget(expansions, self.effort.seconds))
        stats = {"search": SearchKind.SEARCH, "expanded": result.expanded, "generated": result.generated,
                 "estimate": round(result.estimate), "exhausted": result.exhausted}
        plain, program = _plain_best(root, seg, scale)
        if program is not None and plain < result.estimate:
            result = SearchResult(program, plain, result.expanded, result.generated, result.exhausted)
        if seg.reference is not None:
            for fast in FAST_REFERENCE:
                estimate = _estimate(fast, root, seg, scale)
                if estimate is not None and estimate <= result.estimate * (1 + FAST_SLACK):
                    return Plan(fast, dict(stats, estimate=round(estimate)), estimate)
        return Plan(result.program, dict(stats, estimate=round(result.estimate)), result.estimate)

    def _try_library(self, root: Value, seg: SegmentInfo, scale: float) -> Plan | None:
        """The first learned program for this kind of value (those of the
        segment's role first) that on this segment's sample comes as close
        to the entropy as where it was learned: a trial encoding or a few
        instead of a search."""
        library = sorted(self.prior.library(seg.t), key=lambda p: p.role != seg.role)
        if seg.records:  # blocks take programs learned on blocks of their layout, not on other bytes
            layout = Records(fields=[list(f) for f in seg.records])
            library = [p for p in library if p.program.node == layout]
        for learned in library[:LIBRARY_TRIALS]:
            relative = _relative(learned.program, root, seg, scale)
            if relative is not None and relative <= learned.relative * REUSE_TOLERANCE:
                return _checked(learned.program, relative * _entropy(root, scale), root, seg, scale,
                                SearchKind.LEARNED)
        return None

    def _try_reuse(self, family: _Family, root: Value, seg: SegmentInfo, scale: float) -> Plan | None:
        if family.program is None:
            return None
        estimate = _estimate(family.program, root, seg, scale)
        if estimate is None or estimate > family.bytes_per_byte * seg.length * REUSE_TOLERANCE:
            return None
        # A sibling's program can miss structure this segment has (a constant
        # or upcast tensor in a family of dense ones): its entropy tells.
        if estimate > root.entropy_bytes * scale * ENTROPY_SLACK + 64:
            return None
        return _checked(family.program, estimate, root, seg, scale, SearchKind.FAMILY)


def _checked(program: Program, estimate: float, root: Value, seg: SegmentInfo, scale: float,
             kind: SearchKind) -> Plan | None:
    """A shortcut's program (a learned or a sibling's), taken only where
    the structure detectors find nothing it misses (else None: search):
    it must do as well as the fixed programs (_plain), drop dead low bits
    (_misses_dead_bits), split floats by this segment's exponents
    (_other_exponents), come near its neighbours' differences
    (_misses_differences) and not code a common word's low bits raw
    (_misses_spike)."""
    if program not in _plain_programs(seg.t) and estimate > _plain(root, seg, scale):
        return None
    if _misses_dead_bits(program, root):
        return None
    if _misses_differences(program, estimate, root, scale):
        return None
    if _misses_spike(program, root):
        return None
    if _other_exponents(program, root, seg):
        return None
    program, estimate = _unsplit(program, estimate, root, seg, scale)
    return Plan(program, {"search": kind, "estimate": round(estimate)}, round(estimate))


def _unsplit(program: Program, estimate: float, root: Value, seg: SegmentInfo,
             scale: float) -> tuple[Program, float]:
    """A shortcut's program (a learned or a sibling's) with each split whose
    parts one leaf codes alike (bit_fields[ans, ans]: a byte's two nibbles;
    byte_planes[ans, ans]) replaced by that leaf on the value it splits,
    where that codes the segment no larger as its chunks will code it
    (_estimate's `chunked`): one stream instead of several, half the values
    or fewer to decode, no pass to put the parts together. A split learned
    on a sample is reused by every sibling, and on a sample an `ans` of the
    whole byte looks dearer than it is (its 256 keys binned coarsely). The
    smollm Q4_1 file's nibbles: learned apart, 206 segments, each estimated
    whole +0.09 % (median) on its sample; coded whole 0.024 % smaller, and a
    fresh unpack of the file 161-183 -> 118-130 ms. With the estimate of
    the program taken."""
    paths = _alike_splits(program, seg.t)
    current = _estimate(program, root, seg, scale, chunked=True) if paths else None
    changed = False
    for path in paths:
        candidate = _replaced(program, path, _at(program, path).children[0])
        found = _estimate(candidate, root, seg, scale, chunked=True)
        if found is not None and current is not None and found <= current:
            program, current, changed = candidate, found, True
    if changed:
        estimate = _estimate(program, root, seg, scale) or estimate
    return program, estimate


def _alike_splits(program: Program, t: Field, path: tuple[int, ...] = ()) -> list[tuple[int, ...]]:
    """Paths to the operators whose two or more children are one and the
    same leaf that also codes the operator's own value (of type t), deepest
    first: replacing one leaves the paths of the others as they were."""
    node = program.node
    if not program.children:
        return []
    try:
        types = node.child_types(t)
    except (NotApplicable, ProgramError):
        return []
    out = [p for i, (child, ct) in enumerate(zip(program.children, types))
           for p in _alike_splits(child, ct, path + (i,))]
    first = program.children[0]
    if len(program.children) > 1 and not first.children and all(c == first for c in program.children):
        try:
            first.node.accepts(t)
        except (NotApplicable, ProgramError):
            return out
        out.append(path)
    return out


def _at(program: Program, path: tuple[int, ...]) -> Program:
    """The subprogram at `path` (child indices from the root)."""
    for i in path:
        program = program.children[i]
    return program


def _replaced(program: Program, path: tuple[int, ...], by: Program) -> Program:
    """The program with its subprogram at `path` replaced by `by`."""
    if not path:
        return by
    i = path[0]
    children = program.children[:i] + (_replaced(program.children[i], path[1:], by),) + program.children[i + 1:]
    return Program(program.node, children)


def _plain_programs(t: Field) -> list[Program]:
    """Fixed programs every tensor is measured against: `ans` on the whole
    value, and on its halves for 32- and 64-bit values; and every byte
    span: `ans` on its 2-byte words and on the halves of its 4-byte ones
    (WORD_TRIALS), and its F32 exponents apart (FLOAT_TRIAL): numbers in
    bytes no parser typed."""
    if not isinstance(t, Tensor):
        return list(WORD_TRIALS) + [FLOAT_TRIAL] if t.bits == 8 else []
    out = [TINY_ANS] if t.bits <= 32 else []
    if t.bits in (32, 64):
        out.append(Program.op(halves(t.bits), TINY_ANS, TINY_ANS))
    return out


def _dead_low_bits(root: Value) -> int:
    """The low bits every word of the sample has zero (its elements; a byte
    span's 8-byte words, which the dead bits of 2- and 4-byte words show
    in too): mantissa bits a lower precision left unused."""
    x = root.joined
    if not isinstance(root.t, Tensor):
        if root.t.bits != 8:
            return 0
        x = np.concatenate([s[: len(s) // 8 * 8].view(np.uint64) for s in root.slices])
    return low_zeros(x)


def _misses_dead_bits(program: Program, root: Value) -> bool:
    """A cheap structure detector a shortcut runs before it takes a learned
    or a sibling's program: dead low bits in the words of this segment's
    sample that the program does not drop (it has no `low_zero_bits`).
    Coded as live bits, one dead bit costs a bit per word (a PyTorch
    zip's F32 weights read as bytes: 4.7 % of the span)."""
    if "dead" not in root.memo:
        root.memo["dead"] = _dead_low_bits(root)
    return root.memo["dead"] > 0 and not _has(program, LowZeroBits)


def _misses_differences(program: Program, estimate: float, root: Value, scale: float) -> bool:
    """Whether a program that codes a float tensor's values as they are
    (not their differences) is taken where neighbouring values are alike
    (Value.neighbours_alike), its estimate more than ENTROPY_SLACK above
    the entropy of the differences: a program learned on other tensors, or
    a sibling's (sevenn's exp_avg_sq: `ans` 8 % larger than `delta` and
    `ans`, which the search then finds)."""
    return (not isinstance(program.node, Delta) and root.neighbours_alike
            and estimate > root.difference_bytes * scale * ENTROPY_SLACK + ENTROPY_FLOOR)


def _misses_spike(program: Program, root: Value) -> bool:
    """Whether a plain `ans` of a wide field is taken where one word is
    common enough that its bin's raw low bits cost SPIKE_BITS a value or
    more (Value.spike_bits): other programs code it apart."""
    return isinstance(program.node, Ans) and not program.children and root.spike_bits >= SPIKE_BITS


def _other_exponents(program: Program, root: Value, seg: SegmentInfo) -> bool:
    """Whether a program taken from elsewhere splits floats by exponent
    (`partition`) into other classes than this segment's sample asks for
    (proposals._float_partition): its children would then hold other
    values than those it was found for. Smaller weights have other
    exponents than the tensor a program was learned on (ppocr's classifier:
    the learned program 5 % larger than a search's)."""
    if not isinstance(program.node, Partition) or not isinstance(seg.t, Tensor) or not seg.t.dtype.is_float:
        return False
    fresh = _float_partition(root)
    return fresh is not None and fresh != program.node


def _has(program: Program, kind: type) -> bool:
    return isinstance(program.node, kind) or any(_has(c, kind) for c in program.children)


def _plain_best(root: Value, seg: SegmentInfo, scale: float) -> tuple[float, Program | None]:
    """The best fixed program's estimate on a sample (memoized on it): a
    shortcut (a learned or a sibling's program) or a search result that
    does worse misses structure these find (the joint statistics of a
    value's top bits, a model per block of a value whose statistics
    drift), which a prior learned elsewhere may have pruned."""
    if "plain" not in root.memo:
        best = (float("inf"), None)
        for program in [] if seg.records else _plain_programs(seg.t):  # records: their fields, not words
            estimate = _estimate(program, root, seg, scale)
            if estimate is not None and estimate < best[0]:
                best = (estimate, program)
        root.memo["plain"] = best
    return root.memo["plain"]


def _plain(root: Value, seg: SegmentInfo, scale: float) -> float:
    return _plain_best(root, seg, scale)[0]


def _measured(seg: SegmentInfo, found: Program, stats: dict, lzma: bool, lzma_margin: float,
              threads: int = 1) -> Plan:
    """A byte span's program by measurement on all of it (up to 1 MiB), or
    on two windows of up to 1 MiB (a chunk's worth), centred at a third and
    two thirds of a longer span and coded apart: the one the search found
    on the sample, zstd (level 3 or its order-0 preset), or the bytes read
    as words; and, where `lzma`, LZMA (_lzma_trial) where it is
    `lzma_margin` smaller. A sample shows a coder's order-0 statistics but
    not the repeats a long window finds (strings, tables, copies of arrays,
    zero runs), which decide between them. `threads`: _lzma_best's."""
    if seg.length <= WHOLE_TRIAL_BYTES:
        pieces = [np.frombuffer(seg.read(0, seg.length), dtype=np.uint8)]
    else:  # two windows apart, each coded on its own, as chunks are
        window = min(WHOLE_TRIAL_BYTES, seg.length // 3) // 8 * 8  # whole words, as chunks are
        pieces = [np.frombuffer(seg.read(c - window // 2 - (c - window // 2) % 8, window), dtype=np.uint8)
                  for c in (seg.length // 3, 2 * seg.length // 3)]
    scale = seg.length / sum(len(x) for x in pieces)
    best, best_size = found, None
    for program in [found, *WHOLE_TRIAL_PROGRAMS, *WORD_TRIALS]:
        size = _coded(program, pieces, seg.t)
        if size is not None and (best_size is None or size < best_size):
            best, best_size = program, size
    estimate = None if best_size is None else best_size * scale
    if lzma:
        program, size = _lzma_trial(seg, pieces, threads)
        if estimate is None or size * scale < estimate * (1 - lzma_margin):
            return Plan(program, dict(stats, estimate=round(size * scale)), round(size * scale), LZMA_CHUNK_BYTES)
    estimate = None if estimate is None else round(estimate)
    return Plan(best, dict(stats, estimate=estimate), estimate)


def lzma_wins(read: Callable[[int, int], bytes], pieces: list[tuple[int, int]], margin: float,
              threads: int = 1) -> bool:
    """Whether a byte span is better coded whole by LZMA (the best of its
    literal contexts), by `margin`, than cut into `pieces` ((offset, length) in
    the span, where its statistics change) each coded by the best fast coder: measured on
    LZMA_PROBES * 4 probes of up to LZMA_PROBE_BYTES / 4 at even places,
    each inside one piece, LZMA running over all of them as over the span
    (on all of a short span).
    Discovery asks before cutting a span: LZMA's adaptive model follows
    changes of statistics by itself, and pieces would shorten its window.
    `threads`: _lzma_best's. On one thread the contexts are coded one at a
    time, the best on the middles first, until one comes under the bound:
    the answer _lzma_best's size would give, without the codings the answer
    does not need (where LZMA wins a span, one full coding of two)."""
    length = pieces[-1][0] + pieces[-1][1]
    count, width = 4 * LZMA_PROBES, LZMA_PROBE_BYTES // 4
    probes, k = [], 0
    if length <= count * width:  # all of it
        probes = [np.frombuffer(read(at, n), np.uint8) for at, n in pieces]
        count = 0
    for i in range(count):
        centre = length * (2 * i + 1) // (2 * count)
        while pieces[k][0] + pieces[k][1] <= centre:
            k += 1
        at, n = pieces[k]
        lo = max(at, min(centre - width // 2, at + n - width))
        probes.append(np.frombuffer(read(lo, min(width, n)), np.uint8))
    fast_coders = (WHOLE_TRIAL_PROGRAMS[0], WHOLE_TRIAL_PROGRAMS[1], TINY_ANS) + WORD_TRIALS + PLANE_TRIALS
    fast = sum(min(n for n in (_coded(p, [x], BYTES) for p in fast_coders) if n is not None) for x in probes)
    whole, bound = [np.concatenate(probes)], fast * (1 - margin)
    if threads > 1:  # side by side: no time to save by stopping early
        return _lzma_best(whole, BYTES, threads)[1] < bound
    return any(_coded(LZMA_TRIALS[i], whole, BYTES) < bound for i in _lzma_contenders(whole, BYTES))


def _lzma_best(pieces: list[np.ndarray], t: Field, threads: int = 1) -> tuple[int, int]:
    """(index in LZMA_TRIALS, bytes): the literal context that codes the
    pieces smallest, of the two that code the middle of each piece
    (LZMA_CONTEXT_BYTES in all) smallest, measured on all of them (LZMA
    codes at about 3 MB/s: three contexts on all of a span's probes were
    half of compressing a file no parser knows; the best on the middles
    alone made MTCNN's .npy 0.13 % larger). The contexts are coded side by
    side on up to `threads` threads (_sizes): the same sizes, so the same
    choice, sooner."""
    top = _lzma_contenders(pieces, t, threads)
    size, choice = min(zip(_sizes([(LZMA_TRIALS[i], pieces) for i in top], t, threads), top))
    return choice, size


def _lzma_contenders(pieces: list[np.ndarray], t: Field, threads: int = 1) -> list[int]:
    """The literal contexts (indices in LZMA_TRIALS) _lzma_best measures on
    all of the pieces: every one on LZMA_CONTEXT_BYTES or less, else the two
    that code the middle of each piece smallest, the smaller first."""
    total = sum(len(x) for x in pieces)
    if total <= LZMA_CONTEXT_BYTES:
        return list(range(len(LZMA_TRIALS)))
    share = LZMA_CONTEXT_BYTES / total
    middles = []
    for x in pieces:
        n = max(1, int(len(x) * share)) // 8 * 8 or len(x)
        at = (len(x) - n) // 2 // 8 * 8
        middles.append(x[at:at + n])
    ranked = sorted(zip(_sizes([(p, middles) for p in LZMA_TRIALS], t, threads), range(len(LZMA_TRIALS))))
    return [i for _, i in ranked[:2]]


def _sizes(jobs: list[tuple[Program, list[np.ndarray]]], t: Field, threads: int) -> list[int | None]:
    """_coded(program, pieces, t) for each (program, pieces) of `jobs`, on up
    to `threads` threads at once: liblzma releases the GIL while it codes
    (the trials were a third to a half of compressing files no parser
    knows, on one core while the other waited)."""
    if threads < 2 or len(jobs) < 2:
        return [_coded(p, xs, t) for p, xs in jobs]
    with Threads(min(threads, len(jobs))) as pool:
        return list(pool.map(lambda job: _coded(job[0], job[1], t), jobs))


def _coded(program: Program, pieces: list[np.ndarray], t: Field) -> int | None:
    """The bytes `program` codes the pieces (each on its own) to; None where it does not apply."""
    try:
        return sum(len(b) for x in pieces for b in encode(program, x, t))
    except (NotApplicable, ProgramError):
        return None


def _probes(length: int, read: Callable[[int, int], bytes]) -> list[np.ndarray]:
    """LZMA_PROBES slices of LZMA_PROBE_BYTES from a span's start to its end (all of a short one)."""
    if length <= LZMA_PROBES * LZMA_PROBE_BYTES:
        return [np.frombuffer(read(0, length), np.uint8)]
    room = length - LZMA_PROBE_BYTES
    return [np.frombuffer(read(room * i // (LZMA_PROBES - 1) // 8 * 8, LZMA_PROBE_BYTES), np.uint8)
            for i in range(LZMA_PROBES)]


def _lzma_trial(seg: SegmentInfo, pieces: list[np.ndarray], threads: int = 1) -> tuple[Program, int]:
    """The LZMA trial whose literal context codes probes spread from the
    span's start to its end smallest (a file's statistics change along it:
    its first arrays may be floats, the rest quantized bytes), and its bytes
    on the measurement's pieces."""
    probes = pieces if seg.length <= WHOLE_TRIAL_BYTES else _probes(seg.length, seg.read)  # all of a short span
    choice, size = _lzma_best(probes, seg.t, threads)
    if probes is not pieces:  # each piece coded on its own, as _coded does, side by side
        size = sum(_sizes([(LZMA_TRIALS[choice], [x]) for x in pieces], seg.t, threads))
    return LZMA_TRIALS[choice], size


def _trial(root: Value, seg: SegmentInfo) -> tuple[Value, float]:
    """The part of the sample that trial encodings run on: its middle slice
    (a quarter of the search's sample), enough to tell whether a program
    found elsewhere fits, with its factor to segment bytes."""
    if len(root.slices) == 1:
        return root, seg.length / max(1, root.slices[0].nbytes)
    middle = [root.slices[len(root.slices) // 2]]
    refs = [root.reference[len(root.slices) // 2]] if root.reference is not None else None
    return Value(middle, root.t, root.row, reference=refs), seg.length / max(1, middle[0].nbytes)


def _entropy(root: Value, scale: float) -> float:
    return root.entropy_bytes * scale + ENTROPY_FLOOR


def _estimate(program: Program, root: Value, seg: SegmentInfo, scale: float, chunked: bool = False) -> float | None:
    """A program's estimated bytes for the segment: its sample's streams
    scaled up, plus index entries; None where it does not apply. `chunked`:
    each `ans` leaf estimated as the segment's chunks will code it
    (Ans.estimate's `factor`), not as a sample as long as the slice would be."""
    try:
        program.check(seg.t)
        refs = root.reference or [None] * len(root.slices)
        leaves = program.leaves()
        size = fixed = 0
        for s, r in zip(root.slices, refs):
            leaf = leaf_estimate
            if chunked:  # the chunk's values over the slice's, the same for every leaf below the root
                leaf = partial(_chunk_leaf, factor=seg.length / max(1, seg.chunks) / max(1, s.nbytes))
            for length, model in estimate(program, s, seg.t, r, leaf):
                size, fixed = size + length - model, fixed + model
    except (NotApplicable, ProgramError):
        return None
    per_chunk = fixed / len(root.slices) + STREAM_INDEX_BYTES * len(leaves)
    return size * scale + per_chunk * seg.chunks


def _chunk_leaf(coder, x: np.ndarray, t: Field, factor: float) -> tuple[int, int]:
    """leaf_estimate, an `ans` leaf's as a chunk `factor` times the value codes it."""
    return coder.estimate(x, t, factor) if isinstance(coder, Ans) else leaf_estimate(coder, x, t)


def _relative(program: Program, root: Value, seg: SegmentInfo, scale: float) -> float | None:
    """A program's estimate for the segment over the segment's order-0
    estimate; None where it does not apply (or codes against a base)."""
    estimate = None if program.uses_reference else _estimate(program, root, seg, scale)
    return None if estimate is None else estimate / _entropy(root, scale)
