"""Training runs: a series of checkpoints, each coded against the one before.

A run's archive is a folder of member archives, one per checkpoint
(`checkpoint-25.brv`, `checkpoint-50.brv`, ...). A member is an ordinary
archive (made as `compress --base` makes one) whose index has a `series`
record: the checkpoint's name, its place in the run and its step, its
content identity, and `previous`, the member it is coded against (a file
name in the same folder, and that member's content identity), or null for
a keyframe. Every `keyframe_every`-th checkpoint is a keyframe, so a member
decodes from at most keyframe_every - 1 predecessors.

One archive per checkpoint, rather than one for the run: appending a
checkpoint writes one new file and rewrites none; a member is read, listed,
extracted or verified like any archive (its predecessors are found beside
it); and a run can be copied, pruned or shipped a file at a time.

The content identity of a checkpoint is the first 16 bytes of the SHA-256
of the sorted `FILE NUL NAME NUL SHA256 LF` lines of all its tensors (as
`compress --base` names base tensors). A successor records its
predecessor's; decoding checks it against the predecessor's own record
(cheap: no tensor is hashed again), and every chunk of both is checked
against its digest as it decodes, so a wrong, altered or missing
predecessor is refused, never decoded into wrong bytes.
"""

from __future__ import annotations

import hashlib
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

from .archive.format import MAGIC
from .archive.reader import ArchiveReader
from .codec.base_model import Base
from .errors import BaseRequired, ChecksumError, FormatError, InvalidArgument
from .synth.prior import Prior
from .defaults import DEFAULT_KEYFRAME_EVERY

MAX_CHAIN = 1000  # predecessors a member may need: a crafted run cannot recurse without end
SUFFIX = ".brv"
RUN_SUFFIX = ".brv.d"  # the default name of a run's folder of members

# Step numbers in checkpoint names, strongest first: `global_step100`,
# `step-100`, `iter_100`; then `checkpoint-100`, `ckpt_100`; then `epoch=3`.
# A lightning name `epoch=3-step=900` is ordered by its step.
_STEP_WORDS = (r"global[_-]?step|step|iter(?:ation)?", r"checkpoint|ckpt", r"epoch")
_TRAILING_NUMBER = re.compile(r"(\d+)(?:\.[A-Za-z][A-Za-z0-9]*)*$")


def step_of(name: str) -> int | None:
    """The training step a checkpoint's name tells, or None."""
    for words in _STEP_WORDS:
        found = re.findall(rf"(?:^|[^a-z])(?:{words})[-_=]?(\d+)", name, re.IGNORECASE)
        if found:
            return int(found[-1])
    m = _TRAILING_NUMBER.search(name)
    return int(m.group(1)) if m else None


@dataclass
class Checkpoint:
    path: Path
    name: str  # file or folder name
    step: int | None

    @property
    def archive(self) -> str:
        return self.name + SUFFIX


def checkpoints(paths, order: str = "name", skipped: list | None = None) -> list[Checkpoint]:
    """The checkpoints of a run in step order.

    `paths`: checkpoint folders or files; or one folder holding them (its
    entries whose names tell a step, e.g. `checkpoint-N`, `step_N.pt`,
    `epoch=N.ckpt`). `order`: "name" sorts by the step each name tells
    (refusing names that tell none, or the same one twice); "given" keeps
    the order of `paths`. What a run's folder holds besides its checkpoints
    is appended to `skipped` ({"path", "kind", "reason"}, as compress
    reports what it leaves out)."""
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    roots = [Path(p) for p in paths]
    for r in roots:
        if not r.exists():
            raise InvalidArgument(f"{r}: no such file or folder")
    if len(roots) == 1 and roots[0].is_dir() and _holds_checkpoints(roots[0]):
        entries = sorted(p for p in roots[0].iterdir() if not p.name.startswith("."))
        roots = [p for p in entries if step_of(p.name) is not None]
        if skipped is not None:
            skipped += [{"path": str(p), "kind": "not a checkpoint", "reason": "its name tells no step"}
                        for p in entries if step_of(p.name) is None]
    found = [Checkpoint(r, r.resolve().name if r.name in ("", ".", "..") else r.name, step_of(r.name)) for r in roots]
    if not found:
        raise InvalidArgument("no checkpoints given")
    names = [c.name for c in found]
    for n in names:
        if names.count(n) > 1:
            raise InvalidArgument(f"two checkpoints are named {n!r}: a run's names must differ")
    if order == "given" or len(found) == 1:
        return found
    if order != "name":
        raise InvalidArgument(f"unknown order {order!r} (name or given)")
    for c in found:
        if c.step is None:
            raise InvalidArgument(f"cannot tell the step of {c.path} from its name; "
                                  "give the checkpoints in order with --order given")
    steps = sorted(found, key=lambda c: (c.step, c.name))
    for a, b in zip(steps, steps[1:]):
        if a.step == b.step:
            raise InvalidArgument(f"{a.name} and {b.name} tell the same step ({a.step}); "
                                  "give the checkpoints in order with --order given")
    return steps


