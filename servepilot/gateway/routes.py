"""The vLLM routes the gateway proxies, and what it needs to know of each.

Every route goes through the same path (proxy.py): validate the little routing needs, admit,
route, forward the body's bytes, relay the answer, count it in the metrics under its path.
What differs is told here: which field holds the prompt (checked on the routes whose body
the gateway understands; on the others the engine judges the body), whether the call goes
through admission, which fields bound the answer's length (lowered under degradation), and
whether the body is JSON or a multipart upload (audio, passed through unchanged).

vLLM 0.32 registers a route only where the model has the task behind it
(entrypoints/launchers/api_server/routers.py): a generative model has no /v1/embeddings, a
pooling model no /v1/chat/completions, and only speech-to-text models have /v1/audio/*; a
route it does not have answers its web framework's 404. `serves` says who has it, for the
gateway's 404 that names the route and the model.
"""

from __future__ import annotations

from dataclasses import dataclass

_GENERATE = "generative models (vLLM's generate runner)"
_POOLING = "pooling models (vLLM's --runner pooling)"


@dataclass(frozen=True, slots=True)
class ApiRoute:
    path: str
    prompt_field: str | None
    """The field validated as the prompt ("messages", "prompt", "tokens"); None where the
    engine alone judges the body (its prompt field, when it has one, only hints routing)."""
    admitted: bool
    """Through admission (queues, replica budgets, shedding). Tokenizer calls are not: they
    take milliseconds and a load tester builds its prompts with them while the fleet is full."""
    cap_fields: tuple[str, ...]
    """The fields that bound the answer's length, lowered to the cap under degradation; the
    first is set to the cap when the request has none (none means "up to the context")."""
    serves: str
    """Which models' replicas have the route (named in the 404 of a replica without it)."""
    multipart: bool = False
    """The body is a multipart/form-data upload, forwarded as it came with its content type."""


CHAT = ApiRoute(
    "/v1/chat/completions", "messages", True, ("max_tokens", "max_completion_tokens"), _GENERATE
)
COMPLETIONS = ApiRoute("/v1/completions", "prompt", True, ("max_tokens",), _GENERATE)
RESPONSES = ApiRoute("/v1/responses", None, True, ("max_output_tokens",), _GENERATE)
TOKENIZE = ApiRoute("/tokenize", "prompt", False, (), "every model")
TOKENIZE_CHAT = ApiRoute("/tokenize", "messages", False, (), "every model")
DETOKENIZE = ApiRoute("/detokenize", "tokens", False, (), "every model")
EMBEDDINGS = ApiRoute("/v1/embeddings", None, True, (), f"embedding {_POOLING}")
SCORE = ApiRoute("/v1/score", None, True, (), f"scoring (cross-encoder or embedding) {_POOLING}")
RERANK = ApiRoute("/v1/rerank", None, True, (), f"scoring (cross-encoder or embedding) {_POOLING}")
POOLING = ApiRoute("/pooling", None, True, (), _POOLING)
_SPEECH = "speech-to-text models (the transcription task, such as Whisper)"
TRANSCRIPTIONS = ApiRoute("/v1/audio/transcriptions", None, True, (), _SPEECH, multipart=True)
TRANSLATIONS = ApiRoute("/v1/audio/translations", None, True, (), _SPEECH, multipart=True)

PROXIED: tuple[ApiRoute, ...] = (
    CHAT,
    COMPLETIONS,
    RESPONSES,
    EMBEDDINGS,
    SCORE,
    RERANK,
    POOLING,
    TRANSCRIPTIONS,
    TRANSLATIONS,
)
"""The routes proxied as they are (the tokenizer's two pick their prompt field per body)."""


def not_served_message(route: ApiRoute, model: str, replica_id: str, answer: str) -> str:
    """The 404 of a replica that does not have the route: which route, which model, who has
    it, and what the replica said."""
    which = f"the model {model!r}" if model else "the fleet's model"
    return (
        f"{which} does not serve POST {route.path}: replica {replica_id} answered 404 "
        f"({answer}); vLLM serves {route.path} for {route.serves}"
    )
