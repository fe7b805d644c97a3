"""Stacked LoRA matrices applied per row in one pass equal PEFT's mixed-adapter batches, on both tiny models."""

from __future__ import annotations

import copy
from typing import Any

import pytest

torch = pytest.importorskip("torch")
peft = pytest.importorskip("peft")
transformers = pytest.importorskip("transformers")

from inference._inprocess.lora_stacks import (  # noqa: E402
    MASKED_MAX_SLOTS,
    LoraStacks,
    lora_module_weights,
    not_stackable_reason,
)

pytestmark = [
    pytest.mark.integration,
    pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning"),  # PEFT asks
]

TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def _config(number: int) -> dict[str, Any]:
    """Adapter ``number``'s config: ranks 4/8/16, several target sets, rsLoRA and patterns among them."""
    rank = (4, 8, 16)[number % 3]
    config: dict[str, Any] = {
        "r": rank,
        "lora_alpha": 2 * rank + number,
        "target_modules": list(TARGETS[: 2 + number % 6]),
        "lora_dropout": 0.0,
        "init_lora_weights": False,  # random B too: every adapter changes the output
    }
    if number % 4 == 1:
        config["use_rslora"] = True
    if number % 5 == 2:
        config["rank_pattern"] = {"q_proj": 2}
        config["alpha_pattern"] = {r"layers\.0\.self_attn\.k_proj": 3.0}
    return config


def _state(base: Any, config: dict[str, Any], seed: int) -> dict[str, Any]:
    """A random PEFT state dict for ``config`` on ``base``, as PEFT names and shapes it."""
    generator = torch.Generator().manual_seed(seed)
    linear = {name: module for name, module in base.named_modules() if isinstance(module, torch.nn.Linear)}
    state = {}
    for name, module in sorted(linear.items()):
        if not name.endswith(tuple(config["target_modules"])):
            continue
        rank = 2 if name.endswith("q_proj") and "rank_pattern" in config else config["r"]
        prefix = f"base_model.model.{name}"
        state[f"{prefix}.lora_A.weight"] = torch.randn(rank, module.in_features, generator=generator) / 8
        state[f"{prefix}.lora_B.weight"] = torch.randn(module.out_features, rank, generator=generator) / 8
    return state


def _adapters(base: Any, count: int) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """``count`` random adapters for ``base``: (config, PEFT state dict) pairs."""
    return [(_config(number), _state(base, _config(number), 1000 + number)) for number in range(count)]


@pytest.fixture(scope="module", params=["qwen2", "llama"])
def base(request: pytest.FixtureRequest, tiny_models: dict[str, Any]) -> Any:
    model = transformers.AutoModelForCausalLM.from_pretrained(str(tiny_models[request.param].hf_dir))
    return model.eval()


@pytest.fixture(scope="module")
def adapters(base: Any) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    return _adapters(base, 32)


@pytest.fixture(scope="module")
def reference(base: Any, adapters: list[tuple[dict[str, Any], dict[str, Any]]]) -> Any:
    """PEFT with every adapter loaded (``a0``...), for mixed batches with ``adapter_names``."""
    model: Any = None
    for number, (config, state) in enumerate(adapters):
        name = f"a{number}"
        lora = peft.LoraConfig(**config, inference_mode=True)
        if model is None:
            model = peft.PeftModel(copy.deepcopy(base), lora, adapter_name=name)
        else:
            model.add_adapter(name, lora)
        peft.set_peft_model_state_dict(model, state, adapter_name=name)
    return model.eval()


def _stacks(base: Any, adapters: list[tuple[dict[str, Any], dict[str, Any]]]) -> tuple[Any, LoraStacks, list[int]]:
    model = copy.deepcopy(base)
    stacks = LoraStacks(torch, model, dtype=torch.float32, device=torch.device("cpu"))
    modules = dict(model.named_modules())
    slots = [stacks.add(lora_module_weights(config, state, modules=modules)) for config, state in adapters]
    return model, stacks, slots


def _tokens(rows: int, width: int = 12) -> Any:
    generator = torch.Generator().manual_seed(rows)
    return torch.randint(5, 200, (rows, width), generator=generator)