def _holds_checkpoints(folder: Path) -> bool:
    """A folder of checkpoints, rather than one checkpoint: some entry's name
    tells a step in words (`checkpoint-N`, `step_N.pt`); a bare number does
    not (`model-00001-of-00002.safetensors` is a shard, not a step)."""
    words = re.compile(rf"(?:^|[^a-z])(?:{'|'.join(_STEP_WORDS)})[-_=]?\d+", re.IGNORECASE)
    return any(words.search(p.name) for p in folder.iterdir() if not p.name.startswith("."))


def content_identity(base: Base) -> str:
    """The content identity of a checkpoint, from its tensors (hashed once)."""
    lines = sorted(f"{t.file}\0{t.name}\0{t.digest().hex()}\n" for t in base.tensors)
    return hashlib.sha256("".join(lines).encode("utf-8", "surrogateescape")).digest()[:16].hex()


# ---------------------------------------------------------------- members
@dataclass
class Member:
    path: Path  # its archive
    series: dict  # the index's series record
    needs_base: bool  # coded against its predecessor (some segment is)
    original_bytes: int
    archive_bytes: int

    @property
    def name(self) -> str:
        """The checkpoint's name: its archive's file name less .brv (what
        decompress_run names its output; never a path read from the index)."""
        return self.path.name[:-len(SUFFIX)]

    @property
    def keyframe(self) -> bool:
        return self.series["previous"] is None or not self.needs_base


def member(path: str | os.PathLike) -> Member:
    """The member of a run stored at `path` (its index only is read)."""
    with ArchiveReader(Path(path)) as reader:
        index = reader.index
        if index.series is None:
            raise InvalidArgument(f"{path} is not a checkpoint of a training run")
        return Member(Path(path), index.series, index.base is not None, index.original_bytes, reader.size)


def members(folder: str | os.PathLike) -> list[Member]:
    """The members of a run's folder, in the run's order."""
    folder = Path(folder)
    if not folder.is_dir():
        raise InvalidArgument(f"{folder}: no such folder")
    found = [member(p) for p in sorted(folder.iterdir()) if p.name.endswith(SUFFIX) and p.is_file()]
    found.sort(key=lambda m: m.series["position"])
    for a, b in zip(found, found[1:]):
        if a.series["position"] == b.series["position"]:
            raise FormatError(f"{a.path.name} and {b.path.name} claim the same place in the run")
    return found


def chain(path: str | os.PathLike) -> list[Member]:
    """The members that decoding the archive at `path` reads: its keyframe
    first, the member itself last."""
    m = member(path)
    out = [m]
    seen = {os.path.realpath(m.path)}
    while not m.keyframe:
        prev = _predecessor(m.path, m.series)
        p = member(prev)
        _check_content(prev, p.series, m.path, m.series)
        key = os.path.realpath(prev)
        if key in seen or len(out) > MAX_CHAIN:
            raise FormatError(f"the predecessors of {path} go round in a loop at {prev.name}")
        seen.add(key)
        out.append(p)
        m = p
    return out[::-1]


