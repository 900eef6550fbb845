"""brevis compress-many: fleets of checkpoints, one archive each, on Dask or a process pool.

The fleet: a real checkpoint (examples/taesd/taef2_decoder.pth) copied into
a few folders beside small generated safetensors files that differ, and
one checkpoint that is a single file. Every archive is decompressed and
compared with its source byte for byte, and compared with the archive of
the single-process brevis.compress with the same prior. The process-pool
tests always run; the Dask tests need `pip install 'brevis[dask]'`.
"""

from __future__ import annotations

import importlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import brevis
from brevis import fleet
from brevis.errors import BrevisError, InvalidArgument
from brevis.synth.prior import Prior
from helpers import REPO, small_checkpoint, write_safetensors

PTH = REPO / "examples" / "taesd" / "taef2_decoder.pth"
EFFORT = 2

needs_dask = pytest.mark.skipif(not fleet.dask_available(),
                                reason="Dask is not installed (pip install 'brevis[dask]'); "
                                       "the process-pool fallback is tested instead")


# ------------------------------------------------------------ the fleet
@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> list[Path]:
    if not PTH.is_file():
        pytest.skip(f"{PTH} not found")
    root = tmp_path_factory.mktemp("fleet")
    out = []
    for i in range(3):
        d = small_checkpoint(root / f"run-{i}", seed=i, elements=2048 * (i + 1))
        shutil.copy(PTH, d / PTH.name)
        out.append(d)
    import numpy as np
    solo = root / "solo.safetensors"  # a checkpoint that is one file
    x = np.random.default_rng(9).standard_normal(4096).astype(np.float16)
    write_safetensors(solo, {"w": ("F16", (64, 64), x.tobytes())})
    out.append(solo)
    return out


@pytest.fixture(scope="module")
def references(sources, tmp_path_factory) -> dict[str, bytes]:
    """Single-process archives with the prior the fleet learns (on the first checkpoint)."""
    prior = brevis.learn_prior([sources[0]], effort=EFFORT)
    prior = Prior.from_json(json.loads(json.dumps(prior.to_json())))  # as shipped to workers
    folder = tmp_path_factory.mktemp("single")
    out = {}
    for s in sources:
        name = fleet.checkpoint_name(s)
        brevis.compress([s], folder / f"{name}.brv", threads=1, effort=EFFORT, prior=prior)
        out[name] = (folder / f"{name}.brv").read_bytes()
    return out


def source_files(src: Path) -> dict[str, bytes]:
    if src.is_file():
        return {src.name: src.read_bytes()}
    return {p.relative_to(src).as_posix(): p.read_bytes() for p in sorted(src.rglob("*")) if p.is_file()}


def check_fleet(summary: dict, sources: list[Path], outdir: Path, references: dict[str, bytes] | None,
                tmp: Path) -> None:
    """Every checkpoint compressed, verified, decompressing to its source byte for byte."""
    assert summary["ok"], summary
    assert [r["name"] for r in summary["checkpoints"]] == [fleet.checkpoint_name(s) for s in sources]
    for src, r in zip(sources, summary["checkpoints"]):
        assert r["status"] == "compressed" and r["verified"] and r["error"] is None, r
        archive = outdir / f"{r['name']}.brv"
        assert r["archive"] == str(archive) and r["source"] == str(src)
        assert r["archive_bytes"] == archive.stat().st_size
        assert r["original_bytes"] == sum(len(b) for b in source_files(src).values())
        assert 0 < r["ratio"] < 1 and r["seconds"] > 0
        copy = tmp / f"copy-{r['name']}"
        brevis.decompress(archive, copy)
        assert source_files(copy) == source_files(src), r["name"]
        if references is not None:
            assert archive.read_bytes() == references[r["name"]], f"{r['name']}: differs from brevis.compress"
    no_partials(outdir)


def no_partials(folder: Path) -> None:
    left = [p.name for p in folder.iterdir() if p.name.startswith(".") or "partial" in p.name]
    assert not left, left


