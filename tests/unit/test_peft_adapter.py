"""read_peft_adapter: what a valid PEFT LoRA directory yields, and each refusal with its sentence."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from inference.adapters.peft import PeftAdapter, read_peft_adapter
from inference.exceptions import InvalidAdapterError

VALID_CONFIG: dict[str, Any] = {
    "peft_type": "LORA",
    "r": 8,
    "lora_alpha": 16,
    "target_modules": ["v_proj", "q_proj"],
    "bias": "none",
    "use_dora": False,
    "modules_to_save": None,
    "base_model_name_or_path": "Qwen/Qwen2.5-0.5B",
}


def make_adapter(
    tmp_path: Path, config: Any = None, *, weights: str | None = "adapter_model.safetensors", **changes: Any
) -> Path:
    directory = tmp_path / "adapter"
    directory.mkdir()
    content = dict(VALID_CONFIG) if config is None else config
    if isinstance(content, dict):
        content.update(changes)
    (directory / "adapter_config.json").write_text(json.dumps(content), encoding="utf-8")
    if weights is not None:
        (directory / weights).write_bytes(b"\0" * 16)
    return directory


def refusal(path: Path, *, provider: str | None = None) -> InvalidAdapterError:
    with pytest.raises(InvalidAdapterError) as caught:
        read_peft_adapter(path, provider=provider)
    return caught.value


def test_a_valid_adapter_is_described(tmp_path: Path) -> None:
    directory = make_adapter(tmp_path)
    adapter = read_peft_adapter(directory)
    assert isinstance(adapter, PeftAdapter)
    assert adapter.path == directory
    assert adapter.weights_path == directory / "adapter_model.safetensors"
    assert (adapter.rank, adapter.alpha, adapter.scale) == (8, 16.0, 2.0)
    assert adapter.target_modules == ("q_proj", "v_proj")  # sorted
    assert adapter.base_model_name_or_path == "Qwen/Qwen2.5-0.5B"
    assert adapter.config["peft_type"] == "LORA"


def test_a_string_path_and_pytorch_weights_are_accepted(tmp_path: Path) -> None:
    directory = make_adapter(tmp_path, weights="adapter_model.bin", peft_type="lora")
    adapter = read_peft_adapter(str(directory))
    assert adapter.weights_path.name == "adapter_model.bin"


def test_safetensors_are_preferred_over_a_pickle(tmp_path: Path) -> None:
    directory = make_adapter(tmp_path)
    (directory / "adapter_model.bin").write_bytes(b"\0")
    assert read_peft_adapter(directory).weights_path.name == "adapter_model.safetensors"


def test_a_single_target_string_becomes_a_tuple(tmp_path: Path) -> None:
    adapter = read_peft_adapter(make_adapter(tmp_path, target_modules="q_proj"))
    assert adapter.target_modules == ("q_proj",)


def test_a_missing_alpha_defaults_to_peft_default_8(tmp_path: Path) -> None:
    config = {key: value for key, value in VALID_CONFIG.items() if key != "lora_alpha"}
    assert read_peft_adapter(make_adapter(tmp_path, config)).alpha == 8.0


def test_a_missing_directory_is_refused_with_provider_and_path(tmp_path: Path) -> None:
    error = refusal(tmp_path / "nowhere", provider="llamacpp")
    assert "does not exist" in str(error)
    assert "PEFT adapter directory" in str(error)
    assert error.provider == "llamacpp"
    assert error.path == str(tmp_path / "nowhere")
    assert isinstance(error, ValueError)


def test_a_file_is_refused(tmp_path: Path) -> None:
    file = tmp_path / "adapter.gguf"
    file.write_bytes(b"GGUF")
    assert "is not a directory" in str(refusal(file))


def test_a_directory_without_config_is_refused(tmp_path: Path) -> None:
    assert "has no adapter_config.json" in str(refusal(tmp_path))
    assert "save_pretrained" in str(refusal(tmp_path))


def test_an_unparsable_config_is_refused(tmp_path: Path) -> None:
    directory = make_adapter(tmp_path)
    (directory / "adapter_config.json").write_text("{not json", encoding="utf-8")
    assert "unreadable adapter_config.json" in str(refusal(directory))


def test_a_config_that_is_not_an_object_is_refused(tmp_path: Path) -> None:
    assert "not a JSON object" in str(refusal(make_adapter(tmp_path, [1, 2])))


def test_missing_weights_are_refused(tmp_path: Path) -> None:
    error = refusal(make_adapter(tmp_path, weights=None))
    assert "has no weights file" in str(error)
    assert "adapter_model.safetensors" in str(error)


@pytest.mark.parametrize(("peft_type", "shown"), [("PREFIX_TUNING", "PREFIX_TUNING"), ("", "untyped")])
def test_other_peft_types_are_refused(tmp_path: Path, peft_type: str, shown: str) -> None:
    error = refusal(make_adapter(tmp_path, peft_type=peft_type))
    assert f"is a {shown} adapter" in str(error)
    assert "only LoRA" in str(error)


def test_dora_is_refused(tmp_path: Path) -> None:
    error = refusal(make_adapter(tmp_path, use_dora=True))
    assert "uses DoRA" in str(error)
    assert "train a plain LoRA" in str(error)


@pytest.mark.parametrize("init", ["pissa", "pissa_niter_4", "corda", "olora", "OLoRA", "loftq"])
def test_an_init_that_rewrites_the_base_weights_is_refused(tmp_path: Path, init: str) -> None:
    """PEFT loads such an adapter by rewriting the base layers (the base minus the adapter's start): on a shared
    model that changed every other request's answer, and llama.cpp applied it to the unchanged base."""
    error = refusal(make_adapter(tmp_path, init_lora_weights=init))
    assert f"init_lora_weights={init!r}" in str(error) and "rewrites the base model's weights" in str(error)


@pytest.mark.parametrize("init", [True, False, "gaussian", "orthogonal", "eva", "mica", "lora_ga"])
def test_an_init_that_leaves_the_base_alone_is_accepted(tmp_path: Path, init: Any) -> None:
    assert read_peft_adapter(make_adapter(tmp_path, init_lora_weights=init)).rank == 8


@pytest.mark.parametrize(
    ("key", "value", "what"),
    [
        ("alora_invocation_tokens", [151644, 77091], "aLoRA"),
        ("arrow_config", {"top_k": 2}, "Arrow"),
        ("use_bdlora", {"nblocks": 2}, "BD-LoRA"),
        ("velora_config", {"rank": 4}, "VeLoRA"),
        ("monteclora_config", {"n_samples": 2}, "MonteCLoRA"),
        ("kasa_config", {"r": 4}, "KaSA"),
        # PEFT copies the shared base model's layers in place: requests without the adapter changed too
        ("layer_replication", [[0, 2], [1, 2]], "PEFT builds a deeper model from copies of the base model's layers"),
        ("target_parameters", ["mlp.experts.down_proj"], "LoRA on parameters"),
    ],
)
def test_a_variant_whose_forward_pass_is_not_plain_lora_is_refused(
    tmp_path: Path, key: str, value: Any, what: str
) -> None:
    error = refusal(make_adapter(tmp_path, **{key: value}))
    assert f"uses {key} ({what}" in str(error) and "train a plain LoRA" in str(error)


def test_target_parameters_are_refused_by_name_not_as_missing_target_modules(tmp_path: Path) -> None:
    """PEFT saves ``target_modules: []`` beside ``target_parameters``: the refusal names the key that is set."""
    error = refusal(make_adapter(tmp_path, target_modules=[], target_parameters=["self_attn.q_proj.weight"]))
    assert "uses target_parameters (" in str(error) and "no usable target_modules" not in str(error)


@pytest.mark.parametrize("bias", ["all", "lora_only"])
def test_trained_biases_are_refused(tmp_path: Path, bias: str) -> None:
    error = refusal(make_adapter(tmp_path, bias=bias))
    assert f"trains biases (bias={bias!r})" in str(error)


def test_modules_to_save_are_refused(tmp_path: Path) -> None:
    error = refusal(make_adapter(tmp_path, modules_to_save=["lm_head"]))
    assert "saves whole modules" in str(error)
    assert "lm_head" in str(error)


@pytest.mark.parametrize("rank", [0, -4, "8", 2.5, True, None])
def test_an_invalid_rank_is_refused(tmp_path: Path, rank: Any) -> None:
    assert f"invalid rank r={rank!r}" in str(refusal(make_adapter(tmp_path, r=rank)))


@pytest.mark.parametrize("alpha", ["16", True, None, [16]])
def test_an_invalid_alpha_is_refused(tmp_path: Path, alpha: Any) -> None:
    assert "invalid lora_alpha" in str(refusal(make_adapter(tmp_path, lora_alpha=alpha)))


@pytest.mark.parametrize(
    "targets",
    [
        None,
        [],
        [1, 2],
        "",
        ["q_proj", ""],
    ],
)
def test_missing_targets_are_refused(tmp_path: Path, targets: Any) -> None:
    assert "no usable target_modules" in str(refusal(make_adapter(tmp_path, target_modules=targets)))


def write_lora_weights(directory: Path, ranks: dict[str, int]) -> None:
    """A real safetensors file with one lora_A/lora_B pair of the given rank per module."""
    import numpy as np
    from safetensors.numpy import save_file

    prefix = "base_model.model.model.layers.0.self_attn"
    tensors = {}
    for module, rank in ranks.items():
        tensors[f"{prefix}.{module}.lora_A.weight"] = np.zeros((rank, 16), "float32")
        tensors[f"{prefix}.{module}.lora_B.weight"] = np.zeros((16, rank), "float32")
    save_file(tensors, str(directory / "adapter_model.safetensors"))


def test_weights_of_the_configured_rank_are_accepted(tmp_path: Path) -> None:
    directory = make_adapter(tmp_path, rank_pattern={"q_proj": 4})
    write_lora_weights(directory, {"q_proj": 4, "v_proj": 8})
    assert read_peft_adapter(directory).rank == 8


@pytest.mark.parametrize(
    ("changes", "ranks", "hint"),
    [
        ({"r": 2**40}, {"q_proj": 8, "v_proj": 8}, "with rank 1099511627776 (its r)"),  # Transformers: 281 TB first
        ({"r": 4}, {"q_proj": 8, "v_proj": 8}, "with rank 4 (its r)"),  # llama.cpp: another scale, silently
        ({"rank_pattern": {"v_proj": 2}}, {"q_proj": 8, "v_proj": 4}, "with rank 2 (its rank_pattern['v_proj'])"),
        ({"rank_pattern": {r"layers\.0\.self_attn\.q_proj": 4}}, {"q_proj": 8, "v_proj": 8}, "rank_pattern["),
        ({}, {"q_proj": 8, "v_proj": 4}, "v_proj with lora_A (4, 16)"),
    ],
)
def test_a_rank_the_weights_do_not_have_is_refused_from_the_header(
    tmp_path: Path, changes: dict[str, Any], ranks: dict[str, int], hint: str
) -> None:
    directory = make_adapter(tmp_path, **changes)
    write_lora_weights(directory, ranks)
    message = str(refusal(directory))
    assert hint in message and "lora_B" in message and "PeftModel.save_pretrained" in message


@pytest.mark.parametrize(
    ("changes", "hint"),
    [
        ({"lora_alpha": 1e39}, "float32 can hold"),
        ({"lora_alpha": -1e39}, "float32 can hold"),
        ({"rank_pattern": {"q_proj": 0}}, "rank_pattern['q_proj'] = 0: expected a positive integer"),
        ({"rank_pattern": {"q_proj": "8"}}, "expected a positive integer"),
        ({"rank_pattern": ["q_proj", 8]}, "rank_pattern that is a list"),
        ({"rank_pattern": {"q_proj(": 4}}, "rank_pattern entry 'q_proj(' that is not a valid regular expression"),
        ({"alpha_pattern": {"[q": 4}}, "alpha_pattern entry '[q' that is not a valid regular expression"),
        ({"alpha_pattern": {"q_proj": 1e39}}, "float32 can hold"),
        ({"alpha_pattern": {"q_proj": None}}, "alpha_pattern['q_proj'] = None"),
        ({"alpha_pattern": "q_proj"}, "alpha_pattern that is a str"),
        ({"target_modules": ".*(q_proj"}, "target_modules entry '.*(q_proj' that is not a valid regular expression"),
        # the keys that select which modules PEFT adapts, as PEFT takes them
        ({"layers_to_transform": "1"}, "layers_to_transform='1': expected a layer number or a list of them"),
        ({"layers_to_transform": [0, True]}, "expected a layer number or a list of them"),
        ({"layers_to_transform": [1], "layers_pattern": 3}, "layers_pattern=3: expected the name of the module list"),
        ({"layers_to_transform": [1], "layers_pattern": "(layers"}, "layers_pattern entry '(layers' that is not"),
        ({"layers_to_transform": [1], "layers_pattern": "(?P<index>x)"}, "not a valid regular expression"),
        ({"layers_to_transform": [1], "layers_pattern": ["h", "(a+)+"]}, "repeats a repetition"),
        ({"layers_pattern": "layers"}, "sets layers_pattern without layers_to_transform, which PEFT's LoraConfig"),
        ({"target_modules": ".*q_proj", "layers_to_transform": [1]}, "sets layers_to_transform with target_modules as"),
        ({"target_modules": "all-linear", "layers_pattern": "layers"}, "sets layers_pattern with target_modules"),
        ({"exclude_modules": "(q_proj"}, "exclude_modules entry '(q_proj' that is not a valid regular expression"),
        ({"exclude_modules": [""]}, "exclude_modules=['']: expected module names or one regular expression"),
        ({"exclude_modules": {"q_proj": 1}}, "exclude_modules={'q_proj': 1}: expected module names"),
    ],
)
def test_bad_numbers_and_patterns_are_refused_with_a_sentence(
    tmp_path: Path, changes: dict[str, Any], hint: str
) -> None:
    message = str(refusal(make_adapter(tmp_path, **changes)))
    assert hint in message and message.startswith("adapter at ")


@pytest.mark.parametrize(
    "selection",
    [
        {"layers_to_transform": [1], "layers_pattern": "layers"},
        {"layers_to_transform": 0},
        {"layers_to_transform": [], "layers_pattern": ["h", "layers"]},
        {"exclude_modules": ["model.layers.0.self_attn.q_proj"]},
        {"exclude_modules": r".*\.0\..*", "target_modules": r".*_proj"},
        {"exclude_modules": [], "layers_pattern": "", "layers_to_transform": None},
    ],
)
def test_a_module_selection_peft_takes_is_accepted(tmp_path: Path, selection: dict[str, Any]) -> None:
    assert read_peft_adapter(make_adapter(tmp_path, **selection)).rank == 8


def test_a_regex_target_string_is_accepted_as_peft_takes_it(tmp_path: Path) -> None:
    adapter = read_peft_adapter(make_adapter(tmp_path, target_modules=r".*\.(q_proj|v_proj)"))
    assert adapter.target_modules == (r".*\.(q_proj|v_proj)",)


def test_a_deeply_nested_config_is_refused(tmp_path: Path) -> None:
    directory = make_adapter(tmp_path)
    (directory / "adapter_config.json").write_text("[" * 100_000 + "]" * 100_000, encoding="utf-8")
    assert "nested too deeply" in str(refusal(directory))


def test_a_deeply_nested_safetensors_header_is_left_to_the_backends_without_a_recursion_error(tmp_path: Path) -> None:
    directory = make_adapter(tmp_path)
    header = b"[" * 100_000 + b"]" * 100_000
    (directory / "adapter_model.safetensors").write_bytes(len(header).to_bytes(8, "little") + header)
    assert read_peft_adapter(directory).rank == 8  # not a rank check's business: the converter calls it corrupt


def test_a_long_list_is_shortened_in_the_message(tmp_path: Path) -> None:
    modules = [f"layer_{n}" for n in range(200_000)]
    message = str(refusal(make_adapter(tmp_path, modules_to_save=modules)))
    assert "layer_0, layer_1" in message and "and 199995 more" in message and len(message) < 500
    (tmp_path / "b").mkdir()
    message = str(refusal(make_adapter(tmp_path / "b", target_modules=[*modules, 7])))
    assert "and 199996 more" in message and len(message) < 500


@pytest.mark.parametrize("provider_type", ["vllm", "llamacpp-server", "ollama"])
async def test_a_server_provider_refuses_a_bad_directory_before_asking_its_server(
    tmp_path: Path, provider_type: str
) -> None:
    """As adapters.md says of every provider: the same sentence, with no server answering (llama-server's and
    Ollama's providers asked their server first, and said it was unreachable)."""
    from inference.factory import get_provider_for_step

    dead = "http://127.0.0.1:9/v1" if provider_type != "ollama" else "http://127.0.0.1:9"
    settings = {"base_model": "llama3.2"} if provider_type == "ollama" else {}
    provider = get_provider_for_step({"provider": provider_type, "base_url": dead, "max_retries": 0, **settings})
    with pytest.raises(InvalidAdapterError, match="uses DoRA"):
        await provider.load_adapter("dora", make_adapter(tmp_path, use_dora=True))
    await provider.aclose()


BOMB = """
import json, sys
from pathlib import Path
import numpy as np
from inference import AdapterWeights
from inference.adapters.peft import read_peft_adapter
from inference.exceptions import InvalidAdapterError

directory = Path(sys.argv[1])
config = json.loads((directory / "adapter_config.json").read_text())
prefix = "base_model.model.model.layers.0.self_attn.q_proj"
tensors = {f"{prefix}.lora_A.weight": np.ones((8, 8), "float32"), f"{prefix}.lora_B.weight": np.ones((8, 8), "float32")}
for check in (lambda: read_peft_adapter(directory), lambda: AdapterWeights(tensors, config).check()):
    try:
        check()
    except InvalidAdapterError as error:
        print("refused:", error)
"""


@pytest.mark.parametrize(
    "changes",
    [{"target_modules": "(.*.*)*X"}, {"rank_pattern": {"(q+)+_proj": 4}}, {"alpha_pattern": {"(x{1,3})*": 4}}],
    ids=["target_modules", "rank_pattern", "alpha_pattern"],
)
def test_a_regular_expression_that_backtracks_exponentially_is_refused_at_once(
    tmp_path: Path, changes: dict[str, Any]
) -> None:
    """Matching one froze the whole process (re holds the GIL and cannot be stopped): run apart, with a guard."""
    import subprocess
    import sys

    directory = make_adapter(tmp_path, **changes)
    done = subprocess.run([sys.executable, "-c", BOMB, str(directory)], capture_output=True, text=True, timeout=60)
    lines = done.stdout.splitlines()
    assert len(lines) == 2 and all("repeats a repetition" in line for line in lines), done.stdout + done.stderr
