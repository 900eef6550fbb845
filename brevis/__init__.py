"""Brevis: a lossless archiver for model checkpoints.

Each tensor is stored as a small program of reversible operators whose
execution rebuilds it bit for bit.
"""

__version__ = "0.1.0"

from .api import compress, decompress, explain, inspect, learn_prior, verify  # noqa: E402
from .errors import BrevisError  # noqa: E402

__all__ = ["BrevisError", "compress", "decompress", "explain", "inspect", "learn_prior", "verify", "__version__"]
