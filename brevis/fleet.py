"""Fleets of checkpoints: one archive per checkpoint, spread over an engine.

    brevis.compress_many(["run/step-1000", "run/step-2000"], "archives/", workers=4)

The work runs on Dask (`pip install '.[dask]'`, the extra `dask`): a local cluster of
worker processes by default, or an existing cluster (`scheduler=` a
scheduler address, `scheduler_file=`, or Dask's own DASK_SCHEDULER_ADDRESS).
Without Dask, a local process pool (concurrent.futures) runs the same
tasks with the same semantics. The unit of work is a checkpoint; on Dask,
a checkpoint with a file of at least `split_bytes` is compressed by a
task that sends the chunks it plans to the whole cluster (batches of
chunk jobs, jobs.run_chunks, through Client.get_executor()) and writes
the results in archive order with a bounded window, so no worker holds a
whole checkpoint. `base`: every checkpoint is coded against that base
model (compress --base), which must be at the same path on every worker.

1. Checkpoints are named (NAME.brv from the folder or file name; two
   checkpoints with one name are an error) and, unless `force`, the
   archives already in the output folder are verified against their
   sources on the workers: those that verify are skipped.
2. One production prior serves the whole fleet: the one given, else the
   one stored in an archive that verified (so a re-run keeps the fleet's
   prior), else one learned (on a worker) on the first checkpoint to do.
   Its JSON goes to every task.
3. Each checkpoint is compressed by brevis.compress on a worker (an
   archive appears only complete: written to a temporary, then renamed),
   then verified there against its source; an archive that does not
   verify is removed. Failed tasks (exceptions, killed workers) are
   retried by the engine; deterministic errors (a damaged source) are
   reported at once. At the end the driver removes the temporaries that
   killed workers left behind.

`compress_runs` takes training runs instead: each run (as brevis
compress-run takes one) is one task that archives its checkpoints in
order into OUTDIR/NAME.brv.d, each against the one before (series.py),
and verifies every member it wrote; runs go in parallel.
"""

from __future__ import annotations

import json
import os
import struct
import sys
import threading
import time
import uuid
import warnings
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

from .errors import BrevisError, InvalidArgument, IOFailure
from .interrupts import start_thread
from .workers import Workers, open_workers
from .defaults import DEFAULT_EFFORT, default_threads
from .fs.sources import collect
from .synth.prior import Prior

SUFFIX = ".brv"
DEFAULT_RETRIES = 3
SPLIT_BYTES = 64 << 20  # on Dask, a checkpoint with a file this large has its chunks spread over the cluster
PROGRESS_SECONDS = 0.25  # how often compress tasks report their bytes done, and the driver reads them
ENGINES = ("auto", "dask", "processes")


# ------------------------------------------------------------ worker tasks
# Plain module functions: the engines pickle them by reference, so workers
# need Brevis installed (the same version as the driver).

def _error(e: BaseException) -> str:
    if isinstance(e, BrevisError):
        return f"{e.kind}: {e}"
    return f"{type(e).__name__}: {e}"


def verify_task(source: str, archive: str, threads: int, base: str | None = None) -> dict:
    """Does an existing archive decode and match its source?"""
    import brevis

    start = time.perf_counter()
    try:
        r = brevis.verify(archive, sources=[source], threads=threads, base=base)
    except BrevisError as e:  # damaged, truncated: not a usable archive
        return {"ok": False, "error": _error(e), "seconds": time.perf_counter() - start}
    problem = r["problems"][0] if r["problems"] else None
    return {"ok": r["ok"], "original_bytes": r["original_bytes"], "seconds": time.perf_counter() - start,
            "error": None if problem is None else
            f"{': '.join(str(x) for x in (problem['file'], problem['segment']) if x)}: {problem['error']}"}


def learn_task(source: str, effort: int, threads: int, base: str | None = None) -> str:
    """The prior of one checkpoint, as JSON text."""
    from .codec.encoder import learn

    return json.dumps(learn([source], effort=effort, threads=threads, base=base).to_json())


