"""Prompts whose token count is exactly the one asked for, by the model's own tokenizer.

Decoding a slice of token ids and encoding the text again does not always give the same ids
back (a word cut in two, a merge across the cut), which is why other load testers send random
prompts of the wrong length (sglang #15732: 92% of them). Here every prompt is re-encoded and
fixed up until it is exact: too long, cut the re-encoded ids to length; too short, extend with
the corpus tokens that follow; after a few rounds without success, start over from a new slice.

Work is batched: one decode and one encode call per round for all prompts still pending, so a
server tokenizer sees concurrent requests and a local one its batch API.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence

from servepilot.bench.corpus import corpus_paragraphs
from servepilot.bench.tokenizer import Tokenizer
from servepilot.core.errors import ConfigError

# Most prompts are exact after the first round and nearly all after the second; the limits
# only stop a tokenizer that never round-trips from looping forever.
MAX_ROUNDS_PER_SLICE = 4
MAX_SLICES = 6
_PARAGRAPHS_PER_CHUNK = 12
_CHUNKS_PER_CALL = 8


class _Job:
    """One prompt being fitted (mutable, private to one `make_prompts` call)."""

    __slots__ = ("cursor", "index", "n_tokens", "prefix", "prefix_ids", "rounds", "slices", "tail")

    def __init__(self, index: int, n_tokens: int, prefix: str, prefix_ids: list[int]) -> None:
        self.index = index
        self.n_tokens = n_tokens
        self.prefix = prefix
        self.prefix_ids = prefix_ids
        self.tail: list[int] = []
        self.cursor = 0
        self.rounds = 0
        self.slices = 0


class PromptMaker:
    """Cuts exact-length prompts out of the seeded corpus, as tokenized by `tokenizer`."""

    def __init__(self, tokenizer: Tokenizer, *, seed: int, min_corpus_tokens: int = 32_768):
        self._tok = tokenizer
        self._paragraphs: Iterator[str] = corpus_paragraphs(seed)
        self._corpus: list[int] = []
        self._min_corpus_tokens = min_corpus_tokens

    @property
    def tokenizer(self) -> Tokenizer:
        return self._tok

    def make_prompt(self, n_tokens: int, rng: random.Random) -> str:
        """A text that encodes to exactly `n_tokens` tokens."""
        return self.make_prompts([n_tokens], rng)[0]

    def make_prompts(
        self,
        n_tokens: Sequence[int],
        rng: random.Random,
        *,
        prefixes: Sequence[str] | None = None,
    ) -> list[str]:
        """One text per entry: `prefixes[i]` followed by exactly `n_tokens[i]` more tokens.

        The whole text encodes to the prefix's own tokens, unchanged, then `n_tokens[i]`
        others, so prompts with the same prefix really share those tokens. Deterministic for
        a given `rng` state, tokenizer and call sequence.
        """
        prefix_of = list(prefixes) if prefixes is not None else [""] * len(n_tokens)
        if len(prefix_of) != len(n_tokens):
            raise ValueError("prefixes and n_tokens differ in length")
        for n, prefix in zip(n_tokens, prefix_of, strict=True):
            if n < 0 or (n == 0 and not prefix):
                raise ConfigError(f"--input-tokens must be at least 1, got {n}")
        prefix_ids = self._encode_distinct(prefix_of)
        results = list(prefix_of)
        jobs = [
            _Job(i, n, prefix_of[i], prefix_ids[prefix_of[i]])
            for i, n in enumerate(n_tokens)
            if n > 0
        ]
        self._ensure_corpus(max((job.n_tokens for job in jobs), default=0))
        for job in jobs:
            self._new_slice(job, rng)
        while jobs:
            jobs = self._round(jobs, results, rng)
        return results

    def _round(self, jobs: list[_Job], results: list[str], rng: random.Random) -> list[_Job]:
        tails = self._tok.decode_batch([job.tail for job in jobs])
        texts = [
            job.prefix + _tidy(tail, bool(job.prefix))
            for job, tail in zip(jobs, tails, strict=True)
        ]
        pending: list[_Job] = []
        for job, text, ids in zip(jobs, texts, self._tok.encode_batch(texts), strict=True):
            cut = len(job.prefix_ids)
            if len(ids) == cut + job.n_tokens and ids[:cut] == job.prefix_ids:
                results[job.index] = text
                continue
            job.rounds += 1
            if ids[:cut] != job.prefix_ids or job.rounds >= MAX_ROUNDS_PER_SLICE:
                self._new_slice(job, rng)
            elif len(ids) - cut > job.n_tokens:
                job.tail = ids[cut : cut + job.n_tokens]
            else:
                missing = job.n_tokens - (len(ids) - cut)
                job.tail = ids[cut:] + self._take(job.cursor, missing)
                job.cursor += missing
            pending.append(job)
        return pending

    def _new_slice(self, job: _Job, rng: random.Random) -> None:
        if job.slices >= MAX_SLICES:
            raise ConfigError(
                f"could not make a prompt of exactly {job.n_tokens} tokens with the tokenizer "
                f"{self._tok.name} after {MAX_SLICES} tries",
                hint="the tokenizer does not round-trip text; try another --tokenizer",
            )
        job.slices += 1
        job.rounds = 0
        start = rng.randrange(len(self._corpus) - job.n_tokens)
        job.tail = self._corpus[start : start + job.n_tokens]
        job.cursor = start + job.n_tokens

    def _take(self, cursor: int, count: int) -> list[int]:
        size = len(self._corpus)
        return [self._corpus[(cursor + i) % size] for i in range(count)]

    def _ensure_corpus(self, longest_tokens: int) -> None:
        # Twice the longest prompt, so slices start at varied places even for long prompts.
        needed = max(self._min_corpus_tokens, 2 * longest_tokens + 1)
        while len(self._corpus) < needed:
            # Chunks are encoded apart but joined by a space after a full stop, where
            # tokenizers split anyway, so a slice across two chunks still round-trips.
            chunks = [
                " " + "\n\n".join(next(self._paragraphs) for _ in range(_PARAGRAPHS_PER_CHUNK))
                for _ in range(_CHUNKS_PER_CALL)
            ]
            for ids in self._tok.encode_batch(chunks):
                self._corpus.extend(ids)

    def _encode_distinct(self, prefixes: Sequence[str]) -> dict[str, list[int]]:
        distinct = sorted(set(prefixes) - {""})
        encoded = dict(zip(distinct, self._tok.encode_batch(distinct), strict=True))
        return {"": [], **encoded}


def _tidy(text: str, after_prefix: bool) -> str:
    # No whitespace at either end: chat templates often trim message content, which would
    # change a count that ended or began with a space. After a prefix one space keeps the
    # first word from merging into the prefix's last one.
    core = text.strip()
    return " " + core if after_prefix and core else core
