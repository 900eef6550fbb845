"""The Python API; the CLI is a thin layer over these functions.

    brevis.compress(["ckpt/"], "out.brv", threads=2)
    brevis.decompress("out.brv", "ckpt-copy/")
    brevis.verify("out.brv", sources=["ckpt/"])["ok"]
    brevis.inspect("out.brv")
    with brevis.open("out.brv") as ckpt: ckpt["w"]   # one tensor, decoded alone
    brevis.ls("out.brv"); brevis.extract("out.brv", ["w"], "w.safetensors")
    brevis.compress_many(["run/step-1", "run/step-2"], "archives/", workers=4)  # one archive each

Every failure raises a BrevisError. A source, an archive or an output is
a str or an os.PathLike; where a function takes several sources it takes
one path too. The summaries are dicts of one vocabulary (README, "JSON
output"): `file_count`/`tensor_count` count what `files`/`tensors` list,
`original_bytes` are bytes of the original data, `stored_bytes` what a
part takes in the archive, `archive_bytes` the archive's size,
`output_bytes` the size of a file written.
"""

from __future__ import annotations

import fnmatch
import os
import sys
import time
from pathlib import Path
from typing import BinaryIO, Callable

from . import access
from .access import Archive, ls, open_archive
from .archive.reader import ArchiveReader
from .codec import decoder as _decoder
from .errors import InvalidArgument
from .fs.atomic import io_failure
from .defaults import DEFAULT_EFFORT

__all__ = ["compress", "compress_many", "compress_run", "remove_checkpoint", "decompress", "verify", "inspect",
           "inspect_run", "decompress_run", "verify_run", "explain", "learn_prior",
           "Archive", "open_archive", "ls", "extract", "cat", "default_archive"]

Progress = Callable[[int], None] | None


def _paths(sources) -> list:
    """One path or an iterable of paths, as a list (a str is one path, not its characters)."""
    if isinstance(sources, (str, os.PathLike)):
        return [sources]
    return list(sources)


def default_archive(sources) -> Path:
    """The archive compress writes when none is named: X.brv beside X, for
    one source X (a folder ckpt/ gives ckpt.brv), as zstd names X.zst."""
    sources = _paths(sources)
    if len(sources) != 1:
        raise InvalidArgument(f"{len(sources)} sources: name the archive to write" if sources
                              else "nothing to compress")
    p = Path(sources[0])
    if p.name in ("", ".", ".."):
        p = p.resolve()
    return p.with_name(p.name + ".brv")


def compress(sources, output: str | os.PathLike | None = None, *, threads: int = 1, force: bool = False,
             effort: int = DEFAULT_EFFORT, prior=None, base: str | os.PathLike | None = None,
             exclude=(), default_excludes: bool = True, progress: Progress = None, executor=None,
             processes: bool | None = None, **tuning) -> dict:
    """Compress checkpoint folders or files into one archive; return a summary.

    `sources`: a folder (its contents are archived, walked recursively), a
    file, or a list of them (each then named by its base name). `output`:
    the archive (default: default_archive, X.brv beside X). `threads`:
    chunks of inputs of 8 MiB or more are encoded in this many worker
    processes (`processes=False`: threads; `executor`: any
    concurrent.futures executor, e.g. Dask's). `force`: overwrite an
    existing archive. `effort` 0..3; `prior`: a Prior or a prior file
    (learn_prior) instead of learning one; `base`: code tensors against
    this base model (folder, file or archive) where it helps. `exclude`:
    glob patterns of archived names to leave out of folders (a pattern
    without '/' matches a name at any depth, a trailing '/' folders only);
    `default_excludes=False` keeps version control folders and .DS_Store.
    `progress(n)` is called as each chunk of n original bytes is written.

    The summary: archive, file_count, original_bytes, archive_bytes, ratio,
    seconds, learn_seconds, throughput_mb_s, effort, prior_samples,
    encode_processes, skipped (each {path, kind, reason}), main_thread_cpu_s
    and writer_cpu_s (the CPU seconds of the calling thread and of the
    thread writing streams, 0 where the calling thread wrote them)."""
    from .codec import encoder as _encoder  # the search and its planner: not paid by reading commands

    sources = _paths(sources)
    if output is None:
        output = default_archive(sources)
    return _encoder.compress(sources, output, threads=threads, force=force, effort=effort, prior=prior, base=base,
                             exclude=exclude, default_excludes=default_excludes, progress=progress,
                             executor=executor, processes=processes, **tuning)


