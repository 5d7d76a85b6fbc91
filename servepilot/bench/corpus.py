"""Seeded English-like text: the raw material random prompts are cut from.

Built in rather than downloaded, so a benchmark needs no network and a seed names the exact text.
Sentences mix common function words with content words, capitals, commas and several kinds of
end punctuation, so the token statistics resemble prose rather than a repeated phrase.
"""

from __future__ import annotations

import random
from collections.abc import Iterator


def _words(text: str) -> tuple[str, ...]:
    return tuple(text.split())


_FUNCTION_WORDS = _words(
    """
the of and to in is that for it as was with be by on not he this are or his from at which but
have an they you were her she there would their we him been has when who will more no if out so
what up its about into than them can only other some could these then do any my now such like
our over me even most after also did many before must through where much your way well should
because each just those how too very still own while might us off since against both under
"""
)

_CONTENT_WORDS = _words(
    """
time people year day man world life hand part child eye woman place work week case point
government company number group problem fact water room mother area money story month lot right
study book job word business issue side kind head house service friend father power hour game
line end member law car city community name president team minute idea kid body information back
parent face others level office door health person art war history party result change morning
reason research girl guy moment air teacher force education foot boy age policy music market sense
nation plan college interest death experience effect class control care field development role
effort rate heart drug show leader light voice wife police mind price report decision son view
relationship town road arm difference value building action model season society tax director
position player record paper space ground form event official matter center couple site project
activity star table need court oil situation cost industry figure street image phone data picture
practice piece land product doctor wall patient worker news test movie north love support
technology step baby computer type attention film tree source organization hair window evidence
population site garden river mountain engine server request memory cache token network signal
say get make go know take see come think look want give use find tell ask seem feel try leave
call keep let begin help talk turn start show hear play run move live believe hold bring happen
write provide sit stand lose pay meet include continue set learn lead understand watch follow stop
create speak read allow add spend grow open walk win offer remember consider appear buy wait serve
die send expect build stay fall cut reach kill remain suggest raise pass sell require report decide
good new first last long great little own other old big high different small large next early young
important few public bad same able free sure clear whole strong real best better true federal
special easy certain personal open red difficult available likely short single medical current
wrong private past foreign fine common poor natural significant similar hot dead central happy
serious ready simple left physical general environmental financial blue democratic dark various
entire close legal religious cold final main green nice huge popular traditional cultural quiet
quickly slowly carefully often never always sometimes together almost already really probably
"""
)

_END_MARKS = (".", ".", ".", ".", "?", "!", ";")


def corpus_paragraphs(seed: int) -> Iterator[str]:
    """An endless stream of paragraphs; the same seed always gives the same stream."""
    rng = random.Random(f"servepilot-corpus/{seed}")
    while True:
        yield " ".join(_sentence(rng) for _ in range(rng.randint(3, 8)))


def _sentence(rng: random.Random) -> str:
    words = [_word(rng) for _ in range(rng.randint(5, 22))]
    if len(words) > 8 and rng.random() < 0.4:
        words[rng.randrange(3, len(words) - 3)] += ","
    if rng.random() < 0.05:
        words.insert(rng.randrange(len(words)), str(rng.randint(2, 2030)))
    return words[0].capitalize() + " " + " ".join(words[1:]) + rng.choice(_END_MARKS)


def _word(rng: random.Random) -> str:
    # Roughly the share of function words in English prose.
    pool = _FUNCTION_WORDS if rng.random() < 0.45 else _CONTENT_WORDS
    return rng.choice(pool)
