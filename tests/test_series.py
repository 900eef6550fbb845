"""Training runs: a series of checkpoints, each coded against the one before (brevis/series.py).

The run is a real cut: three checkpoints of a MiniLM fine-tuned with AdamW
(benchmarks/make_training_run.py --cut), weights and optimizer state.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import brevis
from brevis import fleet, series
from brevis.codec.base_model import tensor_keys
from brevis.errors import BaseRequired, ChecksumError, FormatError, InvalidArgument, OutputExists
from brevis.formats import Segment, layout

from helpers import REPO, tree

CUT = Path(__file__).parent / "data" / "training-run"
STEPS = (25, 50, 75)


@pytest.fixture
def run(tmp_path) -> Path:
    """The cut, and a fourth checkpoint made from the third by a small
    update of every float tensor (so that each is coded against it)."""
    out = tmp_path / "run"
    shutil.copytree(CUT, out)
    (out / "SOURCE.json").unlink()
    nudge(out / "checkpoint-75", out / "checkpoint-100")
    return out


def nudge(src: Path, dst: Path, seed: int = 5) -> None:
    """A copy of checkpoint `src` whose F32 tensors have new low mantissa bits."""
    rng = np.random.default_rng(seed)
    shutil.copytree(src, dst)
    for f in dst.iterdir():
        data = bytearray(f.read_bytes())
        with open(f, "rb") as fh:
            _, segments = layout(fh, len(data), f.name)
        for s in segments:
            if s.dtype is not None and s.dtype.name == "F32" and s.length:
                x = np.frombuffer(data, np.uint32, s.length // 4, s.offset).copy()
                x ^= rng.integers(0, 1 << 8, x.size, dtype=np.uint32)
                data[s.offset:s.offset + s.length] = x.tobytes()
        f.write_bytes(bytes(data))


def cli(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "brevis", *map(str, args)], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "PYTHONPATH": str(REPO)})


def same_tree(a: Path, b: Path) -> bool:
    return tree(a) == tree(b)


# ---------------------------------------------------------------- order
@pytest.mark.parametrize("name, step", [
    ("checkpoint-500", 500), ("step_100.pt", 100), ("epoch=3-step=900.ckpt", 900), ("global_step1200", 1200),
    ("iter_0042.pth", 42), ("epoch=2.ckpt", 2), ("ckpt-7", 7), ("model_00100.pt", 100), ("model.safetensors", None),
])
def test_step_of_names(name, step):
    assert series.step_of(name) == step


def test_checkpoints_in_step_order_and_overrides(tmp_path):
    for n in ("checkpoint-100", "checkpoint-20", "checkpoint-3"):
        (tmp_path / "r" / n).mkdir(parents=True)
    assert [c.step for c in series.checkpoints(tmp_path / "r")] == [3, 20, 100]  # numbers, not strings
    given = [tmp_path / "r" / n for n in ("checkpoint-100", "checkpoint-3")]
    assert [c.name for c in series.checkpoints(given, "given")] == ["checkpoint-100", "checkpoint-3"]
    (tmp_path / "r" / "final").mkdir()
    with pytest.raises(InvalidArgument, match="cannot tell the step of .*final.*--order given"):
        series.checkpoints([*given, tmp_path / "r" / "final"])
    (tmp_path / "s" / "step-5").mkdir(parents=True)
    (tmp_path / "s" / "epoch=1-step=5").mkdir()
    with pytest.raises(InvalidArgument, match="the same step"):
        series.checkpoints(tmp_path / "s")


def test_a_checkpoint_of_shards_is_one_checkpoint(tmp_path):
    ck = tmp_path / "model"
    ck.mkdir()
    for i in (1, 2):
        (ck / f"model-0000{i}-of-00002.safetensors").write_bytes(b"x")
    assert [c.name for c in series.checkpoints(ck)] == ["model"]  # shards are not steps


# ---------------------------------------------------------------- round trip and chain
def test_run_round_trips_every_member_with_its_chain(run, tmp_path):
    s = brevis.compress_run(run, tmp_path / "run.brv.d", keyframe_every=3)
    assert [w["name"] for w in s["written"]] == [f"checkpoint-{k}" for k in (*STEPS, 100)]
    assert [w["keyframe"] for w in s["written"]] == [True, False, False, True]
    assert [w["predecessors"] for w in s["written"]] == [0, 1, 2, 0]
    for w in s["written"]:
        out = tmp_path / f"out-{w['name']}"
        brevis.decompress(w["archive"], out)
        assert same_tree(out, run / w["name"]), w["name"]
        assert brevis.verify(w["archive"], [run / w["name"]])["ok"]
    r = brevis.inspect(tmp_path / "run.brv.d" / "checkpoint-75.brv")
    assert r["series"]["chain"] == ["checkpoint-25.brv", "checkpoint-50.brv", "checkpoint-75.brv"]
    assert r["series"]["previous"]["archive"] == "checkpoint-50.brv" and not r["base_required"]
    assert r["series"]["chain_original_bytes"] == sum(w["original_bytes"] for w in s["written"][:3])


def test_members_are_coded_against_their_predecessor_including_repeated_names(run, tmp_path):
    """optimizer.pt names one `exp_avg` per parameter: each is matched to
    its own predecessor (NAME#K), and decodes to the right bytes."""
    brevis.compress_run([run / "checkpoint-75", run / "checkpoint-100"], tmp_path / "r", keyframe_every=2)
    plain = brevis.compress([run / "checkpoint-100"], tmp_path / "alone.brv")
    member = tmp_path / "r" / "checkpoint-100.brv"
    r = brevis.inspect(member)
    assert r["archive_bytes"] < 0.75 * plain["archive_bytes"]
    opt = next(f for f in r["files"] if f["path"] == "optimizer.pt")
    coded = [s for s in opt["segments"] if s["programs"][0]["program"].startswith(("sub_base", "xor_base"))]
    assert len(coded) >= 2
    from brevis.archive.reader import ArchiveReader

    with ArchiveReader(member) as reader:
        refs = [s.base["name"] for f in reader.index.files for s in f.segments if s.base and f.path == "optimizer.pt"]
    assert refs and all("#" in n for n in refs), refs
    brevis.decompress(member, tmp_path / "out")
    assert same_tree(tmp_path / "out", run / "checkpoint-100")


def test_tensor_keys_number_repeated_names_only():
    from brevis.dtypes import lookup

    segs = [Segment(0, 4, n, lookup("F32"), (1,)) for n in ("exp_avg", "exp_avg_sq", "w", "exp_avg", "exp_avg_sq")]
    segs.insert(2, Segment(0, 4, "exp_avg"))  # bytes, not a tensor: not counted
    assert [tensor_keys(segs).get(id(s)) for s in segs] == [
        "exp_avg#0", "exp_avg_sq#0", None, "w", "exp_avg#1", "exp_avg_sq#1"]


def test_api_and_cli_reach_a_member(run, tmp_path):
    brevis.compress_run(run, tmp_path / "r", keyframe_every=4)
    member = tmp_path / "r" / "checkpoint-100.brv"
    with brevis.open(member) as a:
        names = a.keys()
        assert "head.weight" in names
    want = np.frombuffer((run / "checkpoint-100" / "model.safetensors").read_bytes()[-1536:], np.uint8)
    with brevis.safe_open(member, framework="np") as f:
        got = f.get_tensor("head.weight")
    assert np.asarray(got).view(np.uint8).tobytes() == want.tobytes()
    assert brevis.ls(member)["file_count"] == 3
    brevis.extract(member, ["head.weight"], tmp_path / "x.safetensors")
    assert (tmp_path / "x.safetensors").exists()
    r = cli("inspect", member)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "coded against checkpoint-75.brv" in out
    assert "decoding it reads 4 archives: checkpoint-25.brv -> checkpoint-50.brv -> checkpoint-75.brv" in out
    listing = json.loads(cli("inspect", "--json", tmp_path / "r").stdout)
    assert [m["archive"] for m in listing["members"]] == [f"checkpoint-{k}.brv" for k in (*STEPS, 100)]
    assert [m["previous"] for m in listing["members"]] == [None, "checkpoint-25.brv", "checkpoint-50.brv",
                                                          "checkpoint-75.brv"]


def test_cli_compress_run_default_output_and_json(run):
    (run / "config.json").write_text("{}")  # beside the checkpoints: not one, and said so
    r = cli("compress-run", run, "-k", "2")
    assert r.returncode == 0, r.stderr
    assert f"brevis: skipped {run / 'config.json'}: its name tells no step" in r.stderr
    shutil.rmtree(run.parent / "run.brv.d")
    r = cli("compress-run", run, "-k", "2", "--json")
    assert r.returncode == 0, r.stderr
    s = json.loads(r.stdout)
    assert s["skipped"] == [{"path": str(run / "config.json"), "kind": "not a checkpoint",
                             "reason": "its name tells no step"}]
    assert s["output"] == str(run.parent / "run.brv.d") and s["member_count"] == 4
    assert [w["keyframe"] for w in s["written"]] == [True, False, True, False]


# ---------------------------------------------------------------- appending
def test_appending_writes_only_the_new_checkpoints(run, tmp_path):
    out = tmp_path / "r"
    brevis.compress_run([run / f"checkpoint-{k}" for k in STEPS[:2]], out, keyframe_every=4)
    before = {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in out.iterdir()}
    s = brevis.compress_run(run, out, keyframe_every=4)  # the whole run again: two kept, two new
    assert s["kept"] == ["checkpoint-25.brv", "checkpoint-50.brv"]
    assert [w["name"] for w in s["written"]] == ["checkpoint-75", "checkpoint-100"]
    for name, (data, mtime) in before.items():
        assert (out / name).read_bytes() == data and (out / name).stat().st_mtime_ns == mtime
    assert series.member(out / "checkpoint-75.brv").series["previous"]["archive"] == "checkpoint-50.brv"
    brevis.decompress(out / "checkpoint-100.brv", tmp_path / "o")
    assert same_tree(tmp_path / "o", run / "checkpoint-100")


def test_appending_without_the_earlier_sources(run, tmp_path):
    """The last member is then the base, decoded from its archive and its chain."""
    out = tmp_path / "r"
    brevis.compress_run([run / f"checkpoint-{k}" for k in STEPS], out, keyframe_every=4)
    brevis.compress_run([run / "checkpoint-100"], out, keyframe_every=4)
    assert series.member(out / "checkpoint-100.brv").needs_base
    brevis.decompress(out / "checkpoint-100.brv", tmp_path / "o")
    assert same_tree(tmp_path / "o", run / "checkpoint-100")


def test_a_run_is_only_appended_to(run, tmp_path):
    out = tmp_path / "r"
    brevis.compress_run([run / "checkpoint-50", run / "checkpoint-75"], out)
    with pytest.raises(InvalidArgument, match="checkpoint-25 does not come after checkpoint-75.*only appended"):
        brevis.compress_run([run / "checkpoint-25"], out)


def test_an_archived_checkpoint_changed_since_is_refused(run, tmp_path):
    out = tmp_path / "r"
    brevis.compress_run([run / "checkpoint-25", run / "checkpoint-50"], out, keyframe_every=4)
    nudge(run / "checkpoint-25", tmp_path / "changed" / "checkpoint-50", seed=9)
    with pytest.raises(InvalidArgument, match="differs from checkpoint-50.brv.*never rewritten"):
        brevis.compress_run([tmp_path / "changed" / "checkpoint-50", run / "checkpoint-75"], out, keyframe_every=4)


# ---------------------------------------------------------------- safety
def test_a_missing_predecessor_is_refused(run, tmp_path):
    out = tmp_path / "r"
    brevis.compress_run(run, out, keyframe_every=4)
    (out / "checkpoint-50.brv").unlink()
    with pytest.raises(BaseRequired, match="coded against checkpoint-50.brv.*not in"):
        brevis.decompress(out / "checkpoint-75.brv", tmp_path / "o")
    assert not (tmp_path / "o").exists()
    r = cli("decompress", out / "checkpoint-100.brv", "-o", tmp_path / "o")
    assert r.returncode == 2
    assert "checkpoint-50.brv, the checkpoint before it in its run, which is not in" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    assert brevis.inspect(out / "checkpoint-100.brv")["series"]["chain_error"]


def test_a_wrong_predecessor_is_refused(run, tmp_path):
    out = tmp_path / "r"
    brevis.compress_run(run, out, keyframe_every=4)
    shutil.copy(out / "checkpoint-25.brv", out / "checkpoint-50.brv")  # another member in its place
    with pytest.raises(ChecksumError, match="not the checkpoint checkpoint-75.brv was coded against"):
        brevis.decompress(out / "checkpoint-75.brv", tmp_path / "o")
    (out / "checkpoint-50.brv").write_bytes(b"not an archive at all")
    with pytest.raises(FormatError, match="is not an archive"):
        brevis.decompress(out / "checkpoint-75.brv", tmp_path / "o")


def test_a_damaged_predecessor_is_refused(run, tmp_path):
    out = tmp_path / "r"
    brevis.compress_run(run, out, keyframe_every=4)
    from brevis.archive.reader import ArchiveReader

    with ArchiveReader(out / "checkpoint-50.brv") as reader:  # the stream of a tensor checkpoint-75 reads
        seg = next(s for f in reader.index.files for s in f.segments if s.name.endswith("query.weight"))
        offset = seg.chunks[0].streams[0][0]
    data = bytearray((out / "checkpoint-50.brv").read_bytes())
    data[offset] ^= 0xFF
    (out / "checkpoint-50.brv").write_bytes(bytes(data))
    with pytest.raises(ChecksumError):
        brevis.decompress(out / "checkpoint-75.brv", tmp_path / "o")
    assert not (tmp_path / "o").exists()
    assert not brevis.verify(out / "checkpoint-75.brv")["ok"]


def test_a_run_whose_predecessors_loop_is_refused(run, tmp_path):
    """A crafted member that names itself as its predecessor."""
    from brevis.codec.base_model import Base
    from brevis.codec.encoder import compress

    out = tmp_path / "r"
    out.mkdir()
    base = Base.open(run / "checkpoint-75")
    content = series.content_identity(base)
    me = {"name": "checkpoint-100", "position": 0, "step": 100, "content": content,
          "previous": {"archive": "checkpoint-100.brv", "content": content}}
    compress([run / "checkpoint-100"], out / "checkpoint-100.brv", base=base, series=me)
    base.close()
    with pytest.raises(FormatError, match="go round in a loop"):
        brevis.decompress(out / "checkpoint-100.brv", tmp_path / "o")
    with pytest.raises(FormatError, match="go round in a loop"):
        series.chain(out / "checkpoint-100.brv")


# ---------------------------------------------------------------- removing
def test_removing_a_checkpoint_rekeys_the_one_after_it(run, tmp_path):
    out = tmp_path / "r"
    brevis.compress_run(run, out, keyframe_every=4)
    kept = (out / "checkpoint-100.brv").read_bytes()
    r = cli("remove-checkpoint", out, "checkpoint-50")
    assert r.returncode == 0, r.stderr
    assert "removed checkpoint-50.brv; checkpoint-75.brv re-coded without it" in r.stdout
    assert not (out / "checkpoint-50.brv").exists()
    assert series.member(out / "checkpoint-75.brv").series["previous"]["archive"] == "checkpoint-25.brv"
    assert (out / "checkpoint-100.brv").read_bytes() == kept  # untouched, and still decodes
    for k in (75, 100):
        brevis.decompress(out / f"checkpoint-{k}.brv", tmp_path / f"o{k}")
        assert same_tree(tmp_path / f"o{k}", run / f"checkpoint-{k}")
    assert sorted(p.name for p in out.iterdir()) == ["checkpoint-100.brv", "checkpoint-25.brv", "checkpoint-75.brv"]
    s = brevis.remove_checkpoint(out, "checkpoint-25")  # a keyframe: the next becomes one
    assert s["recoded"] == "checkpoint-75.brv" and series.member(out / "checkpoint-75.brv").keyframe
    brevis.decompress(out / "checkpoint-100.brv", tmp_path / "o100b")
    assert same_tree(tmp_path / "o100b", run / "checkpoint-100")


# ---------------------------------------------------------------- fleets
@pytest.mark.parametrize("engine", ["processes", pytest.param("dask", marks=pytest.mark.skipif(
    not fleet.dask_available(), reason="Dask (distributed) is not installed"))])
def test_a_fleet_of_runs(run, tmp_path, engine):
    runs = tmp_path / "runs"
    runs.mkdir()
    shutil.copytree(run, runs / "a")
    shutil.copytree(run, runs / "b")
    s = fleet.compress_runs([runs / "a", runs / "b"], tmp_path / "fleet", engine=engine, workers=2,
                            keyframe_every=2)
    assert s["engine"] == engine
    assert s["ok"] and s["compressed"] == 2
    assert sorted(p.name for p in (tmp_path / "fleet").iterdir()) == ["a.brv.d", "b.brv.d"]
    assert series.member(tmp_path / "fleet" / "b.brv.d" / "checkpoint-50.brv").series["previous"] is not None
    brevis.decompress(tmp_path / "fleet" / "a.brv.d" / "checkpoint-100.brv", tmp_path / "o")
    assert same_tree(tmp_path / "o", run / "checkpoint-100")
    again = fleet.compress_runs([runs / "a"], tmp_path / "fleet", engine=engine, workers=1)
    assert again["skipped"] == 1 and again["runs"][0]["kept"] == 4


def test_members_decode_in_worker_processes(run, tmp_path):
    """Each worker finds the member's predecessors itself, as the main process does."""
    from brevis.archive.reader import ArchiveReader
    from brevis.codec.chunks import workers_may_decode

    brevis.compress_run(run, tmp_path / "r", keyframe_every=4)
    with ArchiveReader(tmp_path / "r" / "checkpoint-100.brv") as reader:
        assert workers_may_decode(reader.index)
    brevis.decompress(tmp_path / "r" / "checkpoint-100.brv", tmp_path / "o", threads=2, processes=True)
    assert same_tree(tmp_path / "o", run / "checkpoint-100")
    assert brevis.verify(tmp_path / "r" / "checkpoint-100.brv", [run / "checkpoint-100"], threads=2,
                         processes=True)["ok"]


def test_a_whole_run_back_all_or_nothing(run, tmp_path):
    out = tmp_path / "r.brv.d"
    brevis.compress_run(run, out, keyframe_every=4)
    s = brevis.decompress_run(out)
    assert s["output"] == str(tmp_path / "r") and s["member_count"] == 4
    assert same_tree(tmp_path / "r", run)
    with pytest.raises(OutputExists):
        brevis.decompress_run(out)
    r = cli("decompress", out, "-o", tmp_path / "again")
    assert r.returncode == 0, r.stderr
    assert same_tree(tmp_path / "again", run) and "4 checkpoints" in r.stdout
    assert brevis.verify_run(out, run)["ok"]
    r = cli("verify", out, "--source", run)
    assert r.returncode == 0 and "OK, 4 checkpoints match the source" in r.stdout
    (out / "checkpoint-50.brv").unlink()  # the third and fourth cannot decode now: nothing is written
    with pytest.raises(BaseRequired):
        brevis.decompress_run(out, tmp_path / "none")
    assert not (tmp_path / "none").exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_names_read_from_an_index_are_never_paths(run, tmp_path):
    """A checkpoint's name in the index must be a plain name (the writer
    checks with the reader's parser); decompress_run names its outputs
    after the archives' own file names anyway."""
    from brevis.codec.encoder import compress

    for name, why in (("../outside", "unsafe path"), ("a/b", "must be a file or folder name")):
        record = {"name": name, "position": 0, "step": None, "content": "0" * 32, "previous": None}
        with pytest.raises(brevis.BrevisError, match=f"readers would refuse it .*{why}"):
            compress([run / "checkpoint-25"], tmp_path / "x.brv", series=record)
        assert not (tmp_path / "x.brv").exists()
    out = tmp_path / "r.brv.d"
    brevis.compress_run([run / "checkpoint-25"], out)
    os.rename(out / "checkpoint-25.brv", out / "renamed.brv")
    brevis.decompress_run(out, tmp_path / "back")
    assert sorted(p.name for p in (tmp_path / "back").iterdir()) == ["renamed"]


def test_a_run_learns_one_prior_per_kind_of_member(run, tmp_path):
    """Keyframes share the prior learned on the first keyframe, coded
    members the one learned on the first coded member."""
    from brevis.archive.reader import ArchiveReader

    s = brevis.compress_run(run, tmp_path / "r", keyframe_every=2)
    priors = []
    for w in s["written"]:
        with ArchiveReader(w["archive"]) as reader:
            priors.append(json.dumps(reader.index.prior, sort_keys=True))
    assert [w["keyframe"] for w in s["written"]] == [True, False, True, False]
    assert priors[0] == priors[2] and priors[1] == priors[3] and priors[0] != priors[1]
