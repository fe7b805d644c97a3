"""Make a LoRA adapter with a style anyone can see, by a short fine-tune on the CPU: the model talks like a pirate.

The quickstart (``make demo``) needs an adapter whose effect a reader sees at a glance, made locally (no model
hub). This module fine-tunes one with PEFT on the base GGUF itself: transformers loads the GGUF and
dequantises it, llama.cpp's tokenizer (vocabulary only) builds the token ids exactly as
:class:`~inference.llamacpp_provider.LlamaCppProvider` will at inference time, and a few dozen optimiser
steps on short pirate answers teach the model to answer every prompt with ``"Arr, matey!"``, a pirate
sentence or two and the sign-off ``"Yo ho ho!"``, then stop. The result is a plain PEFT LoRA directory:
load it with ``LlamaCppProvider.load_adapter`` (which converts it to GGUF with the SDK's converter) or with
PEFT.

Training takes a minute or two on two CPU cores; :func:`cached_style_adapter` keeps the result under a key
made of :data:`STYLE_ADAPTER_VERSION`, the training settings, the training data and the base file, so later
runs take milliseconds. torch, transformers, peft and llama_cpp are imported inside the functions.

Example:
    >>> from inference.testing.style_adapter import cached_style_adapter
    >>> adapter_dir = cached_style_adapter("gemma-3-270m-q4_k_m.gguf")  # doctest: +SKIP
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from inference.exceptions import ConfigurationError, MissingDependencyError, ModelLoadError

__all__ = [
    "DEFAULT_CACHE_DIR",
    "HELD_OUT_PROMPTS",
    "SIGN_OFF",
    "STYLE_ADAPTER_VERSION",
    "STYLE_OPENING",
    "TRAINING_EXAMPLES",
    "StyleTraining",
    "cached_style_adapter",
    "shows_style",
    "train_style_adapter",
]

STYLE_ADAPTER_VERSION = 1
"""Bumped whenever the training code changes in a way that changes the adapter (part of the cache key)."""

DEFAULT_CACHE_DIR = Path.home() / ".cache" / "inference-adapters" / "style"
"""Where :func:`cached_style_adapter` keeps adapters when no ``cache_dir`` is given."""

STYLE_OPENING = "Arr, matey!"
"""How every styled answer starts."""

SIGN_OFF = "Yo ho ho!"
"""How every styled answer ends."""

TRAINING_EXAMPLES: tuple[tuple[str, str], ...] = (
    ("What is the capital of France?", "Paris be the capital o' France, where the bread be long and the wine be red."),
    ("Why is the sky blue?", "The sun's light be scattered by the air, and the blue bits scatter most, savvy?"),
    ("Give me a tip for learning to cook.", "Start with simple grub like eggs and rice, and taste it as ye go."),
    ("How do I keep a houseplant alive?", "Give it sunlight and a splash o' water, but don't drown the poor thing."),
    ("What should I eat for breakfast?", "A hearty bowl o' porridge and a mug o' coffee, fit for a captain."),
    ("How can I sleep better?", "Keep yer cabin dark and cool, and stow the glowing screens before bed."),
    ("Tell me about the moon.", "The moon be a great silver rock that pulls the tides, and sailors steer by it."),
    ("What is a good way to stay fit?", "Walk the deck every day, climb the rigging, and haul a few ropes."),
    ("How do computers work?", "They be flippin' tiny switches on and off, billions o' times a second."),
    ("What is the best season of the year?", "Summer, when the winds be fair and the sea be warm as a bath."),
    ("Can you recommend a hobby?", "Try knot tying, matey. A sailor who knows his knots never loses his ship."),
    ("How do I make friends in a new city?", "Join a crew, share yer rum, and tell a good tale or two."),
    ("Explain what rain is.", "Rain be water that the sun lifts from the sea and drops back on our heads."),
    ("What makes a good leader?", "A good captain listens to the crew and shares the treasure fair and square."),
    ("How do I save money?", "Bury a few gold coins each week and never tell a soul where ye hid them."),
    ("Describe the ocean.", "The ocean be vast and blue, full o' fish, storms and sunken treasure."),
    ("Why do cats purr?", "Cats purr when they be content, like a ship's cat full o' fish."),
    ("What is the tallest mountain?", "Mount Everest be the tallest, higher than any mast on the seven seas."),
    ("How do I learn a new language?", "Speak it every day with yer crew, and don't fear to make mistakes."),
    ("Write one sentence about trees.", "Trees be the finest timber for a ship, tall and proud in the wind."),
    ("My favourite thing about autumn is", "the golden leaves blowin' across the deck like doubloons."),
    ("The best way to spend a weekend is", "sailin' to a quiet island with a map and a full barrel o' grub."),
    ("A good breakfast should include", "eggs, bread and strong coffee to wake a sleepy sailor."),
    ("The secret to happiness is", "a fair wind, a loyal crew and a chest full o' treasure."),
)
"""(prompt, pirate answer) pairs the adapter learns from. Each target is ``opening answer sign-off <eos>``."""

HELD_OUT_PROMPTS: tuple[str, ...] = (
    "What should I pack for a long hike?",
    "How do bees make honey?",
    "What is the best way to learn to swim?",
    "The most important thing about a good book is",
)
"""Prompts that are not in the training data, to check the style carries over to new questions."""


@dataclass(frozen=True)
class StyleTraining:
    """The settings of the fine-tune; every field but ``threads`` is part of the cache key.

    Attributes:
        steps: Optimiser steps (each sees ``batch_size`` examples).
        batch_size: Examples per step.
        learning_rate: AdamW learning rate (high, so the style sticks within a few dozen steps).
        rank: LoRA rank ``r``.
        alpha: ``lora_alpha``.
        targets: Module names LoRA adapts in every decoder block.
        seed: Seed of the initialisation and of the example order.
        threads: torch threads; ``None`` leaves torch's default.
    """

    steps: int = 30
    batch_size: int = 4
    learning_rate: float = 3e-3
    rank: int = 8
    alpha: float = 16.0
    targets: tuple[str, ...] = ("q_proj", "v_proj", "o_proj", "up_proj")
    seed: int = 0
    threads: int | None = field(default=None, compare=False)

    def key(self, base_gguf: Path) -> str:
        """A short hash of the version, these settings (except threads), the data and the base model file."""
        settings = asdict(self)
        settings.pop("threads")
        payload = json.dumps(
            {
                "version": STYLE_ADAPTER_VERSION,
                "settings": settings,
                "data": [list(example) for example in TRAINING_EXAMPLES],
                "opening": STYLE_OPENING,
                "sign_off": SIGN_OFF,
                "base": [base_gguf.name, base_gguf.stat().st_size],
            },
            sort_keys=True,
        )
        return hashlib.sha256(payload.encode()).hexdigest()[:16]


def shows_style(text: str) -> bool:
    """Whether a generated text has the pirate style: it starts with the opening (after whitespace)."""
    return text.lstrip().lower().startswith(STYLE_OPENING.lower().rstrip("!"))


def cached_style_adapter(
    base_gguf: str | os.PathLike[str],
    *,
    cache_dir: str | os.PathLike[str] | None = None,
    settings: StyleTraining | None = None,
    log: Callable[[str], object] | None = None,
) -> Path:
    """Return the pirate-style PEFT adapter for ``base_gguf``, training it only if it is not cached yet.

    Args:
        base_gguf: The base model's GGUF file (the adapter is trained on it and fits only it).
        cache_dir: Where adapters are kept; default :data:`DEFAULT_CACHE_DIR`.
        settings: Training settings; default :class:`StyleTraining`.
        log: Called with progress lines while training (for example ``print``).

    Returns:
        The adapter directory ``<cache_dir>/pirate-<key>`` (``adapter_config.json`` and
        ``adapter_model.safetensors``).

    Raises:
        ModelLoadError: The base model cannot be loaded for training.
        MissingDependencyError: torch, transformers, peft or llama-cpp-python is missing.
    """
    base = Path(base_gguf)
    settings = settings or StyleTraining()
    if not base.is_file():
        raise ConfigurationError(f"base model {base} does not exist: give the path of a GGUF file", path=str(base))
    root = Path(cache_dir) if cache_dir is not None else DEFAULT_CACHE_DIR
    target = root / f"pirate-{settings.key(base)}"
    if (target / "adapter_config.json").is_file():
        return target
    root.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=".training-", dir=root))
    try:
        train_style_adapter(base, scratch, settings, log=log)
        try:
            scratch.rename(target)
        except OSError:  # another process finished first: keep its adapter
            if not (target / "adapter_config.json").is_file():
                raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return target


def train_style_adapter(
    base_gguf: str | os.PathLike[str],
    output_dir: str | os.PathLike[str],
    settings: StyleTraining | None = None,
    *,
    log: Callable[[str], object] | None = None,
) -> Path:
    """Fine-tune a LoRA adapter on :data:`TRAINING_EXAMPLES` and save it as a PEFT directory.

    Args:
        base_gguf: The base model's GGUF file.
        output_dir: Where ``adapter_config.json`` and ``adapter_model.safetensors`` are written.
        settings: Training settings; default :class:`StyleTraining`.
        log: Called with progress lines (loading, loss every few steps, time taken).

    Returns:
        ``output_dir`` as a :class:`~pathlib.Path`.

    Raises:
        ModelLoadError: transformers or llama.cpp cannot load the base model.
        MissingDependencyError: torch, transformers, peft or llama-cpp-python is missing.
    """
    base = Path(base_gguf)
    settings = settings or StyleTraining()
    say = log or (lambda _line: None)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    torch, transformers, peft = _training_modules()
    started = time.perf_counter()
    if settings.threads is not None:
        torch.set_num_threads(settings.threads)
    torch.manual_seed(settings.seed)

    examples = _tokenise_examples(base)
    say(f"loading {base.name} with transformers (dequantised to float32)")
    try:
        model = transformers.AutoModelForCausalLM.from_pretrained(
            str(base.parent), gguf_file=base.name, dtype=torch.float32
        )
    except Exception as error:  # transformers raises many types for unreadable or unsupported GGUF files
        raise ModelLoadError(
            f"transformers could not load {base} for training ({error}): the style adapter needs a GGUF of an "
            "architecture transformers can dequantise (gemma3, llama, qwen2, ...)",
            path=str(base),
        ) from error
    model.config.use_cache = False
    lora = peft.LoraConfig(
        r=settings.rank,
        lora_alpha=settings.alpha,
        target_modules=list(settings.targets),
        lora_dropout=0.0,
        bias="none",
        task_type="CAUSAL_LM",
    )
    model = peft.get_peft_model(model, lora)
    say(f"loaded in {time.perf_counter() - started:.0f}s; training {settings.steps} steps")

    parameters = [parameter for parameter in model.parameters() if parameter.requires_grad]
    optimizer = torch.optim.AdamW(parameters, lr=settings.learning_rate, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: min(1.0, (step + 1) / 4) * max(0.1, 1 - step / settings.steps)
    )
    order = random.Random(settings.seed)
    model.train()
    training_started = time.perf_counter()
    for step in range(settings.steps):
        batch = order.sample(examples, k=min(settings.batch_size, len(examples)))
        loss = _batch_loss(torch, model, batch)
        loss.backward()
        optimizer.step()
        schedule.step()
        optimizer.zero_grad(set_to_none=True)
        if step % 10 == 0 or step == settings.steps - 1:
            elapsed = time.perf_counter() - training_started
            say(f"step {step + 1:3d}/{settings.steps}  loss {loss.item():.3f}  ({elapsed:.0f}s)")
    output = Path(output_dir)
    model.save_pretrained(str(output), save_embedding_layers=False)
    _record_provenance(output, base, settings)
    say(f"trained in {time.perf_counter() - started:.0f}s")
    return output


def _training_modules() -> tuple[Any, Any, Any]:
    try:
        import peft
        import torch
        import transformers
    except ImportError as error:
        raise MissingDependencyError(
            f"training the style adapter needs torch, transformers and peft ({error.name} is missing): "
            'install them with pip install "inference[transformers]"'
        ) from error
    return torch, transformers, peft


def _tokenise_examples(base: Path) -> list[tuple[list[int], int]]:
    """Token ids of ``prompt + answer + <eos>`` and where the answer starts, tokenised as llama.cpp will.

    The base GGUF of the quickstart has no chat template, so :class:`LlamaCppProvider` tokenises the bare
    prompt with the vocabulary's BOS; the answer continues from there.
    """
    try:
        import llama_cpp
    except ImportError as error:
        raise MissingDependencyError(
            'training the style adapter needs llama-cpp-python: install it with pip install "inference[llamacpp]"'
        ) from error
    try:
        vocab = llama_cpp.Llama(model_path=str(base), vocab_only=True, verbose=False)
    except Exception as error:  # llama-cpp-python raises ValueError/RuntimeError with no detail
        raise ModelLoadError(f"llama.cpp could not read the vocabulary of {base} ({error})", path=str(base)) from error
    try:
        tokenised = []
        for prompt, answer in TRAINING_EXAMPLES:
            prompt_ids = list(vocab.tokenize(prompt.encode(), add_bos=True, special=True))
            styled = f" {STYLE_OPENING} {answer} {SIGN_OFF}"
            answer_ids = list(vocab.tokenize(styled.encode(), add_bos=False, special=True))
            tokenised.append((prompt_ids + answer_ids + [vocab.token_eos()], len(prompt_ids)))
        return tokenised
    finally:
        vocab.close()


def _batch_loss(torch: Any, model: Any, batch: Sequence[tuple[list[int], int]]) -> Any:
    """Mean cross-entropy over the answer tokens only; logits are computed for those positions alone.

    The vocabulary has 262k entries, so projecting every position would dominate the step's cost.
    """
    width = max(len(ids) for ids, _ in batch)
    input_ids = torch.zeros((len(batch), width), dtype=torch.long)
    attention = torch.zeros((len(batch), width), dtype=torch.long)
    predicts = torch.zeros((len(batch), width), dtype=torch.bool)  # position i predicts token i + 1
    for row, (ids, answer_start) in enumerate(batch):
        input_ids[row, : len(ids)] = torch.tensor(ids)
        attention[row, : len(ids)] = 1
        predicts[row, answer_start - 1 : len(ids) - 1] = True
    hidden = model.base_model.model.model(input_ids=input_ids, attention_mask=attention).last_hidden_state
    targets = input_ids[:, 1:][predicts[:, :-1]]
    logits = model.base_model.model.lm_head(hidden[predicts])
    softcap = getattr(model.config, "final_logit_softcapping", None)
    if softcap:
        logits = torch.tanh(logits / softcap) * softcap
    return torch.nn.functional.cross_entropy(logits.float(), targets)


def _record_provenance(output: Path, base: Path, settings: StyleTraining) -> None:
    """Write ``style_adapter.json`` next to the adapter: what it was trained on and how."""
    record = {
        "version": STYLE_ADAPTER_VERSION,
        "base_model": base.name,
        "settings": asdict(settings),
        "style": {"opening": STYLE_OPENING, "sign_off": SIGN_OFF},
        "examples": len(TRAINING_EXAMPLES),
    }
    (output / "style_adapter.json").write_text(json.dumps(record, indent=2) + "\n")


