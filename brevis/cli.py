"""The `brevis` command. Commands only: the work is in brevis.api.

Errors are one line on stderr and an exit code per kind (see errors.py);
tracebacks only with --debug.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import tempfile
import threading
import traceback
from contextlib import ExitStack as contextlib_exit, contextmanager
from pathlib import Path


from . import _COMMAND  # the `brevis` command (its script or python -m brevis): see brevis/__init__.py

# numpy's OpenBLAS starts a thread per core that spins for about 0.1 s of CPU
# after the import (0.18 s of CPU for `import numpy` and a second's sleep,
# 0.07 s with one thread): Brevis does no linear algebra, and the spin takes
# a core from its own threads and worker processes (which inherit this).
# Only for the command, before numpy is imported: a library caller's process
# keeps its own setting.
if _COMMAND and "numpy" not in sys.modules:
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import click  # noqa: E402

from . import __version__, interrupts  # noqa: E402
from .defaults import DEFAULT_EFFORT, DEFAULT_KEYFRAME_EVERY, default_threads
from .errors import BrevisError, InvalidArgument, OutputExists
from .fs.sources import collect  # noqa: E402


class _Api:
    """brevis.api, imported on a command's first use of it: `brevis --help`,
    `--version` and usage errors do not pay for numpy and the codec
    (about 0.15 s here), and the command's handlers (main) are in place
    when the heavy imports run."""

    def __getattr__(self, name: str):
        from . import api

        return getattr(api, name)


api = _Api()

EXIT_INTERRUPTED = 130
EXIT_INTERNAL = 70
EXIT_USAGE = 2
# The distribution's name on the package index ("brevis" there is another project).
DIST = "brevis-ckpt"
# The CLI's words for what gets past an error (BrevisError.option).
OPTION_HINTS = {"force": " (use --force to overwrite)", "base": ": pass it with --base"}


def _n(count: int, word: str, plural: str | None = None) -> str:
    """'1 file', '3 files'."""
    return f"{count} {word if count == 1 else plural or word + 's'}"


def shown(text) -> str:
    """A name as printed: characters that are not printable (control
    characters, ANSI escapes, newlines, lone surrogates) escaped, so a name
    from an archive can neither move the terminal nor split a line, and
    prints on a strict UTF-8 standard output; a surrogate escape of a byte
    that is not UTF-8 is shown as that byte (\\xNN)."""
    text = str(text)
    if text.isprintable():
        return text
    out = []
    for c in text:
        if c.isprintable():
            out.append(c)
        elif 0xDC80 <= ord(c) <= 0xDCFF:
            out.append(f"\\x{ord(c) - 0xDC00:02x}")
        else:
            out.append(c.encode("unicode_escape").decode("ascii"))
    return "".join(out)


def _size(n: float) -> str:
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return str(n)


def _is_terminal(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


class Progress:
    """The progress hook of a long command: a bar on standard error when it
    is a terminal (tqdm), with the total, percentage, rate and ETA, moved by
    each chunk done (`progress(n)`: n more bytes). Its clock starts at the
    first chunk, so that what runs before (scanning, learning the prior)
    does not open with an absurd ETA. Safe to call from several threads."""

    def __init__(self, total: int, quiet: bool, desc: str, file=None):
        self.total = total
        self.bar = None
        self.started = False
        self.lock = threading.Lock()
        file = file if file is not None else sys.stderr
        if not quiet and _is_terminal(file):
            from tqdm import tqdm

            self.bar = tqdm(total=total or None, unit="B", unit_scale=True, unit_divisor=1024, desc=desc,
                            leave=False, file=file, dynamic_ncols=True)

    def __call__(self, n: int) -> None:
        if self.bar is None or not n:
            return
        with self.lock:
            if not self.started:
                self.started = True
                self.bar.reset(total=self.total or None)  # the clock starts now
            self.bar.update(n)

    def write(self, line: str, file=None) -> None:
        """A line above the bar (or just the line, without one)."""
        if self.bar is None:
            click.echo(line, file=file)
        else:
            with self.lock:
                self.bar.write(line, file=file)

    def close(self) -> None:
        if self.bar is not None:
            with self.lock:
                self.bar.refresh()
                self.bar.close()

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _archive_total(archive: str, progress_wanted: bool) -> int:
    """Original bytes of an archive, for a bar's total (read only when a bar shows)."""
    if not progress_wanted:
        return 0
    from .archive.reader import ArchiveReader

    try:
        with ArchiveReader(Path(archive)) as reader:
            return reader.index.original_bytes
    except BrevisError:
        return 0  # the command itself says what is wrong


def _bar_wanted(quiet: bool) -> bool:
    return not quiet and _is_terminal(sys.stderr)


@contextmanager
def _archive_input(archive: str):
    """The archive's path; '-' reads it from standard input into a temporary
    file first (the reader needs to seek: the index is at the end)."""
    if archive != "-":
        yield archive
        return
    if _is_terminal(sys.stdin):
        raise InvalidArgument("no archive on standard input (it is a terminal)")
    with _spooled_stdin("stdin.brv", "brevis-stdin-", None) as path:
        yield path


