"""Build (or find in the cache) the tiny Qwen2 and Llama test models and print their paths.

Usage:
    .venv/bin/python scripts/build_test_models.py [--cache-dir DIR]

The default cache is ``$INFERENCE_TEST_MODELS_DIR`` or ``~/.cache/inference-adapters/test-models``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--cache-dir",
        type=Path,
        default=None,
        help="cache root (default: $INFERENCE_TEST_MODELS_DIR or ~/.cache/inference-adapters/test-models)",
    )
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    from inference.testing.tiny_models import build_tiny_models

    started = time.perf_counter()
    models = build_tiny_models(args.cache_dir)
    elapsed = time.perf_counter() - started
    for arch, model in models.items():
        print(f"{arch}:")
        print(f"  hf_dir:    {model.hf_dir}")
        print(f"  gguf_path: {model.gguf_path}")
        for name, path in model.adapter_dirs.items():
            print(f"  adapter {name}: {path}")
    print(f"ready in {elapsed:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