# ------------------------------------------------------------ naming, manifests
def test_names_and_collisions(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    for d in (a, b):
        d.mkdir()
        (d / "model.pth").write_bytes(b"x")
    (tmp_path / "step-10.safetensors").write_bytes(b"y")
    names = [c.name for c in fleet.plan_checkpoints([a, tmp_path / "step-10.safetensors"], tmp_path / "out")]
    assert names == ["a", "step-10"]
    with pytest.raises(InvalidArgument, match=r"a/model.pth and .*b/model.pth would both be archived as model.brv"):
        fleet.plan_checkpoints([a / "model.pth", b / "model.pth"], tmp_path / "out")
    with pytest.raises(InvalidArgument, match="listed twice"):
        fleet.plan_checkpoints([a, str(a) + "/"], tmp_path / "out")
    with pytest.raises(InvalidArgument, match="no such file"):
        fleet.plan_checkpoints([tmp_path / "missing"], tmp_path / "out")
    with pytest.raises(InvalidArgument, match="inside the checkpoint"):
        fleet.plan_checkpoints([a], a / "archives")


def test_manifest(tmp_path):
    (tmp_path / "lists").mkdir()
    m = tmp_path / "lists" / "fleet.txt"
    m.write_text("# a training run\n../run/step-1\n\n  /abs/step-2  \n")
    assert fleet.read_manifest(m) == [str(tmp_path / "lists" / "../run/step-1"), "/abs/step-2"]
    with pytest.raises(InvalidArgument, match="cannot read manifest"):
        fleet.read_manifest(tmp_path / "nope.txt")


# ------------------------------------------------------------ process pool (always)
@pytest.fixture(scope="module")
def pool():
    with fleet.open_engine("processes", workers=2) as engine:
        yield engine


def test_processes_fleet(sources, references, tmp_path):
    seen = []
    s = brevis.compress_many(sources, tmp_path / "out", engine="processes", workers=2, effort=EFFORT,
                             progress=seen.append)
    assert s["engine"] == "processes" and s["workers"] == 2 and s["scheduler"] is None
    assert s["prior"]["source"] == "learned on run-0"
    assert sorted(r["name"] for r in seen) == sorted(references)
    check_fleet(s, sources, tmp_path / "out", references, tmp_path)


def test_processes_worker_killed(sources, references, tmp_path):
    """A worker killed mid-run: the pool is replaced, the tasks in flight run again."""
    killed = []
    with fleet.open_engine("processes", workers=2) as engine:
        def kill_one(report):
            if not killed:
                pid = engine.worker_pids()[0]
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)

        s = brevis.compress_many(sources, tmp_path / "out", engine=engine, effort=EFFORT, progress=kill_one)
        assert killed and killed[0] not in engine.worker_pids()
    check_fleet(s, sources, tmp_path / "out", references, tmp_path)


def test_rerun_skips_verified(sources, pool, tmp_path):
    out = tmp_path / "out"
    first = brevis.compress_many(sources, out, engine=pool, effort=EFFORT)
    assert first["compressed"] == len(sources)
    before = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    again = brevis.compress_many(sources, out, engine=pool, effort=EFFORT)
    assert again["ok"] and again["skipped"] == len(sources) and again["compressed"] == 0
    assert all(r["status"] == "skipped" and r["verified"] for r in again["checkpoints"])
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == before
    # A damaged archive, a missing one and a stale temporary: only those two are redone,
    # with the prior kept from an archive that verified (so the fleet keeps one prior).
    damaged = out / "run-1.brv"
    damaged.write_bytes(damaged.read_bytes()[:-100])
    (out / "solo.brv").unlink()
    stale = out / ".run-2.brv.abcd1234.partial"
    stale.write_bytes(b"left by a killed worker")
    old = time.time_ns() - 10**9
    os.utime(stale, ns=(old, old))
    third = brevis.compress_many(sources, out, engine=pool, effort=EFFORT)
    assert [r["status"] for r in third["checkpoints"]] == ["skipped", "compressed", "skipped", "compressed"]
    assert third["prior"]["source"] == "archive run-0.brv"
    assert third["cleaned_partials"] == [str(stale)]
    check_fleet({**third, "checkpoints": [third["checkpoints"][i] for i in (1, 3)]},
                [sources[i] for i in (1, 3)], out, None, tmp_path)
    forced = brevis.compress_many(sources[3:], out, engine=pool, effort=EFFORT, force=True)
    assert forced["compressed"] == 1 and forced["prior"]["source"] == "learned on solo"


def test_failure_is_reported(sources, pool, tmp_path):
    """A checkpoint that cannot be archived is reported; the others are archived; nothing partial is left."""
    bad = tmp_path / "bad"
    bad.mkdir()
    os.mkfifo(bad / "pipe")  # refused by the source walk on the worker
    s = brevis.compress_many([sources[3], bad], tmp_path / "out", engine=pool, effort=EFFORT)
    assert not s["ok"] and s["failed"] == 1 and s["compressed"] == 1
    r = s["checkpoints"][1]
    assert r["status"] == "failed" and "FIFO" in r["error"] and not r["verified"]
    assert not (tmp_path / "out" / "bad.brv").exists()
    no_partials(tmp_path / "out")


def brevis_cli(*args, env_extra=None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [env_extra, str(REPO)]))}
    return subprocess.run([sys.executable, "-m", "brevis", *map(str, args)], capture_output=True, text=True,
                          timeout=300, env=env)


