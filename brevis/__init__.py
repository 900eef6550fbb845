"""Brevis: a lossless archiver for model checkpoints.

Each tensor is stored as a small program of reversible operators whose
execution rebuilds it bit for bit.

    brevis.compress("ckpt/", "ckpt.brv", threads=2)   # a folder, a file, or a list of them
    brevis.decompress("ckpt.brv", "copy/")
    brevis.unpack(archive_bytes)["model.safetensors"]  # every file into memory, checked
    brevis.verify("ckpt.brv", sources="ckpt/")["ok"]
    brevis.inspect("ckpt.brv"); brevis.ls("ckpt.brv")
    with brevis.open("ckpt.brv") as ckpt: ckpt["w"]    # one tensor, decoded alone
    brevis.extract("ckpt.brv", ["w", "layers.0.*"], "part.safetensors")
    brevis.cat("ckpt.brv", "config.json", out)         # archived files to a binary stream
    brevis.compress_many(["run/step-1", "run/step-2"], "archives/", workers=4)
    brevis.compress_run("run/", "run.brv.d")           # a training run, each checkpoint against the last

Every failure raises a BrevisError (brevis.errors: one subclass per kind,
each with its exit_code). help(brevis.compress) and the others document
their arguments and the summary they return.

The API is imported on first use, so that `python -m brevis` has its
signal handling in place before the heavy imports (numpy, zstandard) run.
"""

import os as _os
import signal as _signal
import sys as _sys

__version__ = "0.1.0"


def _interrupted_while_importing(signum, frame):
    _os.write(2, b"brevis: interrupted\n")
    _os._exit(130)


def _is_command() -> bool:
    """Whether this process runs the `brevis` command: its script, or
    `python -m brevis` (while that imports this package, sys.argv[0] is
    "-m" and the module's name is in sys.orig_argv)."""
    if not _sys.argv:
        return False
    if _os.path.basename(_sys.argv[0]) == "brevis":
        return True
    if _sys.argv[0] != "-m":
        return False
    names = ("brevis", "brevis.__main__")
    orig = list(getattr(_sys, "orig_argv", ()))
    for i, arg in enumerate(orig[1:], 1):
        if arg.startswith("-m"):  # -m NAME, or -mNAME
            return (arg[2:] or (orig[i + 1] if i + 1 < len(orig) else "")) in names
        if arg[:1] == "-" and arg[1:].isalpha() and arg.endswith("m"):  # flags ending with m: -Im NAME
            return i + 1 < len(orig) and orig[i + 1] in names
    return False


# Ctrl-C while the command imports itself (numpy, zstandard, Brevis: tens
# of milliseconds, more on a loaded machine), before main() has its
# handlers: one line and exit 130, not a traceback, and never dropped (a
# KeyboardInterrupt raised in a finalizer, which the imports run, is
# printed and dropped: in stop 71's CI `python -m brevis`, which this did not
# guard then, ran on and exited 0). Set here, the first Brevis code
# the command runs, so that the window left is Python's own start (cli.main
# puts its own handler in). Only for the command: a program importing the
# API keeps its own handling, and signal.signal fails off the main thread.
_COMMAND = _is_command()
if _COMMAND and _signal.getsignal(_signal.SIGINT) is _signal.default_int_handler:
    try:
        _signal.signal(_signal.SIGINT, _interrupted_while_importing)
    except ValueError:  # not the main thread
        pass

_API = {"compress", "decompress", "unpack", "explain", "inspect", "learn_prior", "verify",
        "compress_many", "Archive", "extract", "ls", "open_archive", "cat", "default_archive",
        "compress_run", "remove_checkpoint", "inspect_run", "decompress_run", "verify_run"}

__all__ = ["BrevisError", "compress", "decompress", "unpack", "verify", "inspect", "ls", "extract", "cat",
           "open_archive", "Archive", "compress_many", "compress_run", "remove_checkpoint", "inspect_run",
           "decompress_run", "verify_run", "learn_prior", "explain", "default_archive",
           "safe_open", "load_file", "__version__"]
# brevis.open (= open_archive) is not in __all__: `import *` must not hide the builtin.


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__) | {"open"})


def __getattr__(name: str):
    if name in _API or name == "open":
        from . import api

        return getattr(api, "open_archive" if name == "open" else name)
    if name in ("safe_open", "load_file"):  # safetensors-like access (torch or numpy)
        from . import access

        return getattr(access, name)
    if name == "BrevisError":
        from .errors import BrevisError

        return BrevisError
    raise AttributeError(f"module 'brevis' has no attribute {name!r}")