def open_predecessor(archive: str | os.PathLike, series: dict, chain: tuple = ()) -> Base:
    """The base a member of a run decodes against: the archive of the
    checkpoint before it, beside it, checked to be the one it was coded
    against (ChunkDecoder). `chain`: the members decoding that lead here."""
    archive = Path(archive)
    here = os.path.realpath(archive)
    if here in chain or len(chain) >= MAX_CHAIN:
        raise FormatError(f"the predecessors of {archive.name} go round in a loop")
    prev = _predecessor(archive, series)
    with open(prev, "rb") as f:
        if f.read(len(MAGIC)) != MAGIC:
            raise FormatError(f"{prev}, the checkpoint before {archive.name} in its run, is not an archive")
    base = Base.open(prev, chain + (here,))
    try:
        _check_content(prev, base.series, archive, series)
    except BaseException:
        base.close()
        raise
    return base


def _predecessor(archive: Path, series: dict) -> Path:
    """The archive a member names as its predecessor, beside it (BaseRequired where it is missing)."""
    prev = archive.parent / series["previous"]["archive"]
    if not prev.is_file():
        raise BaseRequired(f"{archive} is coded against {prev.name}, the checkpoint before it in its run, "
                           f"which is not in {prev.parent}")
    return prev


def _check_content(prev: Path, found: dict | None, archive: Path, series: dict) -> None:
    """The predecessor's own series record (`found`) names the content the member was coded against."""
    if found is None or found["content"] != series["previous"]["content"]:
        raise ChecksumError(f"{prev} is not the checkpoint {archive.name} was coded against "
                            "(its content differs): a wrong or altered predecessor")


# ---------------------------------------------------------------- writing a run
def compress_run(paths, output: str | os.PathLike | None = None, *, order: str = "name",
                 keyframe_every: int = DEFAULT_KEYFRAME_EVERY, progress=None, on_member=None, **options) -> dict:
    """Archive the checkpoints of a run into the folder `output`, one member
    each, in step order; return a summary.

    A folder that holds members already is appended to: checkpoints it
    holds (by name) are kept as they are, and new ones must come after its
    last. Each new checkpoint is coded against the one before it, except
    every `keyframe_every`-th, which stands alone. `options`: those of
    brevis.compress (threads, effort, prior, exclude, ...); `on_member`:
    called with each member's summary as it is written."""
    from .codec.encoder import compress
    from .fleet import archive_prior

    if keyframe_every < 1:
        raise InvalidArgument("--keyframe-every must be at least 1")
    skipped: list[dict] = []
    items = checkpoints(paths, order, skipped)
    out = Path(output) if output is not None else default_output(paths)
    if out.exists() and not out.is_dir():
        raise InvalidArgument(f"{out} exists and is not a folder")
    if not out.absolute().parent.is_dir():
        raise InvalidArgument(f"cannot write {out}: folder {out.absolute().parent} does not exist")
    for c in items:
        if out.absolute() == c.path.absolute() or out.absolute().is_relative_to(c.path.absolute()):
            raise InvalidArgument(f"the output {out} lies inside the checkpoint {c.path}")
    existing = members(out) if out.is_dir() else []
    stored = {m.path.name for m in existing}
    new = [c for c in items if c.archive not in stored]
    tail = existing[-1] if existing else None
    if tail is not None and new:
        _check_follows(tail, new[0], items)
    out.mkdir(exist_ok=True)
    tail_source = next((c for c in items if tail is not None and c.archive == tail.path.name), None)
    depth = len(chain(tail.path)) - 1 if tail is not None else 0
    written, previous_base = [], None
    # One prior for the run's keyframes and one for the checkpoints coded
    # against their predecessor, each learned on the first of its kind:
    # learning is about a third of compressing, and the checkpoints of a
    # run are alike.
    priors: dict[str, Prior] = {}
    try:
        if tail is not None and new and depth + 1 < keyframe_every:
            previous_base = _base_of(tail, tail_source)
        for c in new:
            current = Base.open(c.path)
            try:
                content = content_identity(current)
            except BaseException:
                current.close()
                raise
            keyframe = tail is None or depth + 1 >= keyframe_every
            position = tail.series["position"] + 1 if tail is not None else 0
            series = {"name": c.name, "position": position, "step": c.step, "content": content,
                      "previous": None if keyframe else {"archive": tail.path.name,
                                                         "content": tail.series["content"]}}
            kind = "keyframe" if keyframe else "coded"
            given = {"prior": priors[kind]} if kind in priors and options.get("prior") is None else {}
            try:
                s = compress([c.path], out / c.archive, base=None if keyframe else previous_base,
                             series=series, progress=progress, **{**options, **given})
            except BaseException:
                current.close()
                raise
            if kind not in priors and options.get("prior") is None:
                learned = archive_prior(out / c.archive)
                if learned is not None:
                    priors[kind] = Prior.from_json(learned)
            if previous_base is not None:
                previous_base.close()
            previous_base = current
            tail = Member(out / c.archive, series, s["base_tensors"] > 0, s["original_bytes"], s["archive_bytes"])
            depth = 0 if tail.keyframe else depth + 1
            summary = {"name": c.name, "step": c.step, "position": position, "archive": str(out / c.archive),
                       "original_bytes": s["original_bytes"], "archive_bytes": s["archive_bytes"],
                       "keyframe": tail.keyframe, "predecessors": depth, "seconds": s["seconds"]}
            written.append(summary)
            if on_member:
                on_member(summary)
    finally:
        if previous_base is not None:
            previous_base.close()
    kept = [m.path.name for m in existing]
    return {"output": str(out), "written": written, "kept": kept, "skipped": skipped,
            "member_count": len(kept) + len(written),
            "original_bytes": sum(w["original_bytes"] for w in written),
            "archive_bytes": sum(w["archive_bytes"] for w in written)}


