"""Rewrite .env.example from the settings table in inference/config.py."""

from __future__ import annotations

from pathlib import Path

from inference.config import render_env_example

if __name__ == "__main__":
    target = Path(__file__).resolve().parents[1] / ".env.example"
    target.write_text(render_env_example(), encoding="utf-8")
    print(f"wrote {target}")