def decompress(archive: str | os.PathLike, output: str | os.PathLike | None = None, *, threads: int = 1,
               force: bool = False, base=None, progress: Progress = None, executor=None,
               processes: bool | None = None, modes: bool = True, mtimes: bool = True, only=None) -> dict:
    """Rebuild every archived file, byte for byte; return a summary.

    An archive of one file gives that file back: `output` names it (an
    existing folder, or a path ending with a separator: the file goes
    inside), by default it is written beside the archive under its
    archived name. Any other archive is rebuilt in the folder `output`
    (default: the archive's path without .brv), created if needed;
    existing files are refused unless `force`. `base`: the base model, for
    an archive made against one. `progress(n)`: n more original bytes done.
    Files get back their permission bits (less the umask) and modification
    times (`modes=False`, `mtimes=False`: not restored); links inside the
    tree come back as links. `only`: glob patterns (or one string of them,
    comma-separated): just the files and links they match (a pattern
    without '/' matches a name at any depth), and what those links point at.

    The summary: archive, output, file_count, link_count, original_bytes,
    seconds, main_thread_cpu_s (the calling thread's CPU seconds)."""
    return _decoder.decompress(archive, output, threads=threads, force=force, progress=progress, base=base,
                               executor=executor, processes=processes, modes=modes, mtimes=mtimes, only=only)


def unpack(archive, *, threads: int = 1, base=None, progress: Progress = None) -> dict[str, memoryview]:
    """Decode every archived file into memory, checking every checksum;
    return {archived path: its bytes (a memoryview)}, no file written.

    `archive`: a path, or the archive's bytes already in memory (bytes,
    bytearray, memoryview, mmap), read in place without a copy. Decodes on
    `threads` threads of this process. Links and folders are left out. An
    archive in memory that was made against a base needs `base`."""
    return _decoder.unpack(archive, threads=threads, base=base, progress=progress)


def verify(archive: str | os.PathLike, sources=None, *, threads: int = 1, base=None, progress: Progress = None,
           executor=None, processes: bool | None = None) -> dict:
    """Decode everything and check every checksum; with `sources` (named as
    for compress), compare with the original files too.

    The report: archive, ok (True only when everything matched), file_count,
    original_bytes, source_compared, problems (each {file, segment, error}),
    seconds."""
    from .codec import verifier as _verifier

    return _verifier.verify(archive, _paths(sources) if sources else None, threads=threads, progress=progress,
                            base=base, executor=executor, processes=processes)


def compress_many(checkpoints, outdir: str | os.PathLike, **options) -> dict:
    """Archive each checkpoint (a folder or file, or a list of them) into
    OUTDIR/NAME.brv on Dask workers or a local process pool, verifying each
    archive against its source; see brevis.fleet.compress_many for the
    options (engine, workers, scheduler, retries, force, effort, prior,
    threads, base, progress)."""
    from .fleet import compress_many as run

    return run(_paths(checkpoints), outdir, **options)


def compress_run(checkpoints, output: str | os.PathLike | None = None, **options) -> dict:
    """Archive the checkpoints of a training run (its folder, or the
    checkpoints' folders or files) into a folder of one archive per
    checkpoint, each coded against the one before, with a keyframe every
    `keyframe_every` (brevis.series.compress_run: order, keyframe_every,
    on_member, and brevis.compress's options). An existing folder of the
    run is appended to. Returns a summary: output, written (a report per
    new member), kept, skipped (what a run's folder holds besides its
    checkpoints), member_count, original_bytes, archive_bytes."""
    from .series import compress_run as run

    return run(checkpoints, output, **options)


def decompress_run(run: str | os.PathLike, output: str | os.PathLike | None = None, **options) -> dict:
    """Every checkpoint of a training run's folder of archives, back into
    `output` (default: the folder's name without .brv.d), all or none
    (brevis.series.decompress_run: force, threads, modes, mtimes)."""
    from .series import decompress_run as run_back

    return run_back(run, output, **options)