class ProgressWriter:
    """A compress task's bytes done so far, written (8 bytes, little endian,
    at most every PROGRESS_SECONDS) to a file the driver polls: the output
    folder is shared by the driver and the workers already. Best effort: a
    failure to write stops the reports, never the task."""

    def __init__(self, path: str):
        self.done = 0
        self.last = 0.0
        try:
            self.fd: int | None = os.open(path, os.O_WRONLY)
        except OSError:
            self.fd = None

    def __call__(self, n: int) -> None:
        self.done += n
        now = time.monotonic()
        if now - self.last >= PROGRESS_SECONDS:
            self.last = now
            self._write()

    def _write(self) -> None:
        if self.fd is not None:
            try:
                os.pwrite(self.fd, struct.pack("<Q", self.done), 0)
            except OSError:
                self.close()

    def close(self) -> None:
        self._write()
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


class ProgressFiles:
    """The driver's side: one locked temporary per checkpoint to compress
    (named like the archive's temporaries, so a killed run's are cleaned
    up), polled by a thread that reports new bytes to `bytes_done`; a
    checkpoint that finishes counts whole."""

    def __init__(self, outdir: Path, bytes_done: Callable[[int], None]):
        from .fs.atomic import make_temp

        self.make_temp = make_temp
        self.outdir = outdir
        self.bytes_done = bytes_done
        self.files: dict[str, tuple[Path, int, int]] = {}  # name -> (path, fd, size)
        self.seen: dict[str, int] = {}
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._poll, daemon=True)
        try:
            start_thread(self.thread)
        except BaseException:  # interrupted: the thread runs, and its caller will not close it
            self.close()
            raise

    def path_for(self, c: "Checkpoint") -> str | None:
        try:
            path, fd = self.make_temp(self.outdir, c.archive.name)
        except OSError:
            return None
        with self.lock:
            self.files[c.name] = (path, fd, c.size)
            self.seen.setdefault(c.name, 0)
        return str(path)

    def _advance(self, name: str, value: int, size: int) -> None:
        with self.lock:
            delta = min(value, size) - self.seen.get(name, 0)
            if delta <= 0:
                return
            self.seen[name] = min(value, size)
        self.bytes_done(delta)

    def _poll(self) -> None:
        while not self.stop.wait(PROGRESS_SECONDS):
            with self.lock:
                files = list(self.files.items())
            for name, (_, fd, size) in files:
                try:
                    data = os.pread(fd, 8, 0)
                except OSError:
                    continue
                if len(data) == 8:
                    self._advance(name, struct.unpack("<Q", data)[0], size)

    def finished(self, c: "Checkpoint") -> None:
        self._advance(c.name, c.size, c.size)

    def close(self) -> None:
        self.stop.set()
        self.thread.join()
        for path, fd, _ in self.files.values():
            try:
                os.unlink(path)
            except OSError:
                pass
            os.close(fd)
        self.files.clear()


def compress_task(source: str, archive: str, prior_json: str | None, effort: int, threads: int,
                  base: str | None = None, split: bool = False, batch_bytes: int | None = None,
                  progress_path: str | None = None) -> dict:
    """Compress one checkpoint with the fleet's prior, then verify the archive.

    `split` (on a Dask worker): the checkpoint's chunks are encoded by the
    whole cluster, this task planning and writing. Errors a retry cannot
    fix (BrevisError other than I/O) come back in the result; anything
    else (I/O, memory, a bug) is raised for the engine to retry.
    """
    from .codec.encoder import WORKER_BATCH_BYTES, compress

    start = time.perf_counter()
    prior = Prior.from_json(json.loads(prior_json)) if prior_json else None
    # force: the driver decided this archive is to be (re)written; a retry
    # may also find the archive of an attempt that died after its rename.
    kw = dict(threads=threads, force=True, effort=effort, prior=prior, base=base, processes=False)
    progress = kw["progress"] = ProgressWriter(progress_path) if progress_path else None
    try:
        if split:
            from distributed import worker_client

            # Leaves this worker's slot to chunk jobs while this task plans and writes.
            with worker_client() as client:
                workers = max(1, len(client.scheduler_info().get("workers", {})))
                s = compress([source], archive, executor=client.get_executor(pure=False), window=2 * workers,
                             batch_bytes=batch_bytes or WORKER_BATCH_BYTES, **kw)
        else:
            s = compress([source], archive, **kw)
    except IOFailure:
        raise
    except BrevisError as e:
        return {"error": _error(e), "seconds": time.perf_counter() - start}
    finally:
        if progress is not None:
            progress.close()
    r = verify_task(source, archive, threads, base)
    out = {"original_bytes": s["original_bytes"], "archive_bytes": s["archive_bytes"],
           "verified": r["ok"], "error": None, "seconds": time.perf_counter() - start,
           "encode_processes": s["encode_processes"]}
    if not r["ok"]:  # never leave an archive that does not give the source back
        Path(archive).unlink(missing_ok=True)
        out["error"] = f"verification failed, archive removed: {r['error']}"
    return out