@contextmanager
def _spooled_stdin(name: str, prefix: str, parent: str | None):
    """Standard input copied to a file `name` in a new temporary folder
    (in `parent`, or the system's), removed with it afterwards."""
    folder = tempfile.mkdtemp(prefix=prefix, dir=parent)
    try:
        path = os.path.join(folder, name)
        try:
            with open(path, "wb") as f:
                shutil.copyfileobj(sys.stdin.buffer, f, 1 << 20)
        except OSError as e:
            from .fs.atomic import io_failure

            raise io_failure(e, "cannot spool standard input") from None
        yield path
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _refuse_terminal_stdout(what: str) -> None:
    if _is_terminal(sys.stdout):
        raise InvalidArgument(f"refusing to write {what} to a terminal: redirect standard output, or name a file with -o")


def _emit(as_json: bool, quiet: bool, summary: dict, line: str, err: bool = False) -> None:
    if as_json:
        click.echo(json.dumps(summary, indent=1), err=err)
    elif not quiet:
        click.echo(line, err=err)


def _threads_option(help: str):
    return click.option("-j", "--threads", type=click.IntRange(min=1), default=None, help=help)


DECODE_THREADS = ("Decoding: worker processes from 3 threads for archives of 32 MiB or more, else threads "
                  "(default: one per core).")
threads_option = _threads_option(DECODE_THREADS)
quiet_option = click.option("-q", "--quiet", is_flag=True, help="No progress bar, no summary.")
json_option = click.option("--json", "as_json", is_flag=True, help="Print a JSON summary on stdout.")
base_option = click.option("--base", type=click.Path(path_type=str), default=None,
                           help="The base model the archive was made against (compress --base).")
effort_option = click.option("-e", "--effort", type=click.IntRange(0, 3), default=DEFAULT_EFFORT, show_default=True,
                             help="Search effort: 0 no search, 1 fast, 2 default, 3 thorough (and, in files no parser "
                                  "knows, LZMA where it codes 0.5 % smaller, not 5 %: smaller, decoding 10-40x slower).")


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="brevis")
@click.option("--debug", is_flag=True, help="Show tracebacks on errors.")
@click.pass_context
def cli(ctx: click.Context, debug: bool) -> None:
    """Brevis: lossless archives of model checkpoints."""
    ctx.obj = {"debug": debug}


def _report_skipped(skipped: list[dict], quiet: bool) -> None:
    """What compress left out, and why, on standard error."""
    if quiet or not skipped:
        return
    shown = 20
    for k in skipped[:shown]:
        click.echo(f"brevis: skipped {k['path']}: {k['reason']}", err=True)
    if len(skipped) > shown:
        click.echo(f"brevis: ... and {len(skipped) - shown} more skipped (--json lists them all)", err=True)
    if any(k["kind"] == "default" for k in skipped):
        click.echo("brevis: (--no-default-excludes keeps what is excluded by default)", err=True)


@contextmanager
def _stdin_source(name: str, near: str | None):
    """Standard input spooled to a file named `name` (the name it is archived
    under), in a temporary folder beside the archive where there is one:
    the encoder reads its sources by path, more than once."""
    if _is_terminal(sys.stdin):
        raise InvalidArgument("no data on standard input (it is a terminal)")
    if not name or "/" in name or name in (".", ".."):
        raise InvalidArgument(f"{name!r} cannot name a file (--name)")
    parent = os.path.dirname(os.path.abspath(near)) if near else None
    if parent is not None and not os.path.isdir(parent):
        parent = None  # the writer says what is wrong with the output
    with _spooled_stdin(name, ".brevis-stdin-", parent) as path:
        yield path


@cli.command()
@click.argument("sources", nargs=-1, required=True, type=click.Path(path_type=str))
@click.option("-o", "--output", default=None, type=click.Path(path_type=str),
              help="Archive to write (default: X.brv beside X, for one source X; '-': standard output).")
@click.option("-c", "--stdout", "to_stdout", is_flag=True, help="Write the archive to standard output.")
@click.option("-f", "--force", is_flag=True, help="Overwrite an existing archive.")
@click.option("--exclude", "excludes", multiple=True, metavar="GLOB",
              help="Leave out what matches GLOB inside folders (repeatable): a pattern without '/' matches "
                   "a name at any depth ('*.bin'), one with '/' the whole path, a trailing '/' folders only.")
@click.option("--no-default-excludes", is_flag=True,
              help="Keep .git/, .hg/, .svn/ and .DS_Store, which are skipped by default.")
@click.option("--dereference", is_flag=True,
              help="Follow every symbolic link and store what it points at (tar -h). By default a link to a "
                   "file or folder inside the source folder is stored as a link; others are followed.")
@click.option("--name", "stdin_name", default=None,
              help="Name of the file read from standard input (source '-'; default: the archive's name "
                   "without .brv, else 'stdin').")
@effort_option
@click.option("--prior", "prior", type=click.Path(path_type=str), default=None,
              help="Use a prior learned before (brevis prior learn) instead of learning one.")
@click.option("--explain", is_flag=True, help="Summarize which productions won where.")
@click.option("--base", type=click.Path(path_type=str), default=None,
              help="Code tensors against this base model (a folder, file or .brv) where it helps.")
@_threads_option("Encoding: worker processes for inputs of 8 MiB or more (default: one per core); "
                 "smaller inputs run on one thread.")