def verify_run(run: str | os.PathLike, sources: str | os.PathLike | None = None, **options) -> dict:
    """verify every checkpoint of a training run's folder of archives; with
    `sources`, the run's folder of checkpoints, each against its own."""
    from .series import verify_run as check

    return check(run, sources, **options)


def remove_checkpoint(run: str | os.PathLike, name: str, **options) -> dict:
    """Remove a checkpoint from a run's folder, re-coding the one after it so
    that every other checkpoint still decodes (brevis.series.remove)."""
    from .series import remove

    return remove(run, name, **options)


def _series(path: Path, series: dict | None) -> dict | None:
    """A member's place in its run and what decoding it reads (its chain)."""
    if series is None:
        return None
    from .errors import BrevisError
    from .series import chain

    out = dict(series)
    try:
        members = chain(path)
        out["chain"] = [m.path.name for m in members]
        out["chain_original_bytes"] = sum(m.original_bytes for m in members)
        out["chain_archive_bytes"] = sum(m.archive_bytes for m in members)
        out["chain_error"] = None
    except BrevisError as e:
        out["chain"], out["chain_original_bytes"], out["chain_archive_bytes"] = None, None, None
        out["chain_error"] = str(e)
    return out


def inspect_run(run: str | os.PathLike) -> dict:
    """A run's folder of archives, from their indexes: run, member_count,
    original_bytes, archive_bytes, and members in order (archive, name,
    position, step, original_bytes, archive_bytes, keyframe, previous)."""
    from .series import members

    found = members(run)
    rows = [{"archive": m.path.name, "name": m.name, "position": m.series["position"], "step": m.series["step"],
             "original_bytes": m.original_bytes, "archive_bytes": m.archive_bytes, "keyframe": m.keyframe,
             "previous": None if m.keyframe else m.series["previous"]["archive"]} for m in found]
    return {"run": str(run), "member_count": len(rows), "original_bytes": sum(r["original_bytes"] for r in rows),
            "archive_bytes": sum(r["archive_bytes"] for r in rows), "members": rows}


def inspect(archive: str | os.PathLike) -> dict:
    """Everything the index says, decoding nothing: archive, archive_bytes,
    original_bytes, file_count, tensor_count, base_required (made against a
    base model), created_by, dirs, and files, each with its segments (name,
    dtype, shape, original_bytes, stored_bytes, chunks, programs, search;
    members, [{name, shape}], for a segment of gathered tensors);
    series, for a checkpoint of a training run: its record and chain (the
    archives decoding it reads, keyframe first), chain_original_bytes and
    chain_archive_bytes (what reaching it costs), chain_error. A run's
    folder gives inspect_run's summary."""
    if Path(archive).is_dir():
        return inspect_run(archive)
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
                    **({"members": [{"name": n, "shape": list(shape)} for n, shape in s.members]}
                       if s.members is not None else {}),
                })
            files.append({"path": f.path, "format": f.format, "original_bytes": f.size,
                          "stored_bytes": f.stored, "segments": segments})
        return {"archive": str(archive), "archive_bytes": reader.size,
                "original_bytes": index.original_bytes, "file_count": len(files),
                "tensor_count": sum(len(f.tensors()) for f in index.files),
                "base_required": index.base is not None and index.series is None,
                "created_by": index.created_by,
                "dirs": index.dirs, "files": files,
                "links": [{"path": k.path, "target": k.target} for k in index.links],
                "series": _series(Path(archive), index.series)}


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
    """Learn a production prior on a checkpoint (a folder, a file or a list
    of them) and save it to `output` if given; return the Prior, to give
    to compress(prior=...)."""
    from .codec.encoder import learn

    prior = learn(_paths(sources), effort=effort, threads=threads)
    if output is not None:
        prior.save(output)
    return prior


# ------------------------------------------------------------ extract and cat
_GLOB = "*?["


def _is_glob(name: str) -> bool:
    return any(c in name for c in _GLOB)