def _logprobs(model: Any, tokens: Any, **kwargs: Any) -> Any:
    with torch.inference_mode():
        return torch.log_softmax(model(input_ids=tokens, **kwargs).logits.float(), dim=-1)


@pytest.mark.parametrize("distinct", [1, 2, 8, 32])
def test_a_mixed_batch_equals_peft_s_mixed_batch(
    base: Any, adapters: list[tuple[dict[str, Any], dict[str, Any]]], reference: Any, distinct: int
) -> None:
    model, stacks, slots = _stacks(base, adapters)
    rows = max(distinct + 2, 4)
    chosen = [(row * 7) % distinct for row in range(rows)]
    names = [f"a{number}" for number in chosen]
    names[1] = "__base__"  # one base row in every batch
    row_slots = [0 if name == "__base__" else slots[int(name[1:])] for name in names]
    tokens = _tokens(rows)
    expected = _logprobs(reference, tokens, adapter_names=names)
    with stacks.rows(row_slots):
        actual = _logprobs(model, tokens)
    assert (actual - expected).abs().max().item() < 1e-4
    plain = _logprobs(model, tokens)  # outside rows(): the base model
    assert (plain[1] - expected[1]).abs().max().item() < 1e-5
    assert (plain[0] - expected[0]).abs().max().item() > 1e-2  # the adapters do change the output


def test_greedy_generation_equals_peft_s_for_every_row(
    base: Any, adapters: list[tuple[dict[str, Any], dict[str, Any]]], reference: Any
) -> None:
    model, stacks, slots = _stacks(base, adapters[:8])
    names = [f"a{number}" for number in range(8)] + ["__base__"]
    tokens = _tokens(len(names), width=6)
    settings = {"max_new_tokens": 8, "do_sample": False, "pad_token_id": 0}
    with torch.inference_mode():
        expected = reference.generate(input_ids=tokens, adapter_names=names, **settings)
        with stacks.rows([*slots, 0]):
            actual = model.generate(input_ids=tokens, **settings)
    assert actual.tolist() == expected.tolist()


def test_one_adapter_for_every_row_and_many_distinct_adapters_take_their_own_paths(
    base: Any, adapters: list[tuple[dict[str, Any], dict[str, Any]]], reference: Any
) -> None:
    model, stacks, slots = _stacks(base, adapters)
    tokens = _tokens(MASKED_MAX_SLOTS + 4)
    single = ["a3"] * tokens.shape[0]
    many = [f"a{number}" for number in range(tokens.shape[0])]  # more distinct slots than the masked path takes
    for names in (single, many):
        expected = _logprobs(reference, tokens, adapter_names=names)
        with stacks.rows([slots[int(name[1:])] for name in names]):
            actual = _logprobs(model, tokens)
        assert (actual - expected).abs().max().item() < 1e-4


def test_a_weighted_combination_equals_peft_s_cat_combination(
    base: Any, adapters: list[tuple[dict[str, Any], dict[str, Any]]], reference: Any
) -> None:
    model, stacks, slots = _stacks(base, adapters[:6])
    combined = copy.deepcopy(reference)
    # PEFT's "cat" needs the same target modules: a0 and a6 both target q_proj, k_proj (6 % 6 == 0).
    pair = [(0, 1.0), (3, -0.5)]
    targets = {tuple(adapters[number][0]["target_modules"]) for number, _ in pair}
    if len(targets) != 1:
        pair = [(0, 1.0), (0, -0.5)]
    combined.add_weighted_adapter(
        [f"a{number}" for number, _ in pair], [weight for _, weight in pair], "mix", combination_type="cat"
    )
    slot = stacks.add_combination([(slots[number], weight) for number, weight in pair])
    tokens = _tokens(3)
    expected = _logprobs(combined, tokens, adapter_names=["mix", "a1", "__base__"])
    with stacks.rows([slot, slots[1], 0]):
        actual = _logprobs(model, tokens)
    assert (actual - expected).abs().max().item() < 1e-4


