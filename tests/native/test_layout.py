"""The tiled transpose kernel against numpy's transposed copy."""

from __future__ import annotations

import numpy as np
import pytest

from brevis.dsl import delta

pytestmark = pytest.mark.skipif(delta._layout is None, reason="the C extension is not built")


@pytest.mark.parametrize("dtype", [np.uint8, np.uint16, np.uint32, np.uint64])
@pytest.mark.parametrize("rows,cols", [(0, 5), (1, 1), (1, 40), (3, 7), (33, 65), (1000, 517)])
def test_tiled_transpose_is_numpys(dtype, rows, cols):
    x = np.random.default_rng(rows * cols).integers(0, 255, rows * cols).astype(dtype)
    assert np.array_equal(delta._transposed(x, rows, cols), x.reshape(rows, cols).T.reshape(-1))


def test_bad_arguments_are_refused():
    x = np.zeros(12, np.uint16)
    with pytest.raises(ValueError):
        delta._layout.transpose(x, 3, 5, 2, np.empty_like(x))  # wrong size
    with pytest.raises(ValueError):
        delta._layout.transpose(x, 3, 4, 2, x)  # in place
    with pytest.raises(ValueError):
        delta._layout.transpose(x, 3, 4, 3, np.empty_like(x))  # item size
