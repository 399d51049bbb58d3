"""The price table: (provider, model) -> price per 1M input and output tokens from a UTC date.

Costs are computed at query time in Decimal from the summed tokens, so a corrected price
re-prices history. Pure: parsing and lookups, no I/O except `load` reading one file.
"""

import bisect
import functools
import tomllib
from dataclasses import dataclass
from datetime import date
from decimal import Decimal
from pathlib import Path

SHIPPED = Path(__file__).with_name("data") / "prices.toml"
MILLION = Decimal(1_000_000)


@dataclass(frozen=True, slots=True)
class Price:
    provider: str
    model: str
    input_per_1m: Decimal
    output_per_1m: Decimal
    effective_from: date


class PriceTable:
    def __init__(self, currency: str, prices: list[Price]) -> None:
        self.currency = currency
        self._by_model: dict[tuple[str, str], list[Price]] = {}
        for price in sorted(prices, key=lambda p: p.effective_from):
            self._by_model.setdefault((price.provider, price.model), []).append(price)
        self._starts = {k: [p.effective_from for p in v] for k, v in self._by_model.items()}
        # The table never changes once loaded, and a 30-day hourly trend asks for the same
        # (provider, model, day) 24 times: remember recent answers.
        self.at = functools.lru_cache(maxsize=16_384)(self._at)  # type: ignore[method-assign]

    def all(self) -> list[Price]:
        """Every row, by provider, model and start."""
        return [p for key in sorted(self._by_model) for p in self._by_model[key]]

    def at(self, provider: str, model: str, day: date) -> Price | None:
        """The price in force on `day` (UTC), or None when none applies yet or the model is unknown."""
        return self._at(provider, model, day)

    def _at(self, provider: str, model: str, day: date) -> Price | None:
        starts = self._starts.get((provider, model))
        if not starts:
            return None
        i = bisect.bisect_right(starts, day) - 1
        return self._by_model[(provider, model)][i] if i >= 0 else None

    def cost(self, provider: str, model: str, day: date, input_tokens: int, output_tokens: int) -> Decimal:
        """Exact cost of tokens used on `day`; zero for an unpriced model (it is still counted)."""
        price = self.at(provider, model, day)
        if price is None:
            return Decimal(0)
        return (Decimal(input_tokens) * price.input_per_1m + Decimal(output_tokens) * price.output_per_1m) / MILLION


def parse(text: str) -> PriceTable:
    raw = tomllib.loads(text)
    currency = str(raw["currency"])
    prices = [
        Price(
            provider=str(row["provider"]),
            model=str(row["model"]),
            input_per_1m=Decimal(str(row["input_per_1m"])),
            output_per_1m=Decimal(str(row["output_per_1m"])),
            effective_from=_as_date(row["effective_from"]),
        )
        for row in raw.get("prices", [])
    ]
    for p in prices:
        if p.input_per_1m < 0 or p.output_per_1m < 0:
            raise ValueError(f"negative price for {p.provider}/{p.model}")
    seen = [(p.provider, p.model, p.effective_from) for p in prices]
    if len(seen) != len(set(seen)):
        raise ValueError("two prices for the same provider, model and effective_from")
    return PriceTable(currency, prices)


def _as_date(value: object) -> date:
    if isinstance(value, date):
        return value
    return date.fromisoformat(str(value))


def load(path: str | None = None) -> PriceTable:
    """The table from `path` (METERING_PRICES_FILE) or the one shipped with the service."""
    return parse(Path(path).read_text() if path else SHIPPED.read_text())
