"""The converted-adapter cache is bounded: least recently used entries go first, entries in use stay.

Before, the cache was never pruned: a hypernetwork run that loads, scores and unloads hundreds of generated
adapters left one GGUF per adapter behind (160 MiB each for rank 16 on every linear layer of an 8B Llama).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("llama_cpp")

from inference import LlamaCppProvider
from inference.adapters.gguf import convert_peft_to_gguf_cached
from inference.exceptions import ConfigurationError
from inference.testing.random_lora import write_random_peft_lora
from inference.testing.tiny_models import TinyModel

pytestmark = [
    pytest.mark.integration,
    pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning"),
]

BOUND = "INFERENCE_ADAPTER_CACHE_MAX_BYTES"


def _adapters(model: TinyModel, root: Path, count: int) -> list[Path]:
    """``count`` different PEFT adapters of ``model`` (each converts to a file of the same size)."""
    return [write_random_peft_lora(model.gguf_path, root / f"generated-{index}", seed=index) for index in range(count)]


async def _greedy(provider: LlamaCppProvider, adapter_id: str | None) -> str:
    return (await provider.generate("Once", model="tiny", adapter_id=adapter_id, max_tokens=4, temperature=0)).text


def _entries(cache: Path) -> set[str]:
    return {path.name.rsplit("-", 1)[0] for path in cache.glob("*.gguf")}


def test_the_cache_stays_within_its_bound_dropping_the_least_recently_used(
    tiny_models: dict[str, TinyModel], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = tiny_models["qwen2"]
    cache = tmp_path / "cache"
    adapters = _adapters(model, tmp_path, 5)
    size = convert_peft_to_gguf_cached(adapters[0], model.gguf_path, cache).stat().st_size
    monkeypatch.setenv(BOUND, str(3 * size))  # room for three
    for adapter in adapters[1:3]:
        convert_peft_to_gguf_cached(adapter, model.gguf_path, cache)
    convert_peft_to_gguf_cached(adapters[0], model.gguf_path, cache)  # used again: now the most recent
    for adapter in adapters[3:]:
        convert_peft_to_gguf_cached(adapter, model.gguf_path, cache)
    assert sum(path.stat().st_size for path in cache.glob("*.gguf")) <= 3 * size
    assert _entries(cache) == {"generated-0", "generated-3", "generated-4"}
    assert len(list(cache.glob("*.used"))) == 3  # one stamp of last use per entry, none outlives its entry
    # A removed entry converts again on its next use.
    again = convert_peft_to_gguf_cached(adapters[1], model.gguf_path, cache)
    assert again.is_file() and "generated-1" in _entries(cache)


def test_an_adapter_bigger_than_the_bound_is_still_converted_and_kept_until_the_next(
    tiny_models: dict[str, TinyModel], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = tiny_models["qwen2"]
    cache = tmp_path / "cache"
    monkeypatch.setenv(BOUND, "0")
    first, second = _adapters(model, tmp_path, 2)
    converted = convert_peft_to_gguf_cached(first, model.gguf_path, cache)
    assert converted.is_file()
    convert_peft_to_gguf_cached(second, model.gguf_path, cache)
    assert _entries(cache) == {"generated-1"}
    assert convert_peft_to_gguf_cached(first, model.gguf_path, cache, max_bytes=10**9).is_file()
    assert _entries(cache) == {"generated-0", "generated-1"}  # an explicit bound wins over the variable


def test_a_bad_bound_is_a_configuration_error_naming_the_variable(
    tiny_models: dict[str, TinyModel], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = tiny_models["qwen2"]
    monkeypatch.setenv(BOUND, "5GB")
    with pytest.raises(ConfigurationError, match=BOUND):
        convert_peft_to_gguf_cached(model.adapter_dirs["a0"], model.gguf_path, tmp_path / "cache")
    with pytest.raises(ConfigurationError, match="adapter_cache_max_bytes"):
        convert_peft_to_gguf_cached(model.adapter_dirs["a0"], model.gguf_path, tmp_path / "cache", max_bytes=-1)


async def test_a_loaded_adapters_file_is_kept_while_loaded_and_pruned_after_unload(
    tiny_models: dict[str, TinyModel], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Reload mode reads a loaded adapter's file again at each switch: pruning it would break the next request."""
    model = tiny_models["qwen2"]
    cache = tmp_path / "cache"
    monkeypatch.setenv(BOUND, "0")
    others = _adapters(model, tmp_path, 2)
    options: dict[str, Any] = {"n_ctx": 128, "adapter_cache_dir": cache, "kv_cache_type": "f32", "hot_swap": False}
    async with LlamaCppProvider(model.gguf_path, **options) as provider:
        await provider.load_adapter("a0", model.adapter_dirs["a0"])
        reference = await _greedy(provider, "a0")
        await _greedy(provider, None)  # switched away: the next a0 request rebuilds the model from its file
        for adapter in others:
            convert_peft_to_gguf_cached(adapter, model.gguf_path, cache)
        assert "a0" in _entries(cache)
        assert await _greedy(provider, "a0") == reference
        await provider.unload_adapter("a0")
        convert_peft_to_gguf_cached(others[1], model.gguf_path, cache)  # a hit: nothing written, nothing pruned
        assert "a0" in _entries(cache)
        convert_peft_to_gguf_cached(model.adapter_dirs["a1"], model.gguf_path, cache)
        assert _entries(cache) == {"a1"}


