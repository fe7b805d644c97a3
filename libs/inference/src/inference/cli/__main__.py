"""``python -m inference.cli``: the ``inference`` command."""

from __future__ import annotations

import sys

from inference.cli import main

sys.exit(main())