@quiet_option
@json_option
def compress(sources, output, to_stdout, force, excludes, no_default_excludes, stdin_name, effort, prior,
             explain, base, threads, quiet, as_json, dereference=False):
    """Compress checkpoint folders or files into one archive ('-': standard input)."""
    if output == "-":
        to_stdout, output = True, None
    if to_stdout and output is not None:
        raise click.UsageError("-c (standard output) and -o FILE: give one")
    if "-" in sources and len(sources) > 1:
        raise click.UsageError("standard input ('-') can only be the one source")
    if output is None and not to_stdout:
        if "-" in sources:
            raise click.UsageError("name the archive of standard input with -o ARCHIVE, or use -c")
        if len(sources) > 1:
            raise click.UsageError(f"{len(sources)} sources: name the archive with -o ARCHIVE")
        output = str(api.default_archive(sources))
    if to_stdout:
        _refuse_terminal_stdout("an archive")
    with contextlib_exit() as stack:
        if sources == ("-",):
            name = stdin_name or (Path(output).stem if output and output.endswith(".brv") else "stdin")
            sources = (stack.enter_context(_stdin_source(name, output)),)
        elif stdin_name is not None:
            raise click.UsageError("--name names standard input: give '-' as the source")
        target = output
        if to_stdout:  # the archive is written to a file first, then copied
            target = os.path.join(stack.enter_context(tempfile.TemporaryDirectory(prefix="brevis-")), "out.brv")
        s = _compress(sources, target, threads, force, effort, prior, base, excludes, not no_default_excludes,
                      quiet, dereference=dereference)
        if to_stdout:
            _copy_to_stdout(target)
            s["archive"] = "-"
        if explain:
            s["explain"] = api.explain(target)
    _report_skipped(s["skipped"], quiet or as_json)
    shown = output if output is not None else "(standard output)"
    ratio = f"{100 * s['ratio']:.1f} %" if s["ratio"] is not None else "-"
    links = f" and {_n(s['link_count'], 'link')}" if s.get("link_count") else ""
    _emit(as_json, quiet, s, f"{shown}: {_n(s['file_count'], 'file')}{links}, {_size(s['original_bytes'])} -> "
          f"{_size(s['archive_bytes'])} ({ratio}) in {s['seconds']:.1f} s", err=to_stdout)
    if explain and not as_json and not quiet:
        for r in s["explain"]:
            pct = 100 * r["stored_bytes"] / r["original_bytes"]
            top = ", ".join(f"{k} {v}" for k, v in list(r["productions"].items())[:6])
            found = ", ".join(f"{k} {v}" for k, v in r["search"].items())
            click.echo(f"  {r['dtype']:8s} {r['role']:10s} {r['segments']:5d} segments "
                       f"{_size(r['original_bytes']):>9s} -> {pct:5.1f} %  [{found}]  {top}", err=to_stdout)


def _compress(sources, output, threads, force, effort, prior, base, excludes, default_excludes, quiet,
              dereference=False) -> dict:
    from .codec import encoder
    from .workers import open_workers

    files, _ = collect(list(sources), exclude=excludes, default_excludes=default_excludes,
                       links=None if dereference else [])  # a link's bytes count once
    total = sum(s.path.stat().st_size for s in files)
    threads = threads or default_threads()
    # Worker processes (or none) for the whole command, opened before the
    # progress bar, whose thread would otherwise keep them from being forked.
    with open_workers(threads, total, encoder.PROCESS_MIN_BYTES) as workers, \
            Progress(total, quiet, "compress") as progress:
        return api.compress(list(sources), output, threads=threads, force=force, effort=effort, prior=prior,
                            base=base, exclude=excludes, default_excludes=default_excludes, progress=progress,
                            executor=workers, dereference=dereference)


def _copy_to_stdout(path: str) -> None:
    out = sys.stdout.buffer
    try:
        with open(path, "rb") as f:
            shutil.copyfileobj(f, out, 1 << 20)
        out.flush()
    except BrokenPipeError:
        raise
    except OSError as e:
        from .fs.atomic import io_failure

        raise io_failure(e, "cannot write standard output") from None


@cli.command("compress-many")
@click.argument("checkpoints", nargs=-1, type=click.Path(path_type=str))
@click.option("-o", "--output", "outdir", required=True, type=click.Path(path_type=str),
              help="Folder of the archives: one NAME.brv per checkpoint.")
@click.option("-m", "--manifest", "manifests", multiple=True, type=click.Path(path_type=str),
              help="A file listing checkpoints, one a line ('-': standard input; repeatable).")
@click.option("-w", "--workers", type=click.IntRange(min=1), default=None,
              help="Worker processes of the local cluster (default: one per core).")
@click.option("--scheduler", default=None, metavar="ADDRESS",
              help="A running Dask scheduler, e.g. tcp://host:8786 (default: $DASK_SCHEDULER_ADDRESS, "
                   "else a local cluster).")
@click.option("--scheduler-file", default=None, type=click.Path(path_type=str),
              help="The scheduler file of a running Dask cluster (dask scheduler --scheduler-file).")
@click.option("--engine", type=click.Choice(["auto", "dask", "processes"]), default="auto", show_default=True,
              help="auto: Dask if installed, else a local process pool.")
@click.option("--retries", type=click.IntRange(min=0), default=3, show_default=True,
              help="Times a failed task (an error, a dead worker) is run again.")
