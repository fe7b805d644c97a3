"""AdapterWeights: checked like a directory, written to a private PEFT directory, removed when no longer used."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from inference import AdapterWeights
from inference.adapters.peft import read_peft_adapter
from inference.adapters.source import AdapterSource
from inference.exceptions import AdapterAlreadyLoadedError, InvalidAdapterError
from inference.fake_provider import FakeProvider

PREFIX = "base_model.model.model.layers.0.self_attn"
CONFIG = {"peft_type": "LORA", "r": 2, "lora_alpha": 4, "target_modules": ["q_proj", "v_proj"]}


def tensors(rank: int = 2, **changes: Any) -> dict[str, Any]:
    rng = np.random.default_rng(0)
    found: dict[str, Any] = {}
    for module in ("q_proj", "v_proj"):
        found[f"{PREFIX}.{module}.lora_A.weight"] = rng.standard_normal((rank, 8)).astype("float32")
        found[f"{PREFIX}.{module}.lora_B.weight"] = rng.standard_normal((8, rank)).astype("float32")
    found.update(changes)
    return {name: value for name, value in found.items() if value is not None}


class RecordingProvider(FakeProvider):
    """A fake that reads what it is given as a PEFT directory, as the real path-taking backends do."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: dict[str, Path] = {}

    async def _load_adapter(self, adapter_id: str, source: AdapterSource) -> None:
        adapter_path = source.path
        adapter = read_peft_adapter(adapter_path, provider=self.name)
        self.seen[adapter_id] = adapter.path
        await super()._load_adapter(adapter_id, source)


async def test_weights_load_from_a_private_peft_directory_that_unload_removes() -> None:
    provider = RecordingProvider()
    await provider.load_adapter("step-1", AdapterWeights(tensors(), CONFIG))
    directory = provider.seen["step-1"]
    assert json.loads((directory / "adapter_config.json").read_text())["r"] == 2
    assert (directory / "adapter_model.safetensors").is_file()
    assert (await provider.generate("hi", model="m", adapter_id="step-1")).adapter_id == "step-1"

    await provider.unload_adapter("step-1")
    assert not directory.exists()


async def test_replacing_weights_removes_the_old_directory_and_each_weights_object_is_new_weights() -> None:
    provider = RecordingProvider()
    await provider.load_adapter("live", AdapterWeights(tensors(), CONFIG))
    first = provider.seen["live"]
    with pytest.raises(AdapterAlreadyLoadedError):
        await provider.load_adapter("live", AdapterWeights(tensors(), CONFIG))
    await provider.load_adapter("live", AdapterWeights(tensors(), CONFIG), replace=True)
    second = provider.seen["live@2"]
    assert not first.exists() and second.exists()
    assert len(list(second.parent.glob("inference-adapter-*"))) >= 1
    assert provider.adapter_stats().get("live").replacements == 1  # type: ignore[union-attr]
    await provider.unload_adapter("live")
    assert not second.exists()


