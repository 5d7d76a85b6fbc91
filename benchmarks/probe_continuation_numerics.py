"""Why greedy continued answers differ from undisturbed ones: the numerics of one replica.

For each prompt, a greedy answer of --max-tokens tokens is asked undisturbed (with its token
ids); then, for each cut k, the prompt's ids and the answer's first k ids are sent as a new
prompt (as a continuation sends them), and the rest of the answer compared, token for token,
with the undisturbed one. The new replica prefills those k tokens in one step where the
undisturbed run made them one decode step at a time, so a near tie can flip; run it against a
replica in bfloat16 and one in float32 to see how much of the difference is the precision.

    python benchmarks/probe_continuation_numerics.py --url http://127.0.0.1:8001 [--url ...]

Each --url is a running vLLM (OpenAI API) serving one model; prints matches per replica.
"""

from __future__ import annotations

import argparse
import json
import urllib.request
from typing import Any

PROMPTS = [f"Write a short story about a {thing}:" for thing in
           ("cat", "ship", "tree", "robot", "river", "clock")]  # fmt: skip


def _complete(
    url: str, model: str, prompt: str | list[int], max_tokens: int
) -> tuple[list[int], list[int]]:
    """(the prompt's ids, the answer's ids) of a greedy completion."""
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0,
            "return_token_ids": True, "ignore_eos": True}  # fmt: skip
    request = urllib.request.Request(
        f"{url}/v1/completions", json.dumps(body).encode(), {"content-type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=120) as answer:
        doc: dict[str, Any] = json.loads(answer.read())
    choice = doc["choices"][0]
    prompt_ids = choice.get("prompt_token_ids") or doc.get("prompt_token_ids") or []
    return list(prompt_ids), list(choice.get("token_ids") or [])


def _model(url: str) -> str:
    with urllib.request.urlopen(f"{url}/v1/models", timeout=30) as answer:
        name: str = json.loads(answer.read())["data"][0]["id"]
    return name


def probe(url: str, cuts: list[int], max_tokens: int) -> tuple[int, int]:
    """(continuations whose rest matched the undisturbed answer, continuations)."""
    model, matched, total = _model(url), 0, 0
    for prompt in PROMPTS:
        prompt_ids, whole = _complete(url, model, prompt, max_tokens)
        if not prompt_ids or len(whole) != max_tokens:
            raise SystemExit(f"{url} returned no token ids (return_token_ids): not vLLM 0.10+?")
        for k in cuts:
            _, rest = _complete(url, model, [*prompt_ids, *whole[:k]], max_tokens - k)
            matched += rest == whole[k:]
            total += 1
    return matched, total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", action="append", required=True, help="a replica; repeat")
    parser.add_argument("--cuts", default="3,6,10", help="tokens before each cut")
    parser.add_argument("--max-tokens", type=int, default=24)
    args = parser.parse_args()
    cuts = [int(k) for k in args.cuts.split(",")]
    for url in args.url:
        matched, total = probe(url, cuts, args.max_tokens)
        print(f"{url}: {matched} of {total} continuations matched the undisturbed answer")


if __name__ == "__main__":
    main()
