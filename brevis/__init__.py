"""Brevis: a lossless archiver for model checkpoints.

Each tensor is stored as a small program of reversible operators whose
execution rebuilds it bit for bit.

The API is imported on first use, so that `python -m brevis` has its
signal handling in place before the heavy imports (numpy, zstandard) run.
"""

__version__ = "0.1.0"

_API = {"compress", "decompress", "explain", "inspect", "learn_prior", "verify",
        "compress_many", "Archive", "extract", "ls", "open_archive"}

__all__ = ["BrevisError", "compress", "decompress", "explain", "inspect", "learn_prior", "verify",
           "compress_many", "Archive", "extract", "ls", "__version__"]
# brevis.open (open_archive) is not in __all__: `import *` must not hide the builtin.


def __getattr__(name: str):
    if name in _API or name == "open":
        from . import api

        return getattr(api, "open_archive" if name == "open" else name)
    if name == "BrevisError":
        from .errors import BrevisError

        return BrevisError
    raise AttributeError(f"module 'brevis' has no attribute {name!r}")