def run_task(source: str, output: str, order: str, keyframe_every: int, effort: int, threads: int) -> dict:
    """Archive one training run (series.compress_run), then verify each new
    member against its checkpoint. A member that does not verify is removed,
    with every member written after it (they are coded against it), so a
    retry goes on from the last good one. Errors as compress_task's."""
    from . import series

    start = time.perf_counter()
    try:
        s = series.compress_run([source], output, order=order, keyframe_every=keyframe_every, effort=effort,
                                threads=threads, processes=False)
    except IOFailure:
        raise
    except BrevisError as e:
        return {"error": _error(e), "seconds": time.perf_counter() - start}
    sources = {c.archive: c.path for c in series.checkpoints([source], order)}
    for k, m in enumerate(s["written"]):
        r = verify_task(str(sources[Path(m["archive"]).name]), m["archive"], threads)
        if not r["ok"]:
            for later in s["written"][k:]:
                Path(later["archive"]).unlink(missing_ok=True)
            return {"error": f"{Path(m['archive']).name}: verification failed, removed with the "
                             f"{len(s['written']) - k - 1} after it: {r['error']}", "seconds": time.perf_counter() - start}
    return {"original_bytes": s["original_bytes"], "archive_bytes": s["archive_bytes"], "verified": True,
            "error": None, "seconds": time.perf_counter() - start, "written": len(s["written"]),
            "kept": len(s["kept"])}


# ------------------------------------------------------------ engines
@dataclass
class Task:
    tag: Any  # the caller's handle for the result
    fn: Callable
    args: tuple
    kind: str = "task"  # for the engine's task names
    attempts: int = 0


class Engine:
    """Runs tasks on workers and yields (task, ok, result or exception) as they finish."""

    name = "engine"
    address: str | None = None

    def run(self, tasks: Iterable[Task]) -> Iterator[tuple[Task, bool, Any]]:
        raise NotImplementedError

    @property
    def workers(self) -> int:
        raise NotImplementedError

    def worker_pids(self) -> list[int]:
        """Process ids of the workers (on this machine for a local engine)."""
        raise NotImplementedError

    def close(self) -> None:
        pass

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def dask_available() -> bool:
    try:
        import distributed  # noqa: F401
    except ImportError:
        return False
    return True


class DaskEngine(Engine):
    """A Dask client: on a new local cluster, or on an existing scheduler.

    Task exceptions are retried `retries` times (Client.submit(retries=));
    tasks whose worker died are rescheduled by the scheduler up to its
    `distributed.scheduler.allowed-failures` (set to `retries` on a local
    cluster; a remote scheduler keeps its own setting).
    """

    name = "dask"

    def __init__(self, workers: int | None = None, scheduler: str | None = None,
                 scheduler_file: str | None = None, retries: int = DEFAULT_RETRIES):
        import logging

        import dask
        from distributed import Client, LocalCluster

        self.retries = retries
        self.cluster = None
        address = scheduler or (None if scheduler_file else dask.config.get("scheduler-address", None))
        try:
            if address or scheduler_file:
                self.client = Client(address, scheduler_file=scheduler_file, timeout="30s")
            else:
                # The scheduler's HTTP server (metrics, even without a dashboard) takes
                # port 8787, or another with a warning when that is taken: not the user's concern.
                with dask.config.set({"distributed.scheduler.allowed-failures": retries}), \
                        warnings.catch_warnings():
                    warnings.filterwarnings("ignore", message="Port .* is already in use", category=UserWarning)
                    self.cluster = LocalCluster(n_workers=workers or default_threads(), threads_per_worker=1,
                                                processes=True, dashboard_address=None,
                                                silence_logs=logging.ERROR)
                self.client = Client(self.cluster)
        except (OSError, TimeoutError, ValueError) as e:
            if self.cluster is not None:
                self.cluster.close()
            where = address or scheduler_file or "a local cluster"
            raise InvalidArgument(f"cannot reach the Dask scheduler ({where}): {e}") from None
        self.address = self.client.scheduler.address

    @property
    def workers(self) -> int:
        return len(self.client.scheduler_info().get("workers", {}))

    def worker_pids(self) -> list[int]:
        return list(self.client.run(os.getpid).values())

    def run(self, tasks):
        from distributed import as_completed

        futures = {}
        for t in tasks:
            key = f"brevis-{t.kind}-{uuid.uuid4().hex[:12]}"
            futures[self.client.submit(t.fn, *t.args, key=key, pure=False, retries=self.retries)] = t
        try:
            for f in as_completed(list(futures)):
                t = futures[f]
                try:
                    yield t, True, f.result()
                except Exception as e:  # retries exhausted, KilledWorker
                    yield t, False, e
        finally:
            self.client.cancel([f for f in futures if not f.done()])

    def close(self) -> None:
        self.client.close()
        if self.cluster is not None:
            self.cluster.close()