def expand_tensor_names(archive: str | os.PathLike, names) -> list[str]:
    """Names with glob patterns (* ? [...]) replaced by the keys of the
    tensors they match (by key, bare name or path::name), in archive order; a
    pattern that matches nothing is an error."""
    names = _paths(names)
    if not any(_is_glob(n) for n in names):
        return names
    with ArchiveReader(Path(archive)) as reader:
        entries, _, _ = access.name_tensors(reader.index)
    out: list[str] = []
    for n in names:
        if not _is_glob(n):
            out.append(n)
            continue
        found = [k for k, (f, s) in entries.items()
                 if any(fnmatch.fnmatchcase(form, n) for form in (k, s.name, f"{f.path}{access.QUALIFIER}{s.name}"))]
        if not found:
            raise InvalidArgument(f"no tensor of {archive} matches {n!r}")
        out += found
    return list(dict.fromkeys(out))


def default_extract_output(archive: str | os.PathLike) -> Path:
    """ckpt.brv -> ckpt.part.safetensors, beside the archive."""
    a = Path(archive)
    return a.with_name((a.stem if a.suffix == ".brv" else a.name) + ".part.safetensors")


def extract(archive: str | os.PathLike, names, output: str | os.PathLike | None = None, *, force: bool = False,
            threads: int = 1, base=None) -> dict:
    """Write the named tensors to a safetensors file, bit for bit.

    `names`: tensor keys or bare names (brevis.ls lists them), or glob
    patterns of them (`"*.attn.*"`), in the order wanted. `output`: the
    file (default: default_extract_output, ARCHIVE.part.safetensors);
    an existing one is refused unless `force`.

    The summary: archive, output, tensors (their names in the file),
    tensor_count, original_bytes (tensor data), output_bytes, seconds."""
    names = expand_tensor_names(archive, names)
    if output is None:
        output = default_extract_output(archive)
    return access.extract(archive, names, output, force=force, threads=threads, base=base)


def cat(archive: str | os.PathLike, paths=None, out: BinaryIO | None = None, *, threads: int = 1,
        base=None) -> dict:
    """Write archived files, whole and in order, to the binary stream `out`
    (default: standard output), every chunk checked as it is decoded.

    `paths`: archived paths (as brevis.ls shows them) or glob patterns of
    them; none: the archive's one file (an archive of several files then
    is an error). The summary: archive, files (the paths written),
    file_count, original_bytes, seconds."""
    from .access import follow_links
    from .codec.chunks import ChunkDecoder
    from .workers.pool import Pool

    start = time.perf_counter()
    stream = out if out is not None else sys.stdout.buffer
    with ArchiveReader(Path(archive)) as reader:
        index = reader.index
        by_path = {f.path: f for f in index.files}
        if not paths:
            one = _decoder.single_file(index)
            if one is None:
                raise InvalidArgument(f"{archive} holds {len(index.files)} files and {len(index.dirs)} folders: "
                                      "name the files to write")
            chosen = [one]
        else:
            chosen = []
            for p in _paths(paths):
                if _is_glob(p):
                    found = [f for f in by_path if fnmatch.fnmatchcase(f, p)]
                    if not found:
                        raise InvalidArgument(f"no file of {archive} matches {p!r}")
                    chosen += found
                elif p in by_path:
                    chosen.append(p)
                elif follow_links(index, p) in by_path:  # an archived link: what it points at
                    chosen.append(follow_links(index, p))
                else:
                    raise InvalidArgument(f"no file {p!r} in {archive}")
        decoder = ChunkDecoder(reader, base)
        work = [w for p in chosen for w in decoder.in_file_order(by_path[p])]
        with Pool(threads) as pool:
            try:
                for data in pool.ordered_map(lambda w: decoder.decode(*w) if isinstance(w, tuple) else w, work):
                    stream.write(memoryview(data))
                stream.flush()
            except BrokenPipeError:
                raise
            except OSError as e:
                raise io_failure(e, "cannot write the output") from None
    return {"archive": str(archive), "files": chosen, "file_count": len(chosen),
            "original_bytes": sum(by_path[p].size for p in chosen), "seconds": time.perf_counter() - start}