def test_an_entry_pinned_by_another_process_is_kept_and_clearing_by_hand_removes_the_rest(
    tiny_models: dict[str, TinyModel], tmp_path: Path
) -> None:
    from inference.adapters.gguf import clear_adapter_cache  # new: imported here, so the other tests run on old code

    model = tiny_models["qwen2"]
    cache = tmp_path / "cache"
    pinned, other = (convert_peft_to_gguf_cached(adapter, model.gguf_path, cache) for adapter in _adapters(
        model, tmp_path, 2))
    other_size = other.stat().st_size
    (cache / "test-models").mkdir()  # what else lives in ~/.cache/inference-adapters stays
    with subprocess.Popen(
        [sys.executable, "-c", "import sys; from inference.adapters.gguf_cache import pin_entry; "
         "pin = pin_entry(sys.argv[1]); print('pinned', flush=True); sys.stdin.read()", str(pinned)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    ) as holder:
        assert holder.stdout is not None and holder.stdout.readline() == "pinned\n"
        cleared = clear_adapter_cache(cache)
        assert (cleared.removed, cleared.kept_in_use) == (1, 1)
        assert cleared.removed_bytes == other_size
        assert pinned.is_file() and not other.exists()
        assert holder.stdin is not None
        holder.stdin.close()
        assert holder.wait() == 0
    assert clear_adapter_cache(cache).removed == 1
    assert [path.name for path in cache.iterdir()] == ["test-models"]


def test_an_entry_removed_by_another_process_is_converted_again(
    tiny_models: dict[str, TinyModel], tmp_path: Path
) -> None:
    model = tiny_models["qwen2"]
    cache = tmp_path / "cache"
    converted = convert_peft_to_gguf_cached(model.adapter_dirs["a0"], model.gguf_path, cache)
    converted.unlink()  # as a prune or `rm` elsewhere would
    assert convert_peft_to_gguf_cached(model.adapter_dirs["a0"], model.gguf_path, cache) == converted
    assert converted.is_file()


def test_a_conversion_that_ends_after_the_provider_closed_pins_nothing(
    tiny_models: dict[str, TinyModel], tmp_path: Path
) -> None:
    """A load_adapter's conversion runs in a helper thread; a provider closed meanwhile released every pin, and the
    pin the conversion then took was kept (an open descriptor and a shared lock) until the model was collected: the
    entry could not be pruned or cleared."""
    from inference.adapters.gguf import clear_adapter_cache

    model = tiny_models["qwen2"]
    cache = tmp_path / "cache"
    provider = LlamaCppProvider(model.gguf_path, adapter_cache_dir=cache, n_ctx=128)
    provider._model.close()  # as aclose() does, while the conversion below was still running
    converted = provider._model.convert_peft(Path(model.adapter_dirs["a0"]), model.gguf_path, cache)
    assert converted.is_file()
    assert (clear_adapter_cache(cache).kept_in_use, converted.exists()) == (0, False)


def test_the_temporary_files_of_conversions_killed_half_way_are_removed_and_running_ones_kept(
    tiny_models: dict[str, TinyModel], tmp_path: Path
) -> None:
    """A conversion writes a temporary file beside its entry and renames it into place when whole; one killed
    half-way (kill -9, a full disk) left that file in the cache for ever."""
    import os
    import tempfile

    model = tiny_models["qwen2"]
    cache = tmp_path / "cache"
    first, second = _adapters(model, tmp_path, 2)
    entry = convert_peft_to_gguf_cached(first, model.gguf_path, cache)
    left, running = (Path(tempfile.mkstemp(prefix=f".{entry.name}.", suffix=".tmp", dir=cache)[1]) for _ in range(2))
    two_hours_ago = left.stat().st_mtime - 7200
    os.utime(left, (two_hours_ago, two_hours_ago))
    convert_peft_to_gguf_cached(second, model.gguf_path, cache)  # every conversion tidies the cache
    assert not left.exists() and running.exists() and entry.exists()