def test_a_freed_slot_reused_by_a_smaller_adapter_keeps_nothing_of_the_old_one(
    base: Any, adapters: list[tuple[dict[str, Any], dict[str, Any]]], reference: Any
) -> None:
    model, stacks, slots = _stacks(base, adapters[:6])
    modules = dict(model.named_modules())
    big = next(number for number in range(6) if adapters[number][0]["r"] == 16)
    small = next(number for number in range(6, 32) if adapters[number][0]["r"] == 4)
    stacks.remove(slots[big])
    reused = stacks.add(lora_module_weights(*adapters[small], modules=modules))
    assert reused == slots[big]
    tokens = _tokens(2)
    expected = _logprobs(reference, tokens, adapter_names=[f"a{small}", "__base__"])
    with stacks.rows([reused, 0]):
        actual = _logprobs(model, tokens)
    assert (actual - expected).abs().max().item() < 1e-4
    with pytest.raises(ValueError, match="hold no adapter"), stacks.rows([slots[big] + 100]):
        pass


def test_unloading_a_high_rank_adapter_gives_its_memory_back_and_leaves_the_rows_as_they_were(
    base: Any, adapters: list[tuple[dict[str, Any], dict[str, Any]]], reference: Any
) -> None:
    """One rank-256 adapter loaded and unloaded kept its rank in every module for good: its memory stayed, and every
    later mixed batch multiplied by its padding (a user saw an evaluation run 2.5x slower after it, with no adapter
    of that rank left). While it is loaded, a batch without it does not pay for its rank either."""
    model, stacks, slots = _stacks(base, adapters[:6])
    names = [f"a{row % 6}" for row in range(8)]
    names[1] = "__base__"
    row_slots = [0 if name == "__base__" else slots[int(name[1:])] for name in names]
    tokens = _tokens(len(names))
    with stacks.rows(row_slots):
        before = _logprobs(model, tokens)
    held = stacks.nbytes
    big = {"r": 256, "lora_alpha": 512, "target_modules": list(TARGETS), "init_lora_weights": False}
    slot = stacks.add(lora_module_weights(big, _state(base, big, 99), modules=dict(model.named_modules())))
    assert stacks.nbytes > 10 * held
    with stacks.rows(row_slots):
        beside = _logprobs(model, tokens)
    stacks.remove(slot)
    assert stacks.nbytes == held  # what the six adapters need, as before the big one came
    with stacks.rows(row_slots):
        after = _logprobs(model, tokens)
    assert torch.equal(beside, before) and torch.equal(after, before)  # the same products, to the bit
    assert (after - _logprobs(reference, tokens, adapter_names=names)).abs().max().item() < 1e-4


def test_the_stacks_shrink_with_the_adapters_in_use_and_hold_nothing_once_all_are_removed(
    base: Any, adapters: list[tuple[dict[str, Any], dict[str, Any]]], reference: Any
) -> None:
    model, stacks, slots = _stacks(base, adapters)
    modules = dict(model.named_modules())
    for slot in slots[2:]:
        stacks.remove(slot)
    _, fresh, _ = _stacks(base, adapters[:2])
    assert stacks.nbytes <= 2 * fresh.nbytes  # 32 adapters' slots and ranks down to (twice) the two left
    tokens = _tokens(3)
    with stacks.rows([slots[0], slots[1], 0]):
        actual = _logprobs(model, tokens)
    assert (actual - _logprobs(reference, tokens, adapter_names=["a0", "a1", "__base__"])).abs().max().item() < 1e-4
    for slot in slots[:2]:
        stacks.remove(slot)
    assert stacks.nbytes == 0
    assert torch.equal(_logprobs(model, tokens), _logprobs(base, tokens))  # no hook left: the model as it was
    again = stacks.add(lora_module_weights(*adapters[5], modules=modules))
    assert again == 1  # the lowest free slot
    with stacks.rows([again, 0, again]):
        actual = _logprobs(model, tokens)
    assert (actual - _logprobs(reference, tokens, adapter_names=["a5", "__base__", "a5"])).abs().max().item() < 1e-4


def test_configs_with_more_than_linear_matrices_are_left_to_peft() -> None:
    assert not_stackable_reason({"r": 8, "lora_alpha": 16}) is None
    assert "DoRA" in (not_stackable_reason({"use_dora": True}) or "")
    assert "bias" in (not_stackable_reason({"bias": "all"}) or "")
    assert "modules_to_save" in (not_stackable_reason({"modules_to_save": ["lm_head"]}) or "")