@pytest.mark.parametrize(
    ("weights", "message"),
    [
        (AdapterWeights(tensors(), {**CONFIG, "use_dora": True}), "DoRA"),
        (AdapterWeights(tensors(), {**CONFIG, "r": 0}), "invalid rank"),
        (AdapterWeights(tensors(), "not a config"), "LoraConfig or a dict"),
        (AdapterWeights({}, CONFIG), "no tensors"),
        (AdapterWeights(tensors(rank=3), CONFIG), "with rank 2"),
        (AdapterWeights(tensors(**{f"{PREFIX}.q_proj.lora_B.weight": None}), CONFIG), "q_proj.lora_B.weight"),
        (AdapterWeights(tensors(**{"model.embed_tokens.weight": np.zeros((4, 4))}), CONFIG), "not a LoRA matrix"),
        (
            AdapterWeights(
                tensors(
                    **{
                        f"{PREFIX}.k_proj.lora_A.weight": np.zeros((2, 8)),
                        f"{PREFIX}.k_proj.lora_B.weight": np.zeros((8, 2)),
                    }
                ),
                CONFIG,
            ),
            "target_modules",
        ),
        (AdapterWeights(tensors(**{f"{PREFIX}.q_proj.lora_A.weight": np.full((2, 8), np.nan)}), CONFIG), "NaN"),
        # values, dtypes and objects no backend can compute with
        (AdapterWeights(tensors(**{f"{PREFIX}.q_proj.lora_A.weight": np.full((2, 8), 1e39)}), CONFIG),
         "beyond float32's range"),
        (AdapterWeights(tensors(**{f"{PREFIX}.q_proj.lora_A.weight": np.ones((2, 8), "int64")}), CONFIG),
         "of dtype int64: LoRA matrices are floating point"),
        (AdapterWeights(tensors(**{f"{PREFIX}.q_proj.lora_A.weight": np.ones((2, 8), "complex64")}), CONFIG),
         "of dtype complex64"),
        (AdapterWeights(tensors(**{f"{PREFIX}.q_proj.lora_A.weight": np.full((2, 8), object())}), CONFIG),
         "of dtype object"),
        (AdapterWeights(tensors(**{f"{PREFIX}.q_proj.lora_A.weight": [[0.0] * 8] * 2}), CONFIG),
         "as a list: give a torch tensor or a numpy array"),
        # config numbers and patterns
        (AdapterWeights(tensors(), {**CONFIG, "lora_alpha": 1e39}), "float32 can hold"),
        (AdapterWeights(tensors(), {**CONFIG, "r": 2**40}), "with rank 1099511627776 \\(its r\\)"),
        (AdapterWeights(tensors(), {**CONFIG, "rank_pattern": {"q_proj": 4}}), "rank_pattern\\['q_proj'\\]"),
        (AdapterWeights(tensors(), {**CONFIG, "rank_pattern": {"(q_proj": 2}}), "not a valid regular expression"),
        (AdapterWeights(tensors(), {**CONFIG, "alpha_pattern": {"q_proj": "big"}}), "alpha_pattern\\['q_proj'\\]"),
        (AdapterWeights(tensors(), {**CONFIG, "target_modules": r".*\.q_proj"}), "not among target_modules"),
        (AdapterWeights(tensors(), {**CONFIG, "layer_replication": [[0, 1], [0, 1]]}), "uses layer_replication \\("),
        # weights PEFT would ignore: for a module the config's exclude_modules or layers_to_transform leave out
        (AdapterWeights(tensors(), {**CONFIG, "exclude_modules": ["v_proj"]}),
         "v_proj, which is excluded by exclude_modules=\\[v_proj\\]"),
        (AdapterWeights(tensors(), {**CONFIG, "layers_to_transform": [1]}),
         "q_proj, which is in layer 0, which layers_to_transform=\\[1\\] leaves out"),
        # a config no adapter_config.json can hold (a TypeError from json.dumps at save)
        (AdapterWeights(tensors(), {**CONFIG, "task_type": object()}), "holds a value that is not JSON"),
    ],
)
async def test_bad_weights_are_refused_before_the_backend_and_the_provider_keeps_serving(
    weights: AdapterWeights, message: str, tmp_path: Path
) -> None:
    provider = RecordingProvider()
    await provider.load_adapter("live", AdapterWeights(tensors(), CONFIG))
    with pytest.raises(InvalidAdapterError, match=message):
        await provider.load_adapter("live", weights, replace=True)
    assert provider.seen.keys() == {"live"} and provider.seen["live"].exists()
    assert (await provider.generate("hi", model="m", adapter_id="live")).text.startswith("[live]")
    await provider.unload_adapter("live")


async def test_a_peft_lora_config_and_torch_tensors_are_accepted() -> None:
    torch = pytest.importorskip("torch")
    peft = pytest.importorskip("peft")
    config = peft.LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj", "v_proj"])
    provider = RecordingProvider()
    await provider.load_adapter(
        "t", AdapterWeights({name: torch.from_numpy(value) for name, value in tensors().items()}, config)
    )
    written = json.loads((provider.seen["t"] / "adapter_config.json").read_text())
    assert written["peft_type"] == "LORA" and sorted(written["target_modules"]) == ["q_proj", "v_proj"]
    await provider.aclose()


def test_import_inference_does_not_import_torch_or_numpy_for_adapter_weights() -> None:
    code = "import sys, inference; inference.AdapterWeights; print(sorted({'torch', 'numpy'} & set(sys.modules)))"
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )
    assert result.stdout.strip() == "[]"


async def test_concurrent_loads_of_weights_under_several_ids_keep_every_directory_they_need() -> None:
    import asyncio

    provider = RecordingProvider()
    await asyncio.gather(*(provider.load_adapter(f"id-{n}", AdapterWeights(tensors(), CONFIG)) for n in range(6)))
    await asyncio.gather(
        *(provider.load_adapter(f"id-{n}", AdapterWeights(tensors(), CONFIG), replace=True) for n in range(3)),
        provider.unload_adapter("id-5"),
    )
    live = {adapter_id: path for adapter_id, path in provider.seen.items() if adapter_id != "id-5"}
    for adapter_id in ("id-0", "id-1", "id-2"):
        del live[adapter_id]  # replaced: their first directories are gone
        assert not provider.seen[adapter_id].exists()
    assert all(path.exists() for path in live.values()) and len(live) == 5  # id-3, id-4 and the three id-N@2
    for n in range(5):
        assert (await provider.generate("hi", model="m", adapter_id=f"id-{n}")).adapter_id == f"id-{n}"


