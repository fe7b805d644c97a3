"""The request options a server provider sends (issue 25), checked for their effect on a real server: shared by the
vLLM and llama-server test modules (this folder is on sys.path).

Each option must change the answer the way it says, which a dropped field cannot do: ``logit_bias`` (and the same
field through ``extra_body``) forces a token; ``min_p=1`` at temperature 1 keeps only the likeliest token, so it
answers the greedy text; presence and frequency penalties change a greedy text that repeats tokens; ``n`` gives
that many choices, with a seed the choices of single requests seeded ``seed + k`` (vLLM's own ``n`` seeds its children
so; llama_cpp.server ignores ``n``, and the rest is asked one request each; llama-server gets ``n`` requests), greedy
the greedy text ``n`` times (vLLM refuses ``n`` with greedy sampling: ``n`` requests), the token counts adding up with
the prompt once. The token ids come from the in-process provider of the same model (its tokenizer).
"""

from __future__ import annotations

from inference.provider import InferenceProvider

PROMPT = "numbers 1 2 3 and"


async def check_sampling_options(remote: InferenceProvider, local: InferenceProvider, model: str) -> None:
    greedy = await remote.generate(PROMPT, model=model, max_tokens=24, temperature=0, logprobs=1)
    assert greedy.logprobs is not None

    target = (await local.tokenize(" and", model))[-1]
    forced_text = await local.detokenize([target] * 4, model)
    for options in ({"logit_bias": {target: 100}}, {"extra_body": {"logit_bias": {str(target): 100}}}):
        forced = await remote.generate(PROMPT, model=model, max_tokens=4, temperature=0, **options)
        assert forced.text == forced_text, options

    only_likeliest = await remote.generate(PROMPT, model=model, max_tokens=24, temperature=1.0, seed=3, min_p=1.0)
    assert only_likeliest.text == greedy.text

    tokens = [entry.token for entry in greedy.logprobs]
    assert len(set(tokens)) < len(tokens), f"the check needs a greedy text that repeats a token: {tokens}"
    for penalty in ("presence_penalty", "frequency_penalty"):  # a repeated token is penalized: another text
        penalized = await remote.generate(PROMPT, model=model, max_tokens=24, temperature=0, **{penalty: 2.0})
        assert penalized.text != greedy.text, penalty

    several = await remote.generate(PROMPT, model=model, max_tokens=8, temperature=1.0, seed=7, n=3)
    assert several.choices is not None and len(several.choices) == 3
    assert several.text == several.choices[0].text
    assert several.completion_tokens == sum(choice.completion_tokens for choice in several.choices)
    alone = [await remote.generate(PROMPT, model=model, max_tokens=8, temperature=1.0, seed=seed) for seed in (7, 8, 9)]
    assert [choice.text for choice in several.choices] == [result.text for result in alone]
    assert len({result.text for result in alone}) == 3
    assert several.prompt_tokens == alone[0].prompt_tokens  # the prompt counted once
    assert several.token_count == (several.prompt_tokens or 0) + several.completion_tokens
    assert [choice.completion_tokens for choice in several.choices] == [result.completion_tokens for result in alone]

    greedy_n = await remote.generate(PROMPT, model=model, max_tokens=8, temperature=0, n=3)
    greedy_one = await remote.generate(PROMPT, model=model, max_tokens=8, temperature=0)
    assert greedy_n.choices is not None and [choice.text for choice in greedy_n.choices] == [greedy_one.text] * 3
    assert greedy_n.completion_tokens == 3 * greedy_one.completion_tokens