@click.option("-f", "--force", is_flag=True, help="Rewrite archives that exist and verify.")
@effort_option
@click.option("--prior", "prior", type=click.Path(path_type=str), default=None,
              help="Use this prior for the whole fleet (default: learned once on the first checkpoint).")
@click.option("-j", "--threads", type=click.IntRange(min=1), default=1, show_default=True,
              help="Threads per task (per checkpoint).")
@click.option("--base", type=click.Path(path_type=str), default=None,
              help="Code every checkpoint against this base model (a folder, file or .brv), as compress --base; "
                   "the same path on every worker.")
@click.option("--runs", is_flag=True,
              help="Each argument is a training run (a folder of checkpoints): archived as compress-run does, "
                   "into OUTDIR/NAME.brv.d, the runs in parallel and the checkpoints of each in order.")
@click.option("-k", "--keyframe-every", type=click.IntRange(min=1), default=None,
              help=f"With --runs: a keyframe every K checkpoints (default: {DEFAULT_KEYFRAME_EVERY}).")
@quiet_option
@json_option
def compress_many(checkpoints, outdir, manifests, workers, scheduler, scheduler_file, engine, retries,
                  force, effort, prior, threads, base, quiet, as_json, runs=False, keyframe_every=None):
    """Compress many checkpoints (folders or files) into one archive each, on Dask workers."""
    from . import fleet

    paths = list(checkpoints)
    for m in manifests:
        paths += fleet.read_manifest(m)
    if not paths:
        raise click.UsageError("no checkpoints: give folders or files, or --manifest FILE")
    if runs:
        if base or prior or force:
            raise click.UsageError("--runs codes each checkpoint against the one before: no --base, --prior "
                                   "or --force")
        return _compress_runs(paths, outdir, engine, workers, scheduler, scheduler_file, retries, effort,
                              threads, keyframe_every, quiet, as_json)
    if keyframe_every is not None:
        raise click.UsageError("--keyframe-every goes with --runs")
    if engine == "auto" and not (scheduler or scheduler_file) and not fleet.dask_available() and not quiet:
        click.echo(f"brevis: Dask is not installed (pip install '{DIST}[dask]'): using a local process pool "
                   f"of {_n(workers or default_threads(), 'worker')}", err=True)
    total = sum(c.size for c in fleet.plan_checkpoints(paths, Path(outdir)))
    with Progress(total, quiet, "compress-many") as bar:
        def progress(r: dict) -> None:
            if r["status"] == "failed":
                bar.write(f"brevis: {r['name']}: FAILED: {r['error']}", file=sys.stderr)
            elif not quiet and not as_json:
                what = ("skipped (archive exists and verifies)" if r["status"] == "skipped" else
                        f"{_size(r['original_bytes'])} -> {_size(r['archive_bytes'])} "
                        f"({100 * (r['ratio'] or 0):.1f} %) in {r['seconds']:.1f} s, verified")
                bar.write(f"{r['archive']}: {what}", file=sys.stdout)

        # The bar moves as chunks are written on the workers (bytes_done), not per checkpoint.
        s = fleet.compress_many(paths, outdir, engine=engine, workers=workers, scheduler=scheduler,
                                scheduler_file=scheduler_file, retries=retries, force=force, effort=effort,
                                prior=prior, threads=threads, progress=progress, base=base,
                                bytes_done=bar if bar.bar is not None else None)
    where = f"{s['engine']} at {s['scheduler']}" if s["scheduler"] else s["engine"]
    _emit(as_json, quiet, s, f"{outdir}: {s['compressed']} compressed, {s['skipped']} skipped, "
          f"{s['failed']} failed; {_n(s['workers'], 'worker')} ({where}) in {s['seconds']:.1f} s")
    if not s["ok"]:
        # The summary (on --json) already says so: one line, exit 1, no second JSON object.
        click.echo(f"brevis: error: {s['failed']} of {len(s['checkpoints'])} checkpoints failed", err=True)
        sys.exit(1)


def _compress_runs(paths, outdir, engine, workers, scheduler, scheduler_file, retries, effort, threads,
                   keyframe_every, quiet, as_json) -> None:
    from . import fleet

    def progress(r: dict) -> None:
        if r["status"] == "failed":
            click.echo(f"brevis: {r['name']}: FAILED: {r['error']}", err=True)
        elif not quiet and not as_json:
            what = (f"{_n(r['written'], 'checkpoint')} written, {r['kept']} kept, "
                    f"{_size(r['original_bytes'])} -> {_size(r['archive_bytes'])}, verified")
            click.echo(f"{shown(r['archive'])}: {what} in {r['seconds']:.1f} s")

    s = fleet.compress_runs(paths, outdir, engine=engine, workers=workers, scheduler=scheduler,
                            scheduler_file=scheduler_file, retries=retries, effort=effort, threads=threads,
                            keyframe_every=keyframe_every, progress=progress)
    _emit(as_json, quiet, s, f"{outdir}: {_n(s['compressed'], 'run')} compressed, {s['skipped']} unchanged, "
          f"{s['failed']} failed in {s['seconds']:.1f} s")
    if not s["ok"]:
        click.echo(f"brevis: error: {s['failed']} of {len(s['runs'])} runs failed", err=True)
        sys.exit(1)


