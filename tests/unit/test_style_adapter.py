"""The quickstart's style adapter: its cache key, its cache hit (no training), and the style check."""

from __future__ import annotations

from pathlib import Path

import pytest

from inference.exceptions import ConfigurationError
from inference.testing.style_adapter import (
    HELD_OUT_PROMPTS,
    TRAINING_EXAMPLES,
    StyleTraining,
    cached_style_adapter,
    shows_style,
)


@pytest.fixture
def base_gguf(tmp_path: Path) -> Path:
    path = tmp_path / "base.gguf"
    path.write_bytes(b"GGUF" + bytes(60))
    return path


def test_the_cache_key_follows_the_settings_but_not_the_thread_count(base_gguf: Path) -> None:
    default = StyleTraining()
    key = default.key(base_gguf)
    assert default.key(base_gguf) == StyleTraining(threads=1).key(base_gguf)
    assert default.key(base_gguf) != StyleTraining(steps=default.steps + 1).key(base_gguf)
    assert default.key(base_gguf) != StyleTraining(learning_rate=1e-4).key(base_gguf)
    base_gguf.write_bytes(b"GGUF" + bytes(61))  # another base model file
    assert default.key(base_gguf) != key


def test_a_cached_adapter_is_returned_without_training(base_gguf: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    cached = cache / f"pirate-{StyleTraining().key(base_gguf)}"
    cached.mkdir(parents=True)
    (cached / "adapter_config.json").write_text("{}")
    lines: list[str] = []
    assert cached_style_adapter(base_gguf, cache_dir=cache, log=lines.append) == cached
    assert lines == []  # nothing was loaded or trained


def test_a_missing_base_model_is_a_configuration_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="does not exist"):
        cached_style_adapter(tmp_path / "missing.gguf", cache_dir=tmp_path)


def test_shows_style_reads_the_opening() -> None:
    assert shows_style(" Arr, matey! The sea be calm. Yo ho ho!")
    assert shows_style("\n\narr, matey, a map")
    assert not shows_style("Hiking is a great way to get away")


def test_held_out_prompts_are_not_training_prompts() -> None:
    assert not set(HELD_OUT_PROMPTS) & {prompt for prompt, _ in TRAINING_EXAMPLES}
