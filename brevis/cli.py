"""The `brevis` command. Commands only: the work is in brevis.api.

Errors are one line on stderr and an exit code per kind (see errors.py);
tracebacks only with --debug.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import traceback
from contextlib import contextmanager
from pathlib import Path

import click

from . import __version__, api
from .errors import BrevisError, OutputExists
from .synth.planner import DEFAULT_EFFORT
from .workers import open_workers
from .workers.pool import default_threads
from .fs.sources import collect

EXIT_INTERRUPTED = 130
EXIT_INTERNAL = 70


def _size(n: float) -> str:
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return str(n)


@contextmanager
def progress_bar(total: int, quiet: bool, desc: str):
    from tqdm import tqdm

    disable = quiet or not sys.stderr.isatty()
    with tqdm(total=total, unit="B", unit_scale=True, desc=desc, disable=disable,
              leave=False, file=sys.stderr) as bar:
        yield bar.update


def _emit(as_json: bool, quiet: bool, summary: dict, line: str) -> None:
    if as_json:
        click.echo(json.dumps(summary, indent=1))
    elif not quiet:
        click.echo(line)


threads_option = click.option("-j", "--threads", type=click.IntRange(min=1), default=None,
                              help="Worker threads (default: one per core); compress encodes inputs "
                                   "of 8 MiB or more in this many worker processes, smaller ones on one thread.")
quiet_option = click.option("-q", "--quiet", is_flag=True, help="No progress bar, no summary.")
json_option = click.option("--json", "as_json", is_flag=True, help="Print a JSON summary on stdout.")
base_option = click.option("--base", type=click.Path(path_type=str), default=None,
                           help="The base model the archive was made against (compress --base).")
effort_option = click.option("-e", "--effort", type=click.IntRange(0, 3), default=DEFAULT_EFFORT, show_default=True,
                             help="Search effort: 0 no search, 1 fast, 2 default, 3 thorough.")


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="brevis")
@click.option("--debug", is_flag=True, help="Show tracebacks on errors.")
@click.pass_context
def cli(ctx: click.Context, debug: bool) -> None:
    """Brevis: lossless archives of model checkpoints."""
    ctx.obj = {"debug": debug}


@cli.command()
@click.argument("sources", nargs=-1, required=True, type=click.Path(path_type=str))
@click.option("-o", "--output", required=True, type=click.Path(path_type=str), help="Archive to write (.brv).")
@click.option("-f", "--force", is_flag=True, help="Overwrite an existing archive.")
@effort_option
@click.option("--prior", "prior", type=click.Path(path_type=str), default=None,
              help="Use a prior learned before (brevis prior learn) instead of learning one.")
@click.option("--explain", is_flag=True, help="Summarize which productions won where.")
@click.option("--base", type=click.Path(path_type=str), default=None,
              help="Code tensors against this base model (a folder, file or .brv) where it helps.")
@threads_option
@quiet_option
@json_option
def compress(sources, output, force, effort, prior, explain, base, threads, quiet, as_json):
    """Compress checkpoint folders or files into one archive."""
    from .codec import encoder

    files, _ = collect(list(sources))
    total = sum(s.path.stat().st_size for s in files)
    threads = threads or default_threads()
    # Worker processes (or none) for the whole command, opened before the
    # progress bar, whose thread would otherwise keep them from being forked.
    with open_workers(threads, total, encoder.PROCESS_MIN_BYTES) as workers, \
            progress_bar(total, quiet, "compress") as update:
        s = api.compress(sources, output, threads=threads, force=force, effort=effort, prior=prior,
                         base=base, progress=update, executor=workers)
    if explain:
        s["explain"] = api.explain(output)
    ratio = f"{100 * s['ratio']:.1f} %" if s["ratio"] is not None else "-"
    _emit(as_json, quiet, s, f"{output}: {s['files']} files, {_size(s['original_bytes'])} -> "
          f"{_size(s['archive_bytes'])} ({ratio}) in {s['seconds']:.1f} s")
    if explain and not as_json:
        for r in s["explain"]:
            pct = 100 * r["stored_bytes"] / r["original_bytes"]
            top = ", ".join(f"{k} {v}" for k, v in list(r["productions"].items())[:6])
            found = ", ".join(f"{k} {v}" for k, v in r["search"].items())
            click.echo(f"  {r['dtype']:8s} {r['role']:10s} {r['segments']:5d} segments "
                       f"{_size(r['original_bytes']):>9s} -> {pct:5.1f} %  [{found}]  {top}")


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
@quiet_option
@json_option
def compress_many(checkpoints, outdir, manifests, workers, scheduler, scheduler_file, engine, retries,
                  force, effort, prior, threads, base, quiet, as_json):
    """Compress many checkpoints (folders or files) into one archive each, on Dask workers."""
    from tqdm import tqdm

    from . import fleet

    paths = list(checkpoints)
    for m in manifests:
        paths += fleet.read_manifest(m)
    if not paths:
        raise click.UsageError("no checkpoints: give folders or files, or --manifest FILE")
    if engine == "auto" and not (scheduler or scheduler_file) and not fleet.dask_available() and not quiet:
        click.echo(f"brevis: Dask is not installed (pip install 'brevis[dask]'): using a local process pool "
                   f"of {workers or default_threads()} workers", err=True)
    total = sum(c.size for c in fleet.plan_checkpoints(paths, Path(outdir)))
    disable = quiet or not sys.stderr.isatty()
    with tqdm(total=total, unit="B", unit_scale=True, desc="compress-many", disable=disable,
              leave=False, file=sys.stderr) as bar:
        def progress(r: dict) -> None:
            bar.update(r["original_bytes"] or 0)
            if r["status"] == "failed":
                bar.write(f"brevis: {r['name']}: FAILED: {r['error']}", file=sys.stderr)
            elif not quiet and not as_json:
                what = ("skipped (archive exists and verifies)" if r["status"] == "skipped" else
                        f"{_size(r['original_bytes'])} -> {_size(r['archive_bytes'])} "
                        f"({100 * (r['ratio'] or 0):.1f} %) in {r['seconds']:.1f} s, verified")
                bar.write(f"{r['archive']}: {what}", file=sys.stdout)

        s = fleet.compress_many(paths, outdir, engine=engine, workers=workers, scheduler=scheduler,
                                scheduler_file=scheduler_file, retries=retries, force=force, effort=effort,
                                prior=prior, threads=threads, progress=progress, base=base)
    where = f"{s['engine']} at {s['scheduler']}" if s["scheduler"] else s["engine"]
    _emit(as_json, quiet, s, f"{outdir}: {s['compressed']} compressed, {s['skipped']} skipped, "
          f"{s['failed']} failed; {s['workers']} workers ({where}) in {s['seconds']:.1f} s")
    if not s["ok"]:
        raise BrevisError(f"{s['failed']} of {len(s['checkpoints'])} checkpoints failed")


@cli.group()
def prior():
    """Production priors: learn one on a checkpoint, reuse it for the next."""


@prior.command("learn")
@click.argument("sources", nargs=-1, required=True, type=click.Path(path_type=str))
@click.option("-o", "--output", required=True, type=click.Path(path_type=str), help="Prior file to write (.json).")
@click.option("-f", "--force", is_flag=True, help="Overwrite an existing file.")
@effort_option
@threads_option
def prior_learn(sources, output, force, effort, threads):
    """Learn the production prior of a checkpoint."""
    if os.path.exists(output) and not force:
        raise OutputExists(f"{output} exists (use --force to overwrite)")
    p = api.learn_prior(sources, output, effort=effort, threads=threads or default_threads())
    click.echo(f"{output}: prior learned on {p.samples} tensors, {len(p.counts)} contexts")


@cli.command()
@click.argument("archive", type=click.Path(path_type=str))
@click.option("-o", "--output", type=click.Path(path_type=str), default=None,
              help="Folder to write (default: the archive's name without .brv).")
@click.option("-f", "--force", is_flag=True, help="Overwrite existing files.")
@base_option
@threads_option
@quiet_option
@json_option
def decompress(archive, output, force, base, threads, quiet, as_json):
    """Rebuild every archived file, byte for byte."""
    from .codec.chunks import processes_for

    threads = threads or default_threads()
    with processes_for(archive, threads) as workers, progress_bar(0, quiet, "decompress") as update:
        s = api.decompress(archive, output, threads=threads, force=force, progress=update, base=base,
                           executor=workers)
    _emit(as_json, quiet, s, f"{s['output']}: {s['files']} files, {_size(s['bytes'])} in {s['seconds']:.1f} s")


@cli.command()
@click.argument("archive", type=click.Path(path_type=str))
@click.option("--source", "sources", multiple=True, type=click.Path(path_type=str),
              help="Also compare with the original files (as given to compress; repeatable).")
@base_option
@threads_option
@quiet_option
@json_option
def verify(archive, sources, base, threads, quiet, as_json):
    """Decode everything and check every checksum (exit 0 only if all match)."""
    from .codec.chunks import processes_for

    threads = threads or default_threads()
    with processes_for(archive, threads) as workers, progress_bar(0, quiet, "verify") as update:
        r = api.verify(archive, list(sources) or None, threads=threads, progress=update, base=base,
                       executor=workers)
    if as_json:
        click.echo(json.dumps(r, indent=1))
    elif not quiet:
        for p in r["problems"]:
            where = ": ".join(str(x) for x in (p["file"], p["segment"]) if x is not None)
            click.echo(f"{where}: {p['error']}", err=True)
        what = " and the source" if sources else ""
        click.echo(f"{archive}: OK, {r['files']} files match{what}" if r["ok"]
                   else f"{archive}: FAILED, {len(r['problems'])} problems")
    if not r["ok"]:
        sys.exit(6)


@cli.command()
@click.argument("archive", type=click.Path(path_type=str))
@json_option
def inspect(archive, as_json):
    """Show files, tensors, sizes and the program of each tensor."""
    from .archive.schema import SearchKind, search_kind

    r = api.inspect(archive)
    if as_json:
        click.echo(json.dumps(r, indent=1))
        return
    total = r["original_bytes"]
    click.echo(f"{r['archive']}: {len(r['files'])} files, {_size(total)} -> {_size(r['archive_bytes'])}"
               f" ({100 * r['archive_bytes'] / total:.1f} %)" if total else f"{r['archive']}: empty")
    for f in r["files"]:
        pct = f"{100 * f['stored_bytes'] / f['original_bytes']:.1f} %" if f["original_bytes"] else "-"
        click.echo(f"{f['path']}  [{f['format']}]  {f['original_bytes']} -> {f['stored_bytes']} ({pct})")
        for s in f["segments"]:
            shape = "x".join(map(str, s["shape"])) if s["shape"] is not None else ""
            click.echo(f"  {s['name'] or '(bytes)'}  {s['dtype']}{'[' + shape + ']' if shape else ''}  "
                       f"{s['original_bytes']} -> {s['stored_bytes']}")
            for p in s["programs"]:
                click.echo(f"    {p['program']}" + (f"  ({p['chunks']} chunks)" if len(s["programs"]) > 1 else ""))
            st = s.get("search") or {}
            kind = search_kind(st)
            if kind is SearchKind.SEARCH:
                click.echo(f"    search: A*, {st['expanded']} nodes expanded, estimated {st['estimate']}"
                           f" -> actual {s['stored_bytes']} bytes" + (" (budget hit)" if st.get("exhausted") else ""))
            elif kind is SearchKind.FAMILY:
                click.echo(f"    search: reused a sibling's program, estimated {st['estimate']}"
                           f" -> actual {s['stored_bytes']} bytes")
            elif kind is SearchKind.LEARNED:
                click.echo(f"    search: took a program learned on the sample, estimated {st['estimate']}"
                           f" -> actual {s['stored_bytes']} bytes")


@cli.command("ls")
@click.argument("archive", type=click.Path(path_type=str))
@json_option
def ls_command(archive, as_json):
    """List files and tensors from the index alone (decodes nothing)."""
    r = api.ls(archive)
    if as_json:
        click.echo(json.dumps(r, indent=1))
        return
    for f in r["files"]:
        tensors = f"  {len(f['tensors'])} tensors" if f["tensors"] else ""
        click.echo(f"{f['path']}  [{f['format']}]  {f['size']} bytes{tensors}")
        for t in f["tensors"]:
            click.echo(f"  {t['key']}  {t['dtype']}[{'x'.join(map(str, t['shape']))}]  {t['bytes']}")


@cli.command()
@click.argument("archive", type=click.Path(path_type=str))
@click.argument("names", nargs=-1, required=True)
@click.option("-o", "--output", required=True, type=click.Path(path_type=str),
              help="safetensors file to write.")
@click.option("-f", "--force", is_flag=True, help="Overwrite an existing file.")
@base_option
@threads_option
@quiet_option
@json_option
def extract(archive, names, output, force, base, threads, quiet, as_json):
    """Write the named tensors to a safetensors file, bit for bit (names: brevis ls)."""
    s = api.extract(archive, names, output, force=force, threads=threads or default_threads(), base=base)
    _emit(as_json, quiet, s, f"{output}: {len(s['tensors'])} tensors, {_size(s['bytes'])} in {s['seconds']:.1f} s")


def _terminate(signum, frame):
    # Unwind like Ctrl-C so temporary files are removed on the way out.
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> None:
    debug = "--debug" in (argv if argv is not None else sys.argv[1:])
    signal.signal(signal.SIGTERM, _terminate)
    try:
        cli.main(args=argv, prog_name="brevis", standalone_mode=False)
    except click.exceptions.Exit as e:
        sys.exit(e.exit_code)
    except click.ClickException as e:
        e.show()
        sys.exit(2)
    except click.exceptions.Abort:
        click.echo("brevis: interrupted", err=True)
        sys.exit(EXIT_INTERRUPTED)
    except BrevisError as e:
        if debug:
            traceback.print_exc()
        click.echo(f"brevis: {e.kind}: {e}", err=True)
        sys.exit(e.exit_code)
    except KeyboardInterrupt:
        click.echo("brevis: interrupted", err=True)
        sys.exit(EXIT_INTERRUPTED)
    except BrokenPipeError:
        os._exit(1)
    except Exception as e:  # a bug: say so in one line, details with --debug
        if debug:
            traceback.print_exc()
        click.echo(f"brevis: internal error: {type(e).__name__}: {e} (rerun with --debug)", err=True)
        sys.exit(EXIT_INTERNAL)