@cli.command("compress-run")
@click.argument("checkpoints", nargs=-1, type=click.Path(path_type=str))
@click.option("-o", "--output", type=click.Path(path_type=str), default=None,
              help="The run's folder of archives, one NAME.brv per checkpoint (default: RUN.brv.d beside "
                   "the run's folder). A folder that holds the run already is appended to.")
@click.option("-m", "--manifest", "manifests", multiple=True, type=click.Path(path_type=str),
              help="A file listing the checkpoints in order, one a line ('-': standard input); implies "
                   "--order given.")
@click.option("--order", type=click.Choice(["name", "given"]), default=None,
              help="name (default): by the step each name tells (checkpoint-N, step_N, epoch=N); "
                   "given: as listed.")
@click.option("-k", "--keyframe-every", type=click.IntRange(min=1), default=None,
              help="Every K-th checkpoint is stored alone, the others against the one before, so that any "
                   f"decodes from at most K-1 others (default: {DEFAULT_KEYFRAME_EVERY}).")
@effort_option
@click.option("--prior", "prior", type=click.Path(path_type=str), default=None,
              help="Use a prior learned before (brevis prior learn) instead of learning one per checkpoint.")
@_threads_option("Encoding: worker processes for checkpoints of 8 MiB or more (default: one per core).")
@quiet_option
@json_option
def compress_run(checkpoints, output, manifests, order, keyframe_every, effort, prior, threads, quiet, as_json):
    """Compress the checkpoints of a training run, each against the one before it."""
    from . import fleet, series

    paths = list(checkpoints)
    for m in manifests:
        paths += fleet.read_manifest(m)
    if not paths:
        raise click.UsageError("no checkpoints: give the run's folder, its checkpoints, or --manifest FILE")
    order = order or ("given" if manifests else "name")
    keyframe_every = keyframe_every or DEFAULT_KEYFRAME_EVERY
    items = series.checkpoints(paths, order)
    out = Path(output) if output is not None else series.default_output(paths)
    new = [c for c in items if not (out / c.archive).is_file()]  # those kept are not read
    total = sum(p.stat().st_size for c in new for p in ([c.path] if c.path.is_file() else c.path.rglob("*"))
                if p.is_file())
    with Progress(total, quiet, "compress-run") as bar:
        def member_done(m: dict) -> None:
            if not quiet and not as_json:
                how = "keyframe" if m["keyframe"] else f"{_n(m['predecessors'], 'predecessor')} to decode"
                ratio = m["archive_bytes"] / m["original_bytes"] if m["original_bytes"] else 0
                bar.write(f"{shown(m['archive'])}: {_size(m['original_bytes'])} -> {_size(m['archive_bytes'])}"
                          f" ({100 * ratio:.1f} %), {how}", file=sys.stdout)

        s = api.compress_run(paths, output, order=order, keyframe_every=keyframe_every, effort=effort,
                             prior=prior, threads=threads or default_threads(), progress=bar,
                             on_member=member_done)
    _report_skipped(s["skipped"], quiet or as_json)
    kept = f", {_n(len(s['kept']), 'kept')} as they were" if s["kept"] else ""
    sizes = (f": {_size(s['original_bytes'])} -> {_size(s['archive_bytes'])}"
             f" ({100 * s['archive_bytes'] / s['original_bytes']:.1f} %)" if s["original_bytes"] else "")
    _emit(as_json, quiet, s, f"{shown(s['output'])}: {_n(len(s['written']), 'checkpoint')} written{kept}{sizes}")


@cli.command("remove-checkpoint")
@click.argument("run", type=click.Path(path_type=str))
@click.argument("name")
@effort_option
@_threads_option("Threads for re-coding the checkpoint after it (default: one per core).")
@quiet_option
@json_option
def remove_checkpoint(run, name, effort, threads, quiet, as_json):
    """Remove a checkpoint from a run's folder, re-coding the one after it."""
    s = api.remove_checkpoint(run, name, effort=effort, threads=threads or default_threads())
    again = f"; {s['recoded']} re-coded without it" if s["recoded"] else ""
    _emit(as_json, quiet, s, f"{shown(run)}: removed {s['removed']}{again}")


@cli.group()
def prior():
    """Production priors: learn one on a checkpoint, reuse it for the next."""


@prior.command("learn")
@click.argument("sources", nargs=-1, required=True, type=click.Path(path_type=str))
@click.option("-o", "--output", required=True, type=click.Path(path_type=str), help="Prior file to write (.json).")
@click.option("-f", "--force", is_flag=True, help="Overwrite an existing file.")
@effort_option
@_threads_option("Threads for scanning and the learning searches (default: one per core).")
@quiet_option
def prior_learn(sources, output, force, effort, threads, quiet):
    """Learn the production prior of a checkpoint."""
    if os.path.exists(output) and not force:
        raise OutputExists(f"{output} exists", option="force")
    p = api.learn_prior(sources, output, effort=effort, threads=threads or default_threads())
    if not quiet:
        click.echo(f"{output}: prior learned on {_n(p.samples, 'tensor')}, {_n(len(p.counts), 'context')}")


@cli.command()
@click.argument("archive", type=click.Path(path_type=str))
@click.argument("paths", nargs=-1)
@click.option("-o", "--output", type=click.Path(path_type=str), default=None,
              help="An archive of one file: the file to write (default: its archived name, beside the archive). "
                   "Any other: the folder (default: the archive's name without .brv). '-': standard output.")
