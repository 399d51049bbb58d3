"""The model this gateway calls: a fake, so the example runs anywhere. It counts tokens as words
and answers by echoing the last user message, then reciting, one token at a time."""

import asyncio
from collections.abc import AsyncIterator, Sequence
from typing import Any

PROVIDER = "tollgate-fake"
MODEL = "parrot-1"
QUALIFIED = f"{PROVIDER}/{MODEL}"  # as a key's allowed_models names it
PER_MESSAGE = 3  # a message's framing costs tokens too, as with real chat models
RECITAL = (
    "Tollgate meters every token of this answer: it was reserved before the first word and settled "
    "with the real count after the last."
).split()


def text_of(content: str | Sequence[Any] | None) -> str:
    """A message's text: a string, or the text parts of a list of parts."""
    if content is None or isinstance(content, str):
        return content or ""
    return " ".join(str(part.get("text", "")) for part in content if isinstance(part, dict))


def prompt_tokens(messages: Sequence[tuple[str, str]]) -> int:
    return sum(PER_MESSAGE + len(text.split()) for _role, text in messages)


def answer_tokens(messages: Sequence[tuple[str, str]]) -> list[str]:
    last_user = next((text for role, text in reversed(messages) if role == "user"), "")
    return ["You", "said:", *last_user.split(), *RECITAL]


async def complete(messages: Sequence[tuple[str, str]], max_tokens: int, delay: float) -> AsyncIterator[str]:
    """The answer's tokens (at most `max_tokens`), each after `delay` seconds, as a model streams."""
    for index, word in enumerate(answer_tokens(messages)[:max_tokens]):
        await asyncio.sleep(delay)
        yield word if index == 0 else " " + word