def default_output(paths) -> Path:
    """Where a run is archived without -o: RUN.brv.d beside the run's folder."""
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    if len(paths) == 1 and Path(paths[0]).is_dir():
        p = Path(paths[0])
        if p.name in ("", ".", ".."):
            p = p.resolve()
        return p.parent / (p.name + RUN_SUFFIX)
    raise InvalidArgument("give the run's folder with -o when the checkpoints are not one folder")


def _check_follows(tail: Member, first: Checkpoint, items: list[Checkpoint]) -> None:
    """New checkpoints go after the run's last one: a run is only appended to."""
    step = tail.series["step"]
    names = [c.name for c in items]
    later = (first.step is not None and step is not None and first.step > step) or (
        tail.name in names and names.index(tail.name) < names.index(first.name))
    if not later:
        raise InvalidArgument(f"{first.name} does not come after {tail.name}, the last checkpoint of the run in "
                              f"{tail.path.parent}: a run is only appended to")


def _base_of(tail: Member, source: Checkpoint | None) -> Base:
    """What the checkpoint after `tail` is coded against: the tail's own
    files where they are given and unchanged (read directly), else its
    archive (decoded, with its predecessors)."""
    if source is not None:
        base = Base.open(source.path)
        try:
            if content_identity(base) == tail.series["content"]:
                return base
        except BaseException:
            base.close()
            raise
        base.close()
        raise InvalidArgument(f"{source.path} differs from {tail.path.name}, its archive in the run; "
                              "a checkpoint already archived is never rewritten")
    return Base.open(tail.path)


# ---------------------------------------------------------------- removing a checkpoint
def remove(run: str | os.PathLike, name: str, **options) -> dict:
    """Remove checkpoint `name` (or its archive's name) from a run, re-keying
    the chain: the checkpoint after it is coded again, against the one
    before it (or as a keyframe where the removed one was one), and only
    then is the removed member deleted. Later members are untouched: the
    re-coded one keeps its content identity."""
    from .codec.decoder import decompress
    from .codec.encoder import compress
    from .fs.atomic import io_failure

    found = members(run)
    names = [m.name for m in found]
    files = [m.path.name for m in found]
    if name in names:
        k = names.index(name)
    elif name in files:
        k = files.index(name)
    else:
        raise InvalidArgument(f"{run} holds no checkpoint {name!r}")
    gone = found[k]
    after = next((m for m in found[k + 1:] if not m.keyframe and m.series["previous"]["archive"] == gone.path.name),
                 None)
    recoded = None
    if after is not None:
        import tempfile

        with tempfile.TemporaryDirectory(prefix=".brevis-rekey-", dir=Path(run)) as tmp:
            plain = Path(tmp) / after.name
            decompress(after.path, plain, threads=options.get("threads", 1))
            previous = gone.series["previous"] if not gone.keyframe else None
            series = dict(after.series, previous=previous)
            target = Path(tmp) / after.path.name
            compress([plain], target, base=None if previous is None else gone.path.parent / previous["archive"],
                     series=series, **options)
            os.replace(target, after.path)
            recoded = after.path.name
    try:
        os.unlink(gone.path)
    except OSError as e:
        raise io_failure(e, f"cannot remove {gone.path}") from None
    return {"removed": gone.path.name, "recoded": recoded}