class ProcessEngine(Engine):
    """A local process pool with Dask's semantics: a failed task (an exception
    or a dead worker) is run again, up to `retries` more times. A dead worker
    breaks a ProcessPoolExecutor (every task in flight fails), so the pool is
    replaced and the tasks in flight are submitted again.

    The pool is open_workers' (fork where no other thread runs yet, else
    spawn, from a thread of its own; workers die with this process), even
    of one worker. Unlike chunk workers they keep SIGINT: Ctrl-C stops the
    checkpoints they are compressing instead of waiting for them."""

    name = "processes"

    def __init__(self, workers: int | None = None, retries: int = DEFAULT_RETRIES):
        self.size = workers or default_threads()
        self.retries = retries
        self.generation = 0
        self.pool: Workers | None = None
        self.executor = self._new_pool()

    def _new_pool(self) -> ProcessPoolExecutor:
        self.pool = open_workers(self.size, processes=True, min_workers=1, ignore_interrupts=False)
        if self.pool.executor is None:
            raise InvalidArgument("cannot start worker processes here (in a daemonic process, or spawned from "
                                  "a script without `if __name__ == \"__main__\":`): use the dask engine")
        return self.pool.executor

    @property
    def workers(self) -> int:
        return self.size

    def worker_pids(self) -> list[int]:
        return list(self.executor._processes or {})  # started lazily; a pid per live process

    def run(self, tasks):
        pending: dict = {}

        def submit(t: Task) -> None:
            t.attempts += 1
            pending[self.executor.submit(t.fn, *t.args)] = (t, self.generation)

        for t in tasks:
            submit(t)
        try:
            while pending:
                done, _ = wait(list(pending), return_when=FIRST_COMPLETED)
                again = []
                for f in done:
                    t, generation = pending.pop(f)
                    try:
                        result = f.result()
                    except Exception as e:
                        if isinstance(e, BrokenProcessPool) and generation == self.generation:
                            self.executor.shutdown(wait=False, cancel_futures=True)
                            self.generation += 1
                            self.executor = self._new_pool()
                        if t.attempts <= self.retries:
                            again.append(t)
                        else:
                            yield t, False, e
                        continue
                    yield t, True, result
                for t in again:
                    submit(t)
        finally:
            for f in pending:
                f.cancel()

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown()


def open_engine(engine: str = "auto", workers: int | None = None, scheduler: str | None = None,
                scheduler_file: str | None = None, retries: int = DEFAULT_RETRIES) -> Engine:
    """Dask when installed (or asked for), else a local process pool."""
    if engine not in ENGINES:
        raise InvalidArgument(f"engine must be one of {', '.join(ENGINES)}, not {engine!r}")
    if workers is not None and workers < 1:
        raise InvalidArgument("workers must be at least 1")
    if retries < 0:
        raise InvalidArgument("retries must be 0 or more")
    remote = scheduler or scheduler_file
    if engine == "processes" and remote:
        raise InvalidArgument("a scheduler needs the dask engine, not a local process pool")
    if engine == "dask" or remote or (engine == "auto" and dask_available()):
        if not dask_available():
            raise InvalidArgument("Dask is not installed: pip install 'brevis-ckpt[dask]' (or distributed)")
        return DaskEngine(workers, scheduler, scheduler_file, retries)
    return ProcessEngine(workers, retries)


