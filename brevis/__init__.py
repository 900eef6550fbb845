"""Brevis: a lossless archiver for model checkpoints.

Each tensor is stored as a small program of reversible operators whose
execution rebuilds it bit for bit.
"""

__version__ = "0.1.0"

from .api import compress, decompress, explain, inspect, learn_prior, verify  # noqa: E402
from .api import Archive, compress_many, extract, ls  # noqa: E402
from .api import open_archive as open  # noqa: E402  (not in __all__: `import *` must not hide the builtin)
from .errors import BrevisError  # noqa: E402

__all__ = ["BrevisError", "compress", "decompress", "explain", "inspect", "learn_prior", "verify",
           "compress_many", "Archive", "extract", "ls", "__version__"]