# ---------------------------------------------------------------- a whole run back
def decompress_run(run: str | os.PathLike, output: str | os.PathLike | None = None, *, force: bool = False,
                   threads: int = 1, **options) -> dict:
    """Every checkpoint of a run's folder into `output` (default: the
    folder's name without .brv.d), each as decompress gives it back (its
    folder, or its file), in the run's order. They are decoded into a
    hidden folder beside the output and moved in at the end, so a failure
    leaves none of them; without `force`, an existing checkpoint there is
    refused before anything is decoded."""
    from .codec.decoder import decompress
    from .errors import OutputExists
    from .fs.atomic import io_failure, make_temp, move_new, remove_stale
    from .fs.staging import remove_tree

    run = Path(run)
    found = members(run)
    if not found:
        raise InvalidArgument(f"{run} holds no checkpoint of a training run")
    out = Path(output) if output is not None else run.with_name(run.name[:-len(RUN_SUFFIX)] if
                                                                run.name.endswith(RUN_SUFFIX) else run.name + ".out")
    if out.exists() and not out.is_dir():
        raise OutputExists(f"{out} exists and is not a folder")
    if not force:
        clash = next((out / m.name for m in found if os.path.lexists(out / m.name)), None)
        if clash is not None:
            raise OutputExists(f"{clash} exists", option="force")
    parent = out.absolute().parent
    if not parent.is_dir():
        raise InvalidArgument(f"cannot write {out}: folder {parent} does not exist")
    start, started = time.perf_counter(), time.time_ns()
    try:
        stage, lock = make_temp(parent, out.name, folder=True)  # as decompress stages (codec/decoder.py)
    except OSError as e:
        raise io_failure(e, f"cannot write {out}") from None
    remove_stale(parent, out.name, started)
    try:
        done = [decompress(m.path, stage / m.name, threads=threads, **options) for m in found]
        out.mkdir(exist_ok=True)
        for m in found:
            target = out / m.name
            if not force:
                move_new(stage / m.name, target)  # fails where another process made it meanwhile
                continue
            if target.is_dir() and not target.is_symlink():
                remove_tree(target)
            elif os.path.lexists(target):
                target.unlink()
            os.rename(stage / m.name, target)
    except OSError as e:
        raise io_failure(e, f"cannot write {out}") from None
    finally:
        remove_tree(stage)
        os.close(lock)
    return {"run": str(run), "output": str(out), "member_count": len(found),
            "file_count": sum(d["file_count"] for d in done),
            "original_bytes": sum(d["original_bytes"] for d in done), "seconds": time.perf_counter() - start}


def verify_run(run: str | os.PathLike, sources: str | os.PathLike | None = None, *, threads: int = 1,
               **options) -> dict:
    """verify of every checkpoint of a run's folder; with `sources` (the
    run's folder of checkpoints), each against its checkpoint there."""
    from .codec.verifier import verify

    found = members(run)
    if not found:
        raise InvalidArgument(f"{run} holds no checkpoint of a training run")
    rows = []
    for m in found:
        src = None
        if sources is not None:
            src = Path(sources) / m.name
            if not os.path.lexists(src):
                raise InvalidArgument(f"{src}: no such checkpoint to compare {m.path.name} with")
        r = verify(m.path, [src] if src is not None else None, threads=threads, **options)
        rows.append({"archive": m.path.name, "ok": r["ok"], "file_count": r["file_count"],
                     "problems": r["problems"]})
    return {"run": str(run), "ok": all(r["ok"] for r in rows), "member_count": len(rows), "members": rows,
            "source_compared": sources is not None}