# ------------------------------------------------------------ checkpoints
@dataclass
class Checkpoint:
    name: str
    source: Path
    archive: Path
    size: int  # bytes of its files
    error: str | None = None  # why it cannot be archived (found before any task runs)
    largest: int = 0  # bytes of its largest file

    def report(self, **kw) -> dict:
        r = {"name": self.name, "source": str(self.source), "archive": str(self.archive),
             "status": None, "original_bytes": self.size, "archive_bytes": None, "ratio": None,
             "seconds": None, "verified": False, "error": None, "encode_processes": None}
        r.update(kw)
        if r["archive_bytes"] is not None and r["original_bytes"]:
            r["ratio"] = r["archive_bytes"] / r["original_bytes"]
        return r


def read_manifest(path: str | os.PathLike) -> list[str]:
    """Checkpoints listed one a line ('-': standard input); blank lines and
    lines starting with # are skipped; relative paths are relative to the
    manifest's folder."""
    try:
        text = sys.stdin.read() if str(path) == "-" else Path(path).read_text()
    except OSError as e:
        raise InvalidArgument(f"cannot read manifest {path}: {e.strerror}") from None
    base = Path.cwd() if str(path) == "-" else Path(path).parent
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            out.append(str(base / line) if not os.path.isabs(line) else line)
    return out


def checkpoint_name(path: Path) -> str:
    """NAME of NAME.brv: a folder's name, or a file's name without its last suffix."""
    p = Path(os.path.abspath(path))
    name = p.name if p.is_dir() else (p.stem or p.name)
    if not name:
        raise InvalidArgument(f"{path}: cannot name an archive after it")
    return name


def plan_checkpoints(paths: list[str | os.PathLike], outdir: Path) -> list[Checkpoint]:
    if not paths:
        raise InvalidArgument("no checkpoints given")
    out_abs = outdir.resolve()
    seen: dict[str, Path] = {}
    checkpoints = []
    for p in map(Path, paths):
        if not p.exists():
            raise InvalidArgument(f"{p}: no such file or folder")
        if p.is_dir() and (out_abs == p.resolve() or out_abs.is_relative_to(p.resolve())):
            raise InvalidArgument(f"the output folder {outdir} is inside the checkpoint {p}")
        name = checkpoint_name(p)
        key = name.casefold()  # one name on a case-insensitive filesystem
        if key in seen:
            other = seen[key]
            if other.resolve() == p.resolve():
                raise InvalidArgument(f"checkpoint {p} is listed twice")
            raise InvalidArgument(f"checkpoints {other} and {p} would both be archived as "
                                  f"{name}{SUFFIX}: rename one or archive them in separate runs")
        seen[key] = p
        try:
            files, _ = collect([p])
            sizes = [s.path.stat().st_size for s in files]
            size, largest, error = sum(sizes), max(sizes, default=0), None
        except (BrevisError, OSError) as e:  # reported as this checkpoint's failure
            size, largest = 0, 0
            error = _error(e) if isinstance(e, BrevisError) else f"cannot read {p}: {e.strerror}"
        checkpoints.append(Checkpoint(name, p, outdir / f"{name}{SUFFIX}", size, error, largest))
    return checkpoints


def archive_prior(archive: Path) -> dict | None:
    """The learned prior an archive was made with (its JSON), or None."""
    from .archive.reader import ArchiveReader

    try:
        with ArchiveReader(archive) as reader:
            prior = reader.index.prior
        return prior if prior and Prior.from_json(prior).learned else None
    except BrevisError:
        return None


