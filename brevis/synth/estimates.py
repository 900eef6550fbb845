"""A leaf's estimate, computed once per content.

The search and the planner's trials ask coders to estimate the same bytes
more than once: one field reached through two operators, a sibling's or a
learned program's trial before the search, the fixed pipeline after it
(ppocr: 2,485 estimates of 1,844 distinct values, 30 % of their time).
Coder.estimate depends only on the coder, the type and the values, so a
digest of the values stands for them (XXH3-128, 20 GB/s here, against the
100-300 us an `ans` estimate of a 64 KB slice takes).
"""

from __future__ import annotations

import threading

import numpy as np
from xxhash import xxh3_128_digest

from ..dsl.operator import Coder
from ..dsl.types import Field

MEMO_ENTRIES = 4096  # the most recent estimates kept (about 200 bytes each)
MEMO_MIN_BYTES = 8192  # smaller values are estimated again: the memo's 4 us a call cost more (piper)

_memo: dict[tuple, tuple[int, int]] = {}
_lock = threading.Lock()  # planning threads share the memo


def leaf_estimate(coder: Coder, x: np.ndarray, t: Field) -> tuple[int, int]:
    """coder.estimate(x, t), from the memo where these values were estimated before."""
    if x.nbytes < MEMO_MIN_BYTES or not coder.remembered:
        return coder.estimate(x, t)
    x = np.ascontiguousarray(x)
    key = (coder, t, x.dtype.str, x.shape, xxh3_128_digest(x))
    return remembered(_memo, _lock, MEMO_ENTRIES, key, lambda: coder.estimate(x, t))


def remembered(memo: dict, lock: threading.Lock, most: int, key, compute):
    """compute(), or the value `memo` keeps under `key`: the `most` most
    recent kept, the oldest dropped first (dicts keep insertion order).
    `lock` guards the memo only: two threads may compute one key at once,
    to the same value."""
    with lock:
        found = memo.get(key)
    if found is None:
        found = compute()
        with lock:
            memo[key] = found
            if len(memo) > most:
                del memo[next(iter(memo))]
    return found