@click.option("-c", "--stdout", "to_stdout", is_flag=True,
              help="Write to standard output: the archive's one file, or the PATHS named (as brevis cat).")
@click.option("-f", "--force", is_flag=True, help="Overwrite existing files.")
@click.option("--only", "only", multiple=True, metavar="GLOB",
              help="Only the files matching GLOB (repeatable, or comma-separated: 'config.json,*.safetensors'; "
                   "a pattern without '/' matches a name at any depth), and what links among them point at.")
@click.option("--no-mode", "no_mode", is_flag=True,
              help="Do not restore permission bits: files get 0666 less the umask.")
@click.option("--no-mtime", "--touch", "no_mtime", is_flag=True,
              help="Do not restore modification times (tar -m): files are dated now.")
@base_option
@threads_option
@quiet_option
@json_option
def decompress(archive, paths, output, to_stdout, force, base, threads, quiet, as_json, only=(), no_mode=False,
               no_mtime=False):
    """Rebuild every archived file, byte for byte ('-': the archive from standard input; a training
    run's folder of archives: every checkpoint)."""
    if output == "-":
        to_stdout, output = True, None
    if to_stdout and output is not None:
        raise click.UsageError("-c (standard output) and -o PATH: give one")
    if paths and not to_stdout:
        raise click.UsageError("PATHS are written to standard output only: add -c (or use brevis cat)")
    if archive == "-" and output is None and not to_stdout:
        raise click.UsageError("name the output of an archive read from standard input with -o (or use -c)")
    if archive != "-" and os.path.isdir(archive) and not to_stdout:  # a training run's folder of archives
        s = api.decompress_run(archive, output, force=force, threads=threads or default_threads(),
                               modes=not no_mode, mtimes=not no_mtime)
        _emit(as_json, quiet, s, f"{shown(s['output'])}: {_n(s['member_count'], 'checkpoint')}, "
              f"{_n(s['file_count'], 'file')}, {_size(s['original_bytes'])} in {s['seconds']:.1f} s")
        return
    with _archive_input(archive) as path:
        if to_stdout:
            s = _cat(archive, path, paths, base, threads)
            _emit(as_json, True, s, "", err=True)
            return
        from .codec.chunks import processes_for

        threads = threads or default_threads()
        total = _archive_total(path, _bar_wanted(quiet))
        with processes_for(path, threads) as workers, Progress(total, quiet, "decompress") as progress:
            s = api.decompress(path, output, threads=threads, force=force, progress=progress, base=base,
                               executor=workers, modes=not no_mode, mtimes=not no_mtime, only=list(only) or None)
        s["archive"] = archive
    links = f" and {_n(s['link_count'], 'link')}" if s.get("link_count") else ""
    _emit(as_json, quiet, s, f"{s['output']}: {_n(s['file_count'], 'file')}{links}, {_size(s['original_bytes'])} "
          f"in {s['seconds']:.1f} s")


def _cat(archive: str, path: str, paths, base, threads) -> dict:
    """api.cat of the archive at `path` (shown as `archive`) to standard output."""
    try:
        s = api.cat(path, list(paths) or None, sys.stdout.buffer, threads=threads or default_threads(), base=base)
    except InvalidArgument as e:
        if not paths and "name the files" in str(e):
            raise InvalidArgument(f"{archive} is not an archive of one file: standard output takes the files "
                                  f"named (brevis cat {archive} PATH...; brevis ls {archive} lists them)") from None
        raise
    s["archive"] = archive
    return s


@cli.command("cat")
@click.argument("archive", type=click.Path(path_type=str))
@click.argument("paths", nargs=-1)
@base_option
@_threads_option("Decoding threads (default: one per core).")
@json_option
def cat_command(archive, paths, base, threads, as_json):
    """Write archived files (PATHS, or globs of them; none: the archive's one file) to standard output."""
    with _archive_input(archive) as path:
        s = _cat(archive, path, paths, base, threads)
    _emit(as_json, True, s, "", err=True)


@cli.command()
@click.argument("archive", type=click.Path(path_type=str))
@click.option("--source", "sources", multiple=True, type=click.Path(path_type=str),
              help="Also compare with the original files (as given to compress; repeatable).")