# ------------------------------------------------------------ the driver
def compress_many(checkpoints: list[str | os.PathLike], outdir: str | os.PathLike, *,
                  engine: str | Engine = "auto", workers: int | None = None, scheduler: str | None = None,
                  scheduler_file: str | None = None, retries: int = DEFAULT_RETRIES, force: bool = False,
                  effort: int = DEFAULT_EFFORT, prior: Prior | str | os.PathLike | None = None,
                  threads: int = 1, progress: Callable[[dict], None] | None = None,
                  base: str | os.PathLike | None = None, split_bytes: int = SPLIT_BYTES,
                  batch_bytes: int | None = None, bytes_done: Callable[[int], None] | None = None) -> dict:
    """Archive each checkpoint (folder or file) into OUTDIR/NAME.brv.

    `engine`: "auto" (Dask if installed, else a process pool), "dask",
    "processes", or an open Engine (left open). `threads`: threads per
    task inside brevis.compress. `base`: a base model every checkpoint is
    coded against (compress --base). On Dask, a checkpoint with a file of
    `split_bytes` or more has its chunks encoded across the cluster, in
    jobs of about `batch_bytes` (default encoder.WORKER_BATCH_BYTES).
    `progress(report)` is called as each checkpoint finishes;
    `bytes_done(n)` (from another thread too) as n more bytes of the fleet
    are done: chunks written by the tasks, as they go (through files in
    the output folder), and whole checkpoints skipped or failed. Returns a summary with a report per checkpoint
    (name, source, archive, status compressed/skipped/failed, sizes,
    ratio, seconds, verified, error); "ok" is True when none failed.
    """
    from .fs.atomic import remove_stale

    start = time.perf_counter()
    out = Path(outdir)
    if out.exists() and not out.is_dir():
        raise InvalidArgument(f"{out} is not a folder")
    fleet = plan_checkpoints(list(checkpoints), out)
    if prior is not None and not isinstance(prior, Prior):
        prior = Prior.load(prior)
    if base is not None:
        if not Path(base).exists():
            raise InvalidArgument(f"base {base}: no such file or folder")
        base = str(Path(base).absolute())  # the workers may run elsewhere
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise IOFailure(f"cannot create {out}: {e.strerror}") from None
    own = not isinstance(engine, Engine)
    eng = open_engine(engine, workers, scheduler, scheduler_file, retries) if own else engine
    reports: dict[str, dict] = {}

    tracker = ProgressFiles(out, bytes_done) if bytes_done is not None else None

    def done(c: Checkpoint, report: dict) -> None:
        reports[c.name] = report
        if tracker is not None:
            tracker.finished(c)
        if progress:
            progress(report)

    prior_info: dict = {"source": None, "samples": None}
    try:
        for c in fleet:
            if c.error:
                done(c, c.report(status="failed", error=c.error))
        # 1. Skip what is already archived and verifies.
        todo = [c for c in fleet if not c.error and (force or not c.archive.exists())]
        existing = [c for c in fleet if not c.error and c not in todo]
        verified = []
        for t, ok, r in eng.run(Task(c, verify_task, (str(c.source), str(c.archive), threads, base), "verify")
                                for c in existing):
            if ok and r["ok"]:
                verified.append(t.tag)
                done(t.tag, t.tag.report(status="skipped", verified=True, seconds=r["seconds"],
                                         archive_bytes=t.tag.archive.stat().st_size))
            else:
                todo.append(t.tag)
        todo.sort(key=fleet.index)

        # 2. One prior for the fleet.
        prior_json = None
        if todo and effort > 0:
            if prior is not None:
                prior_json, prior_info = json.dumps(prior.to_json()), {"source": "given", "samples": prior.samples}
            else:
                for c in sorted(verified, key=fleet.index):
                    stored = archive_prior(c.archive)
                    if stored is not None:
                        prior_json = json.dumps(stored)
                        prior_info = {"source": f"archive {c.archive.name}", "samples": stored.get("samples")}
                        break
                else:
                    first = todo[0]
                    for _, ok, r in eng.run([Task(first, learn_task, (str(first.source), effort, threads, base),
                                                  "learn")]):
                        if ok:
                            prior_json = r
                            prior_info = {"source": f"learned on {first.name}",
                                          "samples": json.loads(r).get("samples")}
                        else:  # each checkpoint then learns its own
                            prior_info = {"source": None, "samples": None, "error": _error(r)}

        # 3. Compress and verify.
        split = isinstance(eng, DaskEngine)
        for t, ok, r in eng.run(Task(c, compress_task, (str(c.source), str(c.archive), prior_json, effort, threads,
                                                        base, split and c.largest >= split_bytes, batch_bytes,
                                                        tracker.path_for(c) if tracker is not None else None),
                                     "compress") for c in todo):
            c = t.tag
            if not ok:
                r = {"error": f"failed after retries: {_error(r)}"}
            if r.get("error"):
                done(c, c.report(status="failed", error=r["error"], seconds=r.get("seconds")))
            else:
                done(c, c.report(status="compressed", verified=r["verified"], seconds=r["seconds"],
                                 original_bytes=r["original_bytes"], archive_bytes=r["archive_bytes"],
                                 encode_processes=r.get("encode_processes")))
        workers_seen = eng.workers
    finally:
        if tracker is not None:
            tracker.close()
        if own:
            eng.close()
        # Temporaries of killed workers (their lock died with them).
        cleaned = []
        now = time.time_ns() + 1
        for c in fleet:
            cleaned += remove_stale(out, c.archive.name, now)

    ordered = [reports[c.name] for c in fleet]
    seconds = time.perf_counter() - start
    compressed = [r for r in ordered if r["status"] == "compressed"]
    original = sum(r["original_bytes"] or 0 for r in compressed)
    return {
        "outdir": str(out),
        "engine": eng.name,
        "scheduler": eng.address,
        "workers": workers_seen,
        "prior": prior_info,
        "checkpoints": ordered,
        "compressed": len(compressed),
        "skipped": sum(r["status"] == "skipped" for r in ordered),
        "failed": sum(r["status"] == "failed" for r in ordered),
        "original_bytes": sum(r["original_bytes"] or 0 for r in ordered),
        "archive_bytes": sum(r["archive_bytes"] or 0 for r in ordered),
        "cleaned_partials": [str(p) for p in cleaned],
        "seconds": seconds,
        "throughput_mb_s": original / seconds / 1e6 if seconds else None,
        "ok": all(r["status"] != "failed" for r in ordered),
    }


