"""Contract validation of the sink's raw messages: what is written, and what is dead-lettered.

The verdict names only the messages that do not go on as they came (the refused, and the
lenient ones rewritten in the contract's strict form): an all-valid batch is written as it came.
"""

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from uuid import UUID

from pydantic import ValidationError

from contracts.events import MISSING_ID, Event, has_id
from contracts.fast_events import Decoded, fast_decoder

# Why a message is dead-lettered (the `reason` label of tollgate_metering_sink_dead_lettered_total).
MALFORMED, MISSING_ID_REASON, RULES_BROKEN = "malformed", "missing_id", "rules_broken"
DEAD_LETTER_REASONS = (MALFORMED, MISSING_ID_REASON, RULES_BROKEN)

# A contract's rules beyond the schema, for the message at an index (its record's timestamp is
# the reference): the reasons it breaks them, joined, or None.
# The event is the contract's model or its msgspec mirror (contracts/fast_events.py).
Rules = Callable[[int, Decoded], str | None]
# (v4) Whether a valid event is stored flagged (usage whose key does not allow its model).
Flag = Callable[[Decoded], bool]


@dataclass(frozen=True, slots=True)
class Verdict:
    rejected: list[tuple[int, str]] = field(default_factory=list)  # (index, error) of the malformed
    rewritten: list[tuple[int, bytes]] = field(default_factory=list)  # (index, strict form) of the lenient
    reasons: dict[str, int] = field(default_factory=dict)  # how many were refused, by reason
    flagged: list[UUID] = field(default_factory=list)  # (v4) ids of the valid events `flag` marked

    def refuse(self, index: int, reason: str, error: str) -> None:
        self.rejected.append((index, error))
        self.reasons[reason] = self.reasons.get(reason, 0) + 1

    def lines(self, values: Sequence[bytes]) -> list[bytes]:
        """The JSON documents to write: `values` without the refused, the lenient rewritten."""
        if not self.rejected and not self.rewritten:
            return list(values)
        lines: list[bytes | None] = list(values)
        for i, strict in self.rewritten:
            lines[i] = strict
        for i, _ in self.rejected:
            lines[i] = None
        return [line for line in lines if line is not None]


def judge(model: type[Event], values: Sequence[bytes], rules: Rules | None = None, flag: Flag | None = None) -> Verdict:
    """Validate each raw message once. One in the contract's strict form is written as it came;
    one only valid leniently (a number as a string, a time as a Unix number) is written as the
    model serialises it, so the engine reads exactly what the contract read. A message without
    an id is refused: the model would invent a new one at every redelivery; so is one that
    breaks `rules` (applied to the event already parsed: no second parse). The ids of the valid
    events `flag` marks are listed (judged on the same parse).

    (issue 38) A model with a msgspec mirror decodes with it first: what the mirror accepts the
    model accepts strictly, with the same values; the rest (refused, lenient, or only unusual)
    goes the model's way, which gives the same verdicts and reasons as before."""
    fast = fast_decoder(model)
    validate = model.__pydantic_validator__.validate_json  # without model_validate_json's wrapper
    verdict = Verdict()
    for i, value in enumerate(values):
        event: Decoded | None = fast(value) if fast is not None else None
        lenient: Event | None = None  # the model's event, when it was only valid leniently
        if event is None:
            try:
                event = parsed = validate(value, strict=True)
            except ValidationError:
                try:
                    event = parsed = lenient = model.model_validate_json(value)
                except ValidationError as exc:
                    verdict.refuse(i, MALFORMED, str(exc))
                    continue
            if not has_id(parsed):
                verdict.refuse(i, MISSING_ID_REASON, MISSING_ID)
                continue
        broken = rules(i, event) if rules is not None else None
        if broken:
            verdict.refuse(i, RULES_BROKEN, broken)
            continue
        if flag is not None and flag(event):
            verdict.flagged.append(event.id)
        if lenient is not None:
            verdict.rewritten.append((i, lenient.model_dump_json().encode()))
    return verdict