async def test_a_full_disk_names_the_weights_file_and_the_provider_goes_on(monkeypatch: pytest.MonkeyPatch) -> None:
    import safetensors.numpy
    from safetensors import SafetensorError

    from inference.exceptions import ConfigurationError

    def full(*args: object, **kwargs: object) -> None:  # what safetensors raises on a full disk (measured on tmpfs)
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    monkeypatch.setattr(safetensors.numpy, "save_file", full)
    provider = RecordingProvider()
    with pytest.raises(ConfigurationError, match=r"cannot write the adapter weights file .*adapter_model.safetensors: "
                       r".*No space left on device .*: check that .* is writable and has free space") as refused:
        await provider.load_adapter("step-1", AdapterWeights(tensors(), CONFIG))
    assert refused.value.path is not None and not Path(refused.value.path).parent.exists()  # nothing left behind
    monkeypatch.undo()
    await provider.load_adapter("step-1", AdapterWeights(tensors(), CONFIG))
    assert await provider.list_adapters() == ["step-1"]


class ReadingProvider(FakeProvider):
    """A fake that reads the weights at every backend load (evictions' reloads included), as a real backend does:
    from the directory written for it, or, with ``loads_adapter_weights_in_memory``, from what the base class kept."""

    def __init__(self, *, in_memory: bool) -> None:
        super().__init__(max_adapters=1)
        self.in_memory = in_memory
        self.read: list[dict[str, Any]] = []

    @property  # type: ignore[override]
    def loads_adapter_weights_in_memory(self) -> bool:  # an instance switch, for the test only
        return self.in_memory

    async def _load_adapter(self, adapter_id: str, source: AdapterSource) -> None:
        adapter_path = source.path
        kept = source.weights
        if kept is not None:
            self.read.append({name: np.array(value) for name, value in kept.tensors.items()})
        elif adapter_id.startswith("live"):
            from safetensors.numpy import load_file

            self.read.append(load_file(str(Path(adapter_path) / "adapter_model.safetensors")))
        await super()._load_adapter(adapter_id, source)


@pytest.mark.parametrize("in_memory", [True, False], ids=["kept-in-memory", "written-directory"])
@pytest.mark.parametrize("training_writes", ["a step", "NaN"])
async def test_an_adapter_keeps_the_weights_it_was_loaded_with_after_the_caller_changes_them(
    in_memory: bool, training_writes: str
) -> None:
    provider = ReadingProvider(in_memory=in_memory)
    live = tensors()  # the caller's arrays: a training loop changes them in place after the load
    original = {name: value.copy() for name, value in live.items()}
    await provider.load_adapter("live", AdapterWeights(live, CONFIG))
    for value in live.values():
        value += 0.5 if training_writes == "a step" else np.nan

    await provider.load_adapter("other", "/adapters/other")  # max_adapters=1: "live" is evicted
    assert provider.adapter_stats().get("live").state == "evicted"  # type: ignore[union-attr]
    assert (await provider.generate("hi", model="m", adapter_id="live")).adapter_id == "live"  # loaded again

    assert len(provider.read) == 2  # the first load and the reload after the eviction
    for read in provider.read:
        assert read.keys() == original.keys()
        for name, value in original.items():
            np.testing.assert_array_equal(read[name], value)