def compress_runs(runs: list[str | os.PathLike], outdir: str | os.PathLike, *, engine: str | Engine = "auto",
                  workers: int | None = None, scheduler: str | None = None, scheduler_file: str | None = None,
                  retries: int = DEFAULT_RETRIES, effort: int = DEFAULT_EFFORT, threads: int = 1,
                  order: str = "name", keyframe_every: int | None = None,
                  progress: Callable[[dict], None] | None = None) -> dict:
    """Archive each training run (a folder of checkpoints) into
    OUTDIR/NAME.brv.d, one task a run on the engine (see compress_many),
    its checkpoints in order, each against the one before (series.py).
    A run archived before is appended to. `progress(report)` as each run
    finishes. Returns a summary like compress_many's, a report per run
    (with written and kept: its members)."""
    from . import series

    start = time.perf_counter()
    out = Path(outdir)
    if out.exists() and not out.is_dir():
        raise InvalidArgument(f"{out} is not a folder")
    fleet = plan_checkpoints(list(runs), out)
    for c in fleet:
        c.archive = out / f"{c.name}{series.RUN_SUFFIX}"
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise IOFailure(f"cannot create {out}: {e.strerror}") from None
    k = keyframe_every or series.DEFAULT_KEYFRAME_EVERY
    own = not isinstance(engine, Engine)
    eng = open_engine(engine, workers, scheduler, scheduler_file, retries) if own else engine
    reports: dict[str, dict] = {}
    try:
        for c in fleet:
            if c.error:
                reports[c.name] = c.report(status="failed", error=c.error)
        tasks = [Task(c, run_task, (str(c.source), str(c.archive), order, k, effort, threads), "run")
                 for c in fleet if not c.error]
        for t, ok, r in eng.run(tasks):
            c = t.tag
            if not ok:
                r = {"error": f"failed after retries: {_error(r)}"}
            if r.get("error"):
                reports[c.name] = c.report(status="failed", error=r["error"], seconds=r.get("seconds"))
            else:
                reports[c.name] = c.report(status="compressed" if r["written"] else "skipped", verified=True,
                                           seconds=r["seconds"], original_bytes=r["original_bytes"],
                                           archive_bytes=r["archive_bytes"], written=r["written"], kept=r["kept"])
            if progress:
                progress(reports[c.name])
        workers_seen = eng.workers
    finally:
        if own:
            eng.close()
    ordered = [reports[c.name] for c in fleet]
    return {"outdir": str(out), "engine": eng.name, "scheduler": eng.address, "workers": workers_seen,
            "runs": ordered, "compressed": sum(r["status"] == "compressed" for r in ordered),
            "skipped": sum(r["status"] == "skipped" for r in ordered),
            "failed": sum(r["status"] == "failed" for r in ordered),
            "original_bytes": sum(r["original_bytes"] or 0 for r in ordered if r["status"] == "compressed"),
            "archive_bytes": sum(r["archive_bytes"] or 0 for r in ordered if r["status"] == "compressed"),
            "seconds": time.perf_counter() - start, "ok": all(r["status"] != "failed" for r in ordered)}