def test_cli_fallback_without_dask(sources, references, tmp_path):
    """Without Dask the command says so and runs on a local process pool."""
    hide = tmp_path / "hide"
    hide.mkdir()
    (hide / "distributed.py").write_text("raise ImportError('hidden by the test')\n")
    manifest = tmp_path / "fleet.txt"
    manifest.write_text("\n".join(map(str, sources[1:])) + "\n")
    r = brevis_cli("compress-many", sources[0], "-m", manifest, "-o", tmp_path / "out", "-w", "2", "--json",
                   env_extra=str(hide))
    assert r.returncode == 0, r.stderr
    assert "Dask is not installed" in r.stderr and "local process pool of 2 workers" in r.stderr
    s = json.loads(r.stdout)
    assert s["engine"] == "processes"
    check_fleet(s, sources, tmp_path / "out", references, tmp_path)
    r = brevis_cli("compress-many", *sources, "-o", tmp_path / "out", "--engine", "processes", "-q")
    assert r.returncode == 0 and r.stdout == "" and r.stderr == "", r.stderr
    r = brevis_cli("compress-many", sources[3], tmp_path / "bad", "-o", tmp_path / "out", "--engine", "processes")
    assert r.returncode == 2 and "no such file or folder" in r.stderr


# ------------------------------------------------------------ Dask
@pytest.fixture(scope="module")
def dask_engine():
    if not fleet.dask_available():
        pytest.skip("Dask is not installed")
    with fleet.open_engine("dask", workers=2) as engine:
        yield engine


@needs_dask
def test_dask_fleet(sources, references, dask_engine, tmp_path):
    assert dask_engine.workers == 2 and len(set(dask_engine.worker_pids())) == 2
    s = brevis.compress_many(sources, tmp_path / "out", engine=dask_engine, effort=EFFORT)
    assert s["engine"] == "dask" and s["scheduler"].startswith("tcp://") and s["workers"] == 2
    check_fleet(s, sources, tmp_path / "out", references, tmp_path)
    again = brevis.compress_many(sources, tmp_path / "out", engine=dask_engine, effort=EFFORT)
    assert again["skipped"] == len(sources)


@needs_dask
def test_dask_worker_killed(sources, references, dask_engine, tmp_path):
    """A busy worker killed mid-run: the nanny restarts it, the scheduler reruns its task."""
    client = dask_engine.client
    killed = []

    def kill_busy(report):
        if killed:
            return
        pids = client.run(os.getpid)
        busy = [a for a, keys in client.processing().items() if keys] or list(pids)
        os.kill(pids[busy[0]], signal.SIGKILL)
        killed.append(pids[busy[0]])

    s = brevis.compress_many(sources, tmp_path / "out", engine=dask_engine, effort=EFFORT, progress=kill_busy)
    assert killed
    check_fleet(s, sources, tmp_path / "out", references, tmp_path)
    client.wait_for_workers(2, timeout=60)
    assert killed[0] not in dask_engine.worker_pids()


def test_scheduler_needs_dask():
    with pytest.raises(InvalidArgument, match="needs the dask engine"):
        fleet.open_engine("processes", scheduler="tcp://127.0.0.1:1")
    with pytest.raises(BrevisError):
        fleet.open_engine("bogus")


# ------------------------------------------------------------ fine-tunes against a base
def fine_tunes(root: Path) -> tuple[Path, list[Path]]:
    """A base model and two fine-tunes of it: the same F16 tensors with a few
    low mantissa bits changed (bit patterns only), plus a tensor of their own."""
    import numpy as np

    rng = np.random.default_rng(5)
    tensors = {f"layers.{i}.weight": (rng.standard_normal(64 * 256) * 0.02).astype(np.float16).view(np.uint16)
               for i in range(3)}
    base = root / "base"
    base.mkdir()
    write_safetensors(base / "model.safetensors", {k: ("F16", (64, 256), v.tobytes()) for k, v in tensors.items()})
    tunes = []
    for j in range(2):
        d = root / f"ft-{j}"
        d.mkdir()
        changed = {k: v ^ (rng.integers(0, 4, v.size, dtype=np.uint16) * (rng.random(v.size) < 0.3))
                   for k, v in tensors.items()}
        own = rng.integers(0, 1 << 16, 4096, dtype=np.uint16)
        write_safetensors(d / "model.safetensors", {**{k: ("F16", (64, 256), v.tobytes()) for k, v in changed.items()},
                                                    "head.weight": ("F16", (64, 64), own.tobytes())})
        (d / "config.json").write_text(f'{{"tune": {j}}}\n')
        tunes.append(d)
    return base, tunes