@base_option
@threads_option
@quiet_option
@json_option
def verify(archive, sources, base, threads, quiet, as_json):
    """Decode everything and check every checksum (exit 0 only if all match; a training run's folder: every
    checkpoint, against --source RUN)."""
    from .codec.chunks import processes_for

    threads = threads or default_threads()
    if archive != "-" and os.path.isdir(archive):  # a training run's folder of archives
        if len(sources) > 1:
            raise click.UsageError("a run's folder is compared with one --source: the run's folder of checkpoints")
        r = api.verify_run(archive, sources[0] if sources else None, threads=threads)
        if as_json:
            click.echo(json.dumps(r, indent=1))
        elif not quiet:
            for m in r["members"]:
                for p in m["problems"]:
                    where = ": ".join(str(x) for x in (m["archive"], p["file"], p["segment"]) if x is not None)
                    click.echo(f"{where}: {p['error']}", err=True)
            bad = sum(not m["ok"] for m in r["members"])
            click.echo(f"{archive}: OK, {_n(r['member_count'], 'checkpoint')}"
                       + (" match the source" if sources else ", every checksum matches") if r["ok"]
                       else f"{archive}: FAILED, {bad} of {_n(r['member_count'], 'checkpoint')}")
        if not r["ok"]:
            sys.exit(6)
        return
    with _archive_input(archive) as path:
        total = _archive_total(path, _bar_wanted(quiet))
        with processes_for(path, threads) as workers, Progress(total, quiet, "verify") as progress:
            r = api.verify(path, list(sources) or None, threads=threads, progress=progress, base=base,
                           executor=workers)
        r["archive"] = archive
    if as_json:
        click.echo(json.dumps(r, indent=1))
    elif not quiet:
        for p in r["problems"]:
            where = ": ".join(str(x) for x in (p["file"], p["segment"]) if x is not None)
            click.echo(f"{where}: {p['error']}", err=True)
        files = _n(r["file_count"], "file") + (f" and {_n(r['link_count'], 'link')}" if r.get("link_count") else "")
        click.echo((f"{archive}: OK, {files} match the source" if sources
                    else f"{archive}: OK, {files}, every checksum matches") if r["ok"]
                   else f"{archive}: FAILED, {_n(len(r['problems']), 'problem')}")
    if not r["ok"]:
        sys.exit(6)


@cli.command()
@click.argument("archive", type=click.Path(path_type=str))
@quiet_option
@json_option
def inspect(archive, quiet, as_json):
    """Show files, tensors, sizes and the program of each tensor (a training run's folder: its checkpoints)."""
    from .archive.schema import SearchKind, search_kind

    with _archive_input(archive) as path:
        r = api.inspect(path)
    if "members" in r:  # a run's folder
        if as_json:
            click.echo(json.dumps(r, indent=1))
        elif not quiet:
            _show_run(r)
        return
    r["archive"] = archive
    if as_json:
        click.echo(json.dumps(r, indent=1))
        return
    if quiet:
        return
    total = r["original_bytes"]
    files = _n(r["file_count"], "file")
    click.echo(f"{shown(r['archive'])}: {files}, {_size(total)} -> {_size(r['archive_bytes'])}"
               f" ({100 * r['archive_bytes'] / total:.1f} %)" if total else f"{shown(r['archive'])}: {files}, empty")
    if r["base_required"]:
        click.echo("made against a base model: decompress, verify, extract and cat need --base")
    if r["series"] is not None:
        _show_series(r["series"])
    for f in r["files"]:
        pct = f"{100 * f['stored_bytes'] / f['original_bytes']:.1f} %" if f["original_bytes"] else "-"
        click.echo(f"{shown(f['path'])}  [{shown(f['format'])}]  {f['original_bytes']} -> {f['stored_bytes']} ({pct})")
        for s in f["segments"]:
            shape = "x".join(map(str, s["shape"])) if s["shape"] is not None else ""
            click.echo(f"  {shown(s['name']) or '(bytes)'}  {s['dtype']}{'[' + shape + ']' if shape else ''}  "
                       f"{s['original_bytes']} -> {s['stored_bytes']}")
            if "members" in s:
                names = ", ".join(shown(m["name"]) for m in s["members"][:3])
                click.echo(f"    gathers {_n(len(s['members']), 'tensor')}: {names}"
                           + (", ..." if len(s["members"]) > 3 else ""))
            for p in s["programs"]:
                click.echo(f"    {p['program']}" + (f"  ({_n(p['chunks'], 'chunk')})" if len(s["programs"]) > 1
                                                    else ""))
            st = s.get("search") or {}
            kind = search_kind(st)
            if kind is SearchKind.SEARCH:
                click.echo(f"    search: A*, {_n(st['expanded'], 'node')} expanded, estimated {st['estimate']}"
                           f" -> actual {s['stored_bytes']} bytes" + (" (budget hit)" if st.get("exhausted") else ""))
            elif kind is SearchKind.FAMILY:
                click.echo(f"    search: reused a sibling's program, estimated {st['estimate']}"
                           f" -> actual {s['stored_bytes']} bytes")
            elif kind is SearchKind.LEARNED:
                click.echo(f"    search: took a program learned on the sample, estimated {st['estimate']}"
                           f" -> actual {s['stored_bytes']} bytes")


def _show_series(m: dict) -> None:
    step = f", step {m['step']}" if m["step"] is not None else ""
    click.echo(f"checkpoint {shown(m['name'])} of a training run (place {m['position']}{step}), "
               + ("a keyframe" if m["previous"] is None else f"coded against {shown(m['previous']['archive'])}"))
    if m["chain_error"]:
        click.echo(f"cannot be decoded here: {m['chain_error']}")
    elif len(m["chain"]) > 1:
        click.echo(f"decoding it reads {_n(len(m['chain']), 'archive')}: {' -> '.join(map(shown, m['chain']))}"
                   f" ({_size(m['chain_archive_bytes'])} read, {_size(m['chain_original_bytes'])} decoded)")