async def test_a_closed_provider_writes_nothing_and_vllm_offline_removes_its_directories_at_aclose(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import tempfile

    from inference.exceptions import ProviderError
    from inference.vllm_offline_provider import VLLMOfflineProvider

    class WithoutEngine(VLLMOfflineProvider):  # the lifecycle of the offline provider, with no vLLM engine
        async def _load_adapter(self, adapter_id: str, source: AdapterSource) -> None:
            adapter_path = source.path
            read_peft_adapter(adapter_path, provider=self.name)

        async def _unload_adapter(self, adapter_id: str) -> None:
            pass

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    provider = WithoutEngine(model_name="/models/none")
    await provider.load_adapter("step", AdapterWeights(tensors(), CONFIG))
    assert len(list(tmp_path.glob("inference-adapter-*"))) == 1
    await provider.aclose()
    assert list(tmp_path.iterdir()) == []  # it stayed until exit before
    with pytest.raises(ProviderError, match="closed"):
        await provider.load_adapter("step", AdapterWeights(tensors(), CONFIG), replace=True)
    assert list(tmp_path.iterdir()) == []


HOLDER = """
import asyncio, sys, tempfile
import numpy as np
tempfile.tempdir = sys.argv[1]
from inference import AdapterWeights
from inference.fake_provider import FakeProvider

async def main():
    provider = FakeProvider()
    tensors = {f"base_model.model.model.layers.0.self_attn.q_proj.lora_{side}.weight": np.ones(shape, "float32")
               for side, shape in (("A", (2, 8)), ("B", (8, 2)))}
    config = {"peft_type": "LORA", "r": 2, "lora_alpha": 4, "target_modules": ["q_proj"]}
    await provider.load_adapter("held", AdapterWeights(tensors, config))
    print(provider._adapter_path("held"), flush=True)
    sys.stdin.readline()  # held until the test says so, or kills this process

asyncio.run(main())
"""


def start_holder(directory: Path) -> tuple[subprocess.Popen[str], Path]:
    """A process that loads AdapterWeights into a fake provider and holds them; returns it and their directory."""
    process = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(directory)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )
    assert process.stdout is not None
    written = Path(process.stdout.readline().strip())
    assert written.is_dir() and written.parent == directory, written
    return process, written


