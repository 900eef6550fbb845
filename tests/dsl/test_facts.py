"""What an operator declares about itself (brevis.dsl.operator.Operator) holds
on samples. The tests run over the registry: a new operator that declares a
fact is checked here without being named.

The search hints (splits_records, delta_children, ranked_children) only
steer proposals; tests/synth/test_proposals.py checks that they do.
"""

from __future__ import annotations

import numpy as np
import pytest

from brevis.dsl import REGISTRY, BytePlanes, Program, Raw, decode, encode
from brevis.dsl.operator import Operator
from brevis.dsl.types import Tensor
from brevis.errors import FormatError, NotApplicable, ProgramError
from test_roundtrip import ALL_TYPES, CASES, bulk

FACTS = ("uses_reference", "keeps_order", "splits_records", "delta_children", "signed_children", "ranked_children",
         "typed_children")
OPERATORS = sorted(i for i, c in REGISTRY.items() if issubclass(c, Operator))


def declaring(fact: str) -> list[str]:
    return [i for i in OPERATORS if getattr(REGISTRY[i], fact)]


def root_samples(prod: str, n: int = 64, types=ALL_TYPES):
    """(operator, type, input, reference) for every case of prod with prod at the root."""
    for case in CASES.get(prod, []):
        for t in types:
            program = case.build(t)
            if program is None or program.node.id != prod:
                continue
            x = np.ascontiguousarray(case.admit(bulk(t, n, t.bits, "random"), t), dtype=t.container)
            if len(x) and case.accepts(x, t):
                yield program.node, t, x, bulk(t, len(x), t.bits + 1, "random")


def test_facts_are_declared_booleans():
    for prod in OPERATORS:
        for fact in FACTS:
            assert isinstance(getattr(REGISTRY[prod], fact), bool), (prod, fact)


def test_every_declared_fact_is_checked_somewhere():
    for fact in ("keeps_order", "uses_reference", "signed_children"):
        for prod in declaring(fact):
            assert any(root_samples(prod)), f"{prod} declares {fact} but no case has it at the root"


# ---- keeps_order: child element i comes from input elements i and before
@pytest.mark.parametrize("prod", declaring("keeps_order"))
def test_keeps_order(prod):
    for node, t, x, ref in root_samples(prod):
        kids = node.forward_ref(x, t, ref)
        assert kids and all(len(k) == len(x) for k in kids), f"{node} on {t}: a child is not n long"
        for at in sorted({0, len(x) // 2, len(x) - 1}):
            y = x.copy()
            y[at] ^= t.container.type(1 << (t.bits - 1))  # the top bit: low_zero_bits still applies
            changed = node.forward_ref(y, t, ref)
            for k, c in zip(kids, changed):
                assert np.array_equal(k[:at], c[:at]), f"{node} on {t}: element {at} moved an earlier one"
            assert any(k[at] != c[at] for k, c in zip(kids, changed)), f"{node} on {t}: element {at} is elsewhere"


# ---- uses_reference: the reference is part of the protocol, and it is used
def test_the_operators_that_take_a_reference_declare_it():
    for prod in OPERATORS:
        cls = REGISTRY[prod]
        overrides = cls.forward_ref is not Operator.forward_ref or cls.inverse_ref is not Operator.inverse_ref
        assert overrides == cls.uses_reference, f"{prod}: uses_reference and forward_ref/inverse_ref disagree"


@pytest.mark.parametrize("prod", declaring("uses_reference"))
def test_uses_reference(prod):
    for node, t, x, ref in root_samples(prod):
        program = Program.op(node, *(Program.leaf(Raw()) for _ in node.output_types(t)))
        assert program.uses_reference
        streams = [memoryview(s) for s in encode(program, x, t, ref)]
        assert np.array_equal(decode(program, t, len(x), streams, ref), x)
        other = ref ^ t.container.type(1)
        assert not np.array_equal(decode(program, t, len(x), streams, other), x), f"{node} ignores its reference"
        with pytest.raises(FormatError):
            decode(program, t, len(x), streams, None)
        # Only a root sees the reference: the type checker refuses it below one.
        if isinstance(t, Tensor) and t.bits > 8:
            with pytest.raises(ProgramError):
                Program.op(BytePlanes(), *([program] * len(BytePlanes().output_types(t)))).check(t)


def test_operators_without_a_reference_ignore_one():
    for prod in OPERATORS:
        if REGISTRY[prod].uses_reference:
            continue
        for node, t, x, ref in root_samples(prod, 16):
            assert not Program.op(node).uses_reference
            try:
                plain = node.forward(x, t)
            except NotApplicable:
                continue
            with_ref = node.forward_ref(x, t, ref)
            assert len(plain) == len(with_ref)
            assert all(np.array_equal(a, b) for a, b in zip(plain, with_ref)), prod


# ---- signed_children: differences, small of either sign where the input moves by little
def _signed(v: int, bits: int) -> int:
    return v - (1 << bits) if v >> (bits - 1) else v


@pytest.mark.parametrize("prod", declaring("signed_children"))
def test_signed_children(prod):
    rng = np.random.default_rng(7)
    checked = 0
    for node, t, _, _ in root_samples(prod, types=[t for t in ALL_TYPES if t.bits in (8, 16, 32, 64)]):
        n = 256
        centre = int(rng.integers(0, 1 << min(t.bits, 63)))
        x = np.array([(centre + int(e)) % (1 << t.bits) for e in rng.integers(-4, 5, n)], dtype=np.uint64)
        ref = np.array([(centre + int(e)) % (1 << t.bits) for e in rng.integers(-4, 5, n)], dtype=np.uint64)
        x, ref = x.astype(t.container), ref.astype(t.container)
        inputs = set(x.tolist())
        for kid, kt in zip(node.forward_ref(x, t, ref), node.output_types(t)):
            # An element kept as it is (delta's first `stride`) is no difference.
            bad = [v for v in kid.tolist() if abs(_signed(v, kt.bits)) > 16 and v not in inputs]
            assert not bad, f"{node} on {t}: {bad[:3]} are not small differences"
            checked += 1
    assert checked, f"{prod}: no sample"
