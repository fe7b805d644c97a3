"""Rewrite .env.example and the table in docs/configuration.md from the settings in inference/registry.py."""

from __future__ import annotations

import re
from pathlib import Path

from inference.config import render_configuration_table, render_env_example

ROOT = Path(__file__).resolve().parents[1]
TABLE = re.compile(r"<!-- settings-table -->\n.*?<!-- /settings-table -->\n", re.S)

if __name__ == "__main__":
    (ROOT / ".env.example").write_text(render_env_example(), encoding="utf-8")
    docs = ROOT / "docs" / "configuration.md"
    table = f"<!-- settings-table -->\n{render_configuration_table()}<!-- /settings-table -->\n"
    docs.write_text(TABLE.sub(lambda _: table, docs.read_text(encoding="utf-8")), encoding="utf-8")
    print(f"wrote {ROOT / '.env.example'} and the table in {docs}")