@pytest.mark.parametrize("engine_name", ["processes", pytest.param("dask", marks=needs_dask)])
def test_base_through_compress_many(engine_name, tmp_path, request):
    """compress-many --base: the archives of brevis.compress --base (with the fleet's prior), coded
    against the base, decompressing with it."""
    from brevis.codec.encoder import learn

    base, tunes = fine_tunes(tmp_path)
    engine = request.getfixturevalue("dask_engine" if engine_name == "dask" else "pool")
    s = brevis.compress_many(tunes, tmp_path / "out", engine=engine, effort=EFFORT, base=base)
    assert s["ok"] and s["compressed"] == 2, s
    assert s["prior"]["source"] == "learned on ft-0"
    prior = Prior.from_json(json.loads(json.dumps(learn([tunes[0]], effort=EFFORT, base=base).to_json())))
    for src, r in zip(tunes, s["checkpoints"]):
        assert r["status"] == "compressed" and r["verified"], r
        ref = tmp_path / f"ref-{src.name}.brv"
        brevis.compress([src], ref, threads=2, effort=EFFORT, prior=prior, base=base)
        archive = Path(r["archive"])
        assert archive.read_bytes() == ref.read_bytes(), f"{src.name}: differs from brevis.compress --base"
        from brevis.archive.reader import ArchiveReader
        with ArchiveReader(archive) as reader:
            assert reader.index.base is not None  # some tensors are coded against the base
        with pytest.raises(BrevisError):
            brevis.decompress(archive, tmp_path / f"nobase-{src.name}")
        brevis.decompress(archive, tmp_path / f"copy-{src.name}", base=base)
        assert source_files(tmp_path / f"copy-{src.name}") == source_files(src)
    again = brevis.compress_many(tunes, tmp_path / "out", engine=engine, effort=EFFORT, base=base)
    assert again["skipped"] == 2  # the existing archives verify against their sources, with the base


def test_cli_compress_many_base(tmp_path):
    base, tunes = fine_tunes(tmp_path)
    r = brevis_cli("compress-many", *tunes, "-o", tmp_path / "out", "--engine", "processes", "-w", "2",
                   "--base", base, "--json")
    assert r.returncode == 0, r.stderr
    s = json.loads(r.stdout)
    assert s["compressed"] == 2 and all(c["verified"] for c in s["checkpoints"])
    r = brevis_cli("verify", tmp_path / "out" / "ft-1.brv", "--source", tunes[1], "--base", base, "-q")
    assert r.returncode == 0, r.stderr
    r = brevis_cli("compress-many", *tunes, "-o", tmp_path / "out2", "--base", tmp_path / "nope")
    assert r.returncode == 2 and "no such file or folder" in r.stderr


# ------------------------------------------------------------ chunks of a large file across the cluster
@needs_dask
def test_dask_spreads_chunks_of_a_large_file(dask_engine, tmp_path):
    """A checkpoint with a file above split_bytes: its chunks are encoded on both workers,
    and the archive is the one brevis.compress writes in one process."""
    import numpy as np

    src = tmp_path / "big"
    src.mkdir()
    rng = np.random.default_rng(3)
    write_safetensors(src / "model.safetensors", {
        f"layers.{i}.weight": ("F16", (512, 1024), (rng.standard_normal(1 << 19) * 0.02).astype(np.float16).tobytes())
        for i in range(16)})  # 16 MiB: 16 batches of 1 MiB
    # Both workers ready and warm: a worker the previous test killed comes back
    # cold, and the scheduler would rightly steal all its queued chunks while it imports.
    dask_engine.client.wait_for_workers(2, timeout=60)
    dask_engine.client.run(importlib.import_module, "brevis.codec.encoder")
    s = brevis.compress_many([src], tmp_path / "out", engine=dask_engine, effort=EFFORT,
                             split_bytes=1 << 20, batch_bytes=1 << 20)
    r = s["checkpoints"][0]
    assert s["ok"] and r["verified"], s
    assert r["encode_processes"] == 2, r  # pids of the processes that returned chunks
    prior = Prior.from_json(json.loads(json.dumps(brevis.learn_prior([src], effort=EFFORT).to_json())))
    brevis.compress([src], tmp_path / "ref.brv", threads=1, effort=EFFORT, prior=prior)
    assert (tmp_path / "out" / "big.brv").read_bytes() == (tmp_path / "ref.brv").read_bytes()
    # Below split_bytes: one task, one process.
    s = brevis.compress_many([src], tmp_path / "out2", engine=dask_engine, effort=EFFORT)
    assert s["checkpoints"][0]["encode_processes"] == 1


@needs_dask
def test_a_taken_port_8787_is_not_reported_to_the_user():
    """The local cluster's HTTP server wants port 8787; when something else
    holds it, distributed warned "Port 8787 is already in use" (issue 15)."""
    import socket
    import warnings

    with socket.socket() as holder:
        try:
            holder.bind(("", 8787))
            holder.listen()
        except OSError:
            pass  # taken already: the situation under test
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with fleet.open_engine("dask", workers=1) as engine:
                assert engine.workers == 1
    assert not [w for w in caught if "already in use" in str(w.message)], [str(w.message) for w in caught]
