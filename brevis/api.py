"""The Python API; the CLI is a thin layer over these functions.

    brevis.compress(["ckpt/"], "out.brv", threads=2)
    brevis.decompress("out.brv", "ckpt-copy/")
    brevis.verify("out.brv", sources=["ckpt/"])["ok"]
    brevis.inspect("out.brv")

Every failure raises a BrevisError.
"""

from __future__ import annotations

import os
from pathlib import Path

from .archive.reader import ArchiveReader
from .decoder import decompress, verify
from .encoder import compress

__all__ = ["compress", "decompress", "verify", "inspect"]


def inspect(archive: str | os.PathLike) -> dict:
    """Everything the index says: per file and segment, sizes and programs."""
    with ArchiveReader(Path(archive)) as reader:
        index = reader.index
        files = []
        for f in index.files:
            segments = []
            for s in f.segments:
                uses = [sum(1 for c in s.chunks if c.program == i) for i in range(len(s.programs))]
                segments.append({
                    "name": s.name,
                    "dtype": s.dtype.name if s.dtype else "bytes",
                    "shape": list(s.shape) if s.shape is not None else None,
                    "original_bytes": s.length,
                    "stored_bytes": s.stored,
                    "chunks": len(s.chunks),
                    "programs": [{"program": p.describe(s.value_type), "chunks": n}
                                 for p, n in zip(s.programs, uses)],
                })
            files.append({"path": f.path, "format": f.format, "original_bytes": f.size,
                          "stored_bytes": f.stored, "segments": segments})
        return {"archive": str(archive), "archive_bytes": reader.size,
                "original_bytes": index.original_bytes, "created_by": index.created_by,
                "dirs": index.dirs, "files": files}
