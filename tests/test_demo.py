"""The README's first command, scripts/demo, runs end to end."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.skipif(not (ROOT / ".venv" / "bin" / "python").exists(),
                    reason="scripts/demo uses .venv, which scripts/test creates")
def test_demo_script():
    r = subprocess.run([str(ROOT / "scripts" / "demo")], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "OK, 3 files match the source" in r.stdout
    assert "decompressed files are identical to examples/taesd" in r.stdout
