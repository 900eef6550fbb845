"""The Python API; the CLI is a thin layer over these functions.

    brevis.compress(["ckpt/"], "out.brv", threads=2)
    brevis.decompress("out.brv", "ckpt-copy/")
    brevis.verify("out.brv", sources=["ckpt/"])["ok"]
    brevis.inspect("out.brv")
    with brevis.open("out.brv") as ckpt: ckpt["w"]   # one tensor, decoded alone
    brevis.ls("out.brv"); brevis.extract("out.brv", ["w"], "w.safetensors")
    brevis.compress_many(["run/step-1", "run/step-2"], "archives/", workers=4)  # one archive each

Every failure raises a BrevisError.
"""

from __future__ import annotations

import os
from pathlib import Path

from .access import Archive, extract, ls, open_archive
from .archive.reader import ArchiveReader
from .codec.decoder import decompress
from .codec.verifier import verify
from .codec.encoder import compress
from .fleet import compress_many

__all__ = ["compress", "compress_many", "decompress", "verify", "inspect", "explain", "learn_prior",
           "Archive", "open_archive", "ls", "extract"]


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
                    "search": s.search,
                })
            files.append({"path": f.path, "format": f.format, "original_bytes": f.size,
                          "stored_bytes": f.stored, "segments": segments})
        return {"archive": str(archive), "archive_bytes": reader.size,
                "original_bytes": index.original_bytes, "created_by": index.created_by,
                "dirs": index.dirs, "files": files}


def _productions(program) -> list[str]:
    out = [program.node.id]
    for child in program.children:
        out += _productions(child)
    return out


def explain(archive: str | os.PathLike) -> list[dict]:
    """Which productions won where: per dtype and role, bytes in and out and
    how often each production appears in the chosen programs."""
    from collections import Counter

    from .archive.schema import search_kind
    from .synth.roles import role_of

    rows: dict[tuple[str, str], dict] = {}
    with ArchiveReader(Path(archive)) as reader:
        for f in reader.index.files:
            for s in f.segments:
                if not s.chunks:
                    continue
                key = (s.dtype.name if s.dtype else "bytes", role_of(s.name, s.dtype is not None))
                row = rows.setdefault(key, {"dtype": key[0], "role": key[1], "segments": 0,
                                            "original_bytes": 0, "stored_bytes": 0,
                                            "productions": Counter(), "search": Counter()})
                row["segments"] += 1
                row["original_bytes"] += s.length
                row["stored_bytes"] += s.stored
                kind = search_kind(s.search)
                row["search"][kind.value if kind else "?"] += 1
                for c in s.chunks:  # weighted by chunks: what actually ran
                    row["productions"].update(_productions(s.programs[c.program]))
    out = sorted(rows.values(), key=lambda r: -r["original_bytes"])
    for r in out:
        r["productions"] = dict(r["productions"].most_common())
        r["search"] = dict(r["search"])
    return out


def learn_prior(sources, output=None, *, effort: int = 2, threads: int = 1):
    """Learn a production prior on a checkpoint (and save it to `output`)."""
    from .codec.encoder import learn

    prior = learn(sources, effort=effort, threads=threads)
    if output is not None:
        prior.save(output)
    return prior