@pytest.mark.skipif(os.name != "posix", reason="SIGKILL and pid checks are POSIX")
async def test_directories_of_a_killed_process_are_swept_by_the_next_provider(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import tempfile

    killed, abandoned = start_holder(tmp_path)
    alive, held = start_holder(tmp_path)
    killed.kill()  # SIGKILL: no clean-up of any kind runs in it
    killed.communicate()  # it is gone (and reaped), its pipes closed
    assert abandoned.is_dir()
    elsewhere = tmp_path / f"inference-adapter-00000000-{killed.pid}-xyz"  # another host's, in a shared directory
    elsewhere.mkdir()
    unrelated = tmp_path / "inference-adapter-legacy"  # no owner in its name: never touched
    unrelated.mkdir()

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    provider = FakeProvider()
    await provider.load_adapter("next", AdapterWeights(tensors(), CONFIG))  # its first write sweeps
    ours = Path(provider._adapter_path("next") or "")
    try:
        assert not abandoned.exists()
        assert held.is_dir() and elsewhere.is_dir() and unrelated.is_dir() and ours.is_dir()
    finally:
        assert alive.stdin is not None
        alive.communicate("\n")  # a clean exit removes its own directory
    assert not held.exists()
    await provider.unload_adapter("next")
    assert sorted(path.name for path in tmp_path.iterdir()) == sorted([elsewhere.name, unrelated.name])


def test_torch_tensors_of_other_dtypes_or_without_data_are_refused() -> None:
    torch = pytest.importorskip("torch")
    as_torch = {name: torch.from_numpy(value) for name, value in tensors().items()}
    name = f"{PREFIX}.q_proj.lora_A.weight"
    for bad, message in [
        (torch.empty((2, 8), device="meta"), "on torch's meta device"),
        (torch.ones((2, 8), dtype=torch.int32), "of dtype int32"),
        (torch.ones((2, 8), dtype=torch.bool), "of dtype bool"),
        (torch.full((2, 8), 1e39, dtype=torch.float64), "beyond float32's range"),
    ]:
        with pytest.raises(InvalidAdapterError, match=message) as caught:
            AdapterWeights({**as_torch, name: bad}, CONFIG).check(provider="fake")
        assert name in str(caught.value) and caught.value.provider == "fake"
    for dtype in (torch.float16, torch.bfloat16, torch.float64):  # floating point tensors of any width are fine
        AdapterWeights({key: value.to(dtype) for key, value in as_torch.items()}, CONFIG).check()


async def test_a_regex_target_string_is_accepted_as_peft_accepts_it() -> None:
    provider = RecordingProvider()
    await provider.load_adapter("re", AdapterWeights(tensors(), {**CONFIG, "target_modules": r".*\.(q_proj|v_proj)"}))
    written = json.loads((provider.seen["re"] / "adapter_config.json").read_text())
    assert written["target_modules"] == r".*\.(q_proj|v_proj)"
    all_linear = AdapterWeights(tensors(), {**CONFIG, "target_modules": "all-linear"})
    assert all_linear.check()["target_modules"] == "all-linear"


def test_a_deeply_nested_config_is_refused_with_a_sentence() -> None:
    nested: dict[str, Any] = {}
    for _ in range(100_000):
        nested = {"inner": nested}
    with pytest.raises(InvalidAdapterError, match="nested too deeply"):
        AdapterWeights(tensors(), {**CONFIG, "extra": nested}).check()


def test_a_refusal_lists_a_few_of_200_000_target_modules() -> None:
    targets = [f"module_{n}" for n in range(200_000)]
    weights = AdapterWeights(tensors(), {**CONFIG, "target_modules": targets})
    with pytest.raises(InvalidAdapterError) as caught:
        weights.check()
    message = str(caught.value)
    assert "module_0, module_1" in message and "and 199995 more" in message and len(message) < 600


async def test_a_load_cancelled_while_its_weights_are_written_leaves_no_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The writing thread cannot be stopped: what it writes is removed once written (it stayed until the process
    ended, through ``aclose``), and the provider goes on."""
    import asyncio
    import tempfile
    import threading

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    writing, go_on = threading.Event(), threading.Event()
    save = AdapterWeights.save

    def held_save(self: AdapterWeights, directory: Any, **options: Any) -> Path:
        writing.set()
        go_on.wait(10)
        return save(self, directory, **options)

    monkeypatch.setattr(AdapterWeights, "save", held_save)
    provider = RecordingProvider()
    load = asyncio.create_task(provider.load_adapter("step", AdapterWeights(tensors(), CONFIG)))
    while not writing.is_set():
        await asyncio.sleep(0.01)
    load.cancel()
    with pytest.raises(asyncio.CancelledError):
        await load
    go_on.set()
    for _ in range(200):  # the thread finishes its directory, which is then removed
        if not list(tmp_path.iterdir()):
            break
        await asyncio.sleep(0.01)
    assert list(tmp_path.iterdir()) == [] and await provider.list_adapters() == []
    monkeypatch.setattr(AdapterWeights, "save", save)
    await provider.load_adapter("step", AdapterWeights(tensors(), CONFIG))
    assert len(list(tmp_path.glob("inference-adapter-*"))) == 1


async def test_weights_under_a_taken_id_are_refused_in_words_the_caller_knows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No private directory in the message (the caller gave tensors, not paths); the fix is replace=True."""
    import tempfile

    private = tmp_path / "private"
    private.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(private))
    provider = RecordingProvider()
    await provider.load_adapter("live", AdapterWeights(tensors(), CONFIG))
    with pytest.raises(AdapterAlreadyLoadedError) as taken:
        await provider.load_adapter("live", AdapterWeights(tensors(), CONFIG))
    message = str(taken.value)
    assert "inference-adapter-" not in message and "from other weights" in message and "replace=True" in message
    directory = tmp_path / "adapter"
    AdapterWeights(tensors(), CONFIG).save(directory)
    await provider.load_adapter("disk", directory)
    with pytest.raises(AdapterAlreadyLoadedError, match=f"already loaded \\(from {directory}\\)"):
        await provider.load_adapter("disk", AdapterWeights(tensors(), CONFIG))
    assert sorted(await provider.list_adapters()) == ["disk", "live"]
    assert len(list(private.iterdir())) == 1  # the refused weights' directories are gone


def test_sparse_torch_tensors_are_refused_as_weights() -> None:
    """torch.isfinite has no sparse kernel: a NotImplementedError escaped instead of InvalidAdapterError."""
    torch = pytest.importorskip("torch")
    sparse = {name: torch.as_tensor(value).to_sparse() for name, value in tensors().items()}
    with pytest.raises(InvalidAdapterError, match="in torch's sparse_coo layout: pass dense tensors"):
        AdapterWeights(sparse, CONFIG).check()


async def test_numpy_and_torch_scalars_in_the_config_are_numbers() -> None:
    """A config built from computed values (np.float32 dropout, a 0-d tensor's alpha) loads as those numbers; the
    new JSON check refused them, and writing them failed with a bare TypeError before."""
    torch = pytest.importorskip("torch")
    config = {**CONFIG, "lora_dropout": np.float32(0.05), "lora_alpha": torch.tensor(4.0), "r": np.int64(2)}
    weights = AdapterWeights(tensors(), config)
    assert weights.check()["lora_alpha"] == 4.0 and weights.config_dict()["r"] == 2
    provider = RecordingProvider()
    await provider.load_adapter("computed", weights)
    written = json.loads((provider.seen["computed"] / "adapter_config.json").read_text())
    assert written["lora_dropout"] == pytest.approx(0.05) and written["r"] == 2