def _show_run(r: dict) -> None:
    total = r["original_bytes"]
    pct = f" ({100 * r['archive_bytes'] / total:.1f} %)" if total else ""
    click.echo(f"{shown(r['run'])}: a training run of {_n(r['member_count'], 'checkpoint')}, "
               f"{_size(total)} -> {_size(r['archive_bytes'])}{pct}")
    for m in r["members"]:
        step = f"step {m['step']}" if m["step"] is not None else f"#{m['position']}"
        how = "keyframe" if m["keyframe"] else f"against {shown(m['previous'])}"
        ratio = f"{100 * m['archive_bytes'] / m['original_bytes']:.1f} %" if m["original_bytes"] else "-"
        click.echo(f"  {shown(m['archive'])}  {step}  {_size(m['original_bytes'])} -> "
                   f"{_size(m['archive_bytes'])} ({ratio})  {how}")


@cli.command("ls")
@click.argument("archive", type=click.Path(path_type=str))
@quiet_option
@json_option
def ls_command(archive, quiet, as_json):
    """List files and tensors from the index alone (decodes nothing)."""
    with _archive_input(archive) as path:
        r = api.ls(path)
    r["archive"] = archive
    if as_json:
        click.echo(json.dumps(r, indent=1))
        return
    if quiet:
        return
    for f in r["files"]:
        tensors = f"  {_n(len(f['tensors']), 'tensor')}" if f["tensors"] else ""
        click.echo(f"{shown(f['path'])}  [{shown(f['format'])}]  {_n(f['original_bytes'], 'byte')}{tensors}")
        for t in f["tensors"]:
            click.echo(f"  {shown(t['key'])}  {t['dtype']}[{'x'.join(map(str, t['shape']))}]  {t['original_bytes']}")


@cli.command()
@click.argument("archive", type=click.Path(path_type=str))
@click.argument("names", nargs=-1, required=True)
@click.option("-o", "--output", default=None, type=click.Path(path_type=str),
              help="safetensors file to write (default: the archive's name without .brv + .part.safetensors).")
@click.option("-f", "--force", is_flag=True, help="Overwrite an existing file.")
@base_option
@_threads_option("Decoding threads (default: one per core).")
@quiet_option
@json_option
def extract(archive, names, output, force, base, threads, quiet, as_json):
    """Write the named tensors (names or globs, as brevis ls shows them) to a safetensors file, bit for bit."""
    s = api.extract(archive, names, output, force=force, threads=threads or default_threads(), base=base)
    _emit(as_json, quiet, s, f"{s['output']}: {_n(s['tensor_count'], 'tensor')}, {_size(s['original_bytes'])} "
          f"in {s['seconds']:.1f} s")


def _split_flags(argv: list[str]) -> tuple[list[str], bool, bool]:
    """--debug anywhere before '--' (before or after the command) moves to
    the front, where the group takes it; and whether --json was asked."""
    end = argv.index("--") if "--" in argv else len(argv)
    debug = "--debug" in argv[:end]
    as_json = "--json" in argv[:end]
    rest = [a for i, a in enumerate(argv) if not (i < end and a == "--debug")]
    return (["--debug"] if debug else []) + rest, debug, as_json


def _fail(as_json: bool, kind: str, message: str, exit_code: int) -> None:
    """One line on standard error, and with --json an error object on standard output; exit."""
    click.echo(f"brevis: {kind}: {message}" if message != kind else f"brevis: {kind}", err=True)
    if as_json:
        click.echo(json.dumps({"error": {"kind": kind, "message": message, "exit_code": exit_code}}, indent=1))
    sys.exit(exit_code)


def _usage_message(e: click.ClickException) -> str:
    message = " ".join(e.format_message().split())
    ctx = getattr(e, "ctx", None)
    if isinstance(e, click.UsageError) and ctx is not None:
        message += f" (see {ctx.command_path} --help)"
    return message


def main(argv: list[str] | None = None) -> None:
    debug = as_json = False
    try:
        if _COMMAND:
            # Replaces the imports' guard (brevis/__init__.py), which held until
            # here: the rest of this module (click building its commands) runs
            # after the imports and was as exposed.
            interrupts.install()
        else:  # main() called by a program: its Ctrl-C handling stays its own
            signal.signal(signal.SIGTERM, interrupts.on_signal)
        argv, debug, as_json = _split_flags(list(argv if argv is not None else sys.argv[1:]))
        cli.main(args=argv, prog_name="brevis", standalone_mode=False)
    except click.exceptions.Exit as e:
        sys.exit(e.exit_code)
    except click.ClickException as e:  # usage errors, in one line as every error
        _fail(as_json, "invalid argument", _usage_message(e), EXIT_USAGE)
    except (click.exceptions.Abort, KeyboardInterrupt):  # click turns a KeyboardInterrupt in a command into Abort
        interrupts.forget_unhandled()
        _fail(as_json, "interrupted", "interrupted", EXIT_INTERRUPTED)
    except BrevisError as e:
        if debug:
            traceback.print_exc()
        _fail(as_json, e.kind, f"{e}{OPTION_HINTS.get(e.option, '')}", e.exit_code)
    except BrokenPipeError:
        os._exit(1)
    except Exception as e:  # a bug: say so in one line, details with --debug
        if debug:
            traceback.print_exc()
        _fail(as_json, "internal error", f"{type(e).__name__}: {e} (rerun with --debug)", EXIT_INTERNAL)
    finally:
        if _COMMAND:
            interrupts.uninstall()
