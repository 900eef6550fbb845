#!/usr/bin/env python3
"""Coverage-guided fuzzing of the archive reader with atheris (libFuzzer).

    pip install atheris
    python scripts/fuzz_reader.py -max_total_time=600 -rss_limit_mb=4096 /tmp/brevis-corpus

An input is [mode][seed][payload]; the seeds are the archives of
tests/robustness/robust_util.Seeds:
  mode 0  payload is a whole archive (header, streams, index, footer)
  mode 1  payload is index JSON, sealed onto the seed's streams with a
          valid digest and footer (reaches the index validator)
  mode 2  payload replaces the seed's streams; the index's CRCs are
          recomputed (reaches the DSL decoders; only the chunk digests of
          the original bytes are left to catch damage)
The oracle (robust_util.check_archive): inspect, verify and decompress
raise nothing but BrevisError, agree with each other, leave nothing
behind, and never pass off wrong bytes as an archived file. A failure
raises, so libFuzzer saves the input as crash-*; copy it into
tests/robustness/regressions/ (test_robust_fuzz.py replays that folder).
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

import atheris

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "robustness"))

with atheris.instrument_imports(include=["brevis"]):
    import robust_util as u


def remove_dead_runs(parent: Path) -> None:
    """The work folders of earlier runs whose process is gone: libFuzzer ends
    the process with C's exit(), so a run never removes its own."""
    for folder in parent.glob("brevis-fuzz-*-*"):
        pid = folder.name.split("-")[2]
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(folder, ignore_errors=True)
        except PermissionError:  # alive, another user's
            pass


TMP = Path("/dev/shm") if os.path.isdir("/dev/shm") else Path(tempfile.gettempdir())
remove_dead_runs(TMP)
WORK = Path(tempfile.mkdtemp(prefix=f"brevis-fuzz-{os.getpid()}-", dir=TMP))
SEEDS = u.Seeds(WORK / "seeds")
PARTS = [u.split(a) for a in SEEDS.archives]
RUN = WORK / "run"
RUN.mkdir()


def archive_of(data: bytes) -> tuple[bytes, bool]:
    """The archive an input stands for, and whether its output must be exact."""
    return u.archive_of(data, SEEDS.archives, PARTS)


def test_one_input(data: bytes) -> None:
    archive, exact = archive_of(data)
    u.check_archive(archive, SEEDS.trees, RUN, exact=exact)


HOSTILE = [0, 1, -1, 2**31, 2**32, 2**63, 2**64, -2**63, True, None, 0.5, "", "..", "/x", "a/../b",
           [], {}, [0, 0, 0], "raw", ["raw", {}], ["constant", {"value": 0}, []], "00" * 16]


def _nodes(obj, out):
    if isinstance(obj, dict):
        for k in list(obj):
            out.append((obj, k))
            _nodes(obj[k], out)
    elif isinstance(obj, list):
        for i in range(len(obj)):
            out.append((obj, i))
            _nodes(obj[i], out)
    return out


def custom_mutator(data: bytes, max_size: int, seed: int) -> bytes:
    """Index inputs (mode 1) that parse are mutated as JSON (a value replaced,
    dropped, duplicated or nudged); everything else by libFuzzer's mutators."""
    import random

    rng = random.Random(seed)
    if len(data) > 2 and data[0] % 3 == 1 and rng.random() < 0.7:
        try:
            index = json.loads(data[2:])
        except ValueError:
            index = None
        nodes = _nodes(index, []) if index is not None else []
        if nodes:
            for _ in range(rng.randint(1, 3)):
                container, key = rng.choice(nodes)
                action = rng.randrange(4)
                try:
                    if action == 0:  # a copy: a shared value mutated later could come to hold itself
                        container[key] = copy.deepcopy(rng.choice(HOSTILE))
                    elif action == 1:
                        del container[key]
                    elif action == 2 and isinstance(container, list):
                        container.insert(key, json.loads(json.dumps(container[key])))
                    elif type(container[key]) is int:
                        container[key] += rng.choice([-1, 1, 16, -16, 1 << 20])
                except (KeyError, IndexError, TypeError):
                    pass
                nodes = _nodes(index, [])
                if not nodes:
                    break
            out = data[:2] + json.dumps(index).encode()
            if len(out) <= max_size:
                return out
    return atheris.Mutate(data, max_size)


def write_corpus(folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for k, (archive, (head, index)) in enumerate(zip(SEEDS.archives, PARTS)):
        (folder / f"seed{k}-archive").write_bytes(bytes([0, k]) + archive)
        (folder / f"seed{k}-index").write_bytes(bytes([1, k]) + json.dumps(index).encode())
        (folder / f"seed{k}-streams").write_bytes(bytes([2, k]) + head)


def main() -> None:
    for arg in sys.argv[1:]:
        folder = Path(arg)
        if not arg.startswith("-") and (not folder.exists() or folder.is_dir() and not any(folder.iterdir())):
            write_corpus(folder)  # an empty corpus folder starts from the seeds
    atheris.Setup(sys.argv, test_one_input, custom_mutator=custom_mutator)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
