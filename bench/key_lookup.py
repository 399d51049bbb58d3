"""Key lookup timing: does refusing a guess take longer the more of the key it gets right?

No stack needed. The edge's own path (`Edge._authenticate_key`: SHA-256, then a dict lookup in
the key projection) with 100,000 keys loaded. Interleaved batches of three kinds of wrong guess
against one real key: unrelated (the baseline, same run), right in the first half, right in all
but the last character. Equal medians (ratio ~1.00) mean timing does not tell how close a guess is.
Printed, never asserted (tests/hostile/test_key_lookup.py asserts the structure instead).

    .venv/bin/python bench/key_lookup.py [--keys 100000] [--rounds 400]
"""

import argparse
import statistics
import sys
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.stats import ratio_line
from contracts.common import KeyStatus, Role
from contracts.credentials import hash_secret, new_api_key
from contracts.events import KeyState
from services.edge.edge import Edge
from services.edge.errors import ApiError
from services.runtime.platform.settings import Settings

BATCH = 50


def _load(edge: Edge, count: int) -> str:
    now = datetime.now(UTC)
    secret = ""
    for _ in range(count):
        secret = new_api_key()
        edge.keys.apply(
            KeyState(
                time=now,
                account_id=uuid.uuid4(),
                key_id=uuid.uuid4(),
                hash=hash_secret(secret),
                status=KeyStatus.ENABLED,
                roles=[Role.OWNER],
            )
        )
    return secret


def _batch_ns(edge: Edge, guess: str, now: datetime) -> float:
    started = time.perf_counter_ns()
    for _ in range(BATCH):
        try:
            edge._authenticate_key(guess, now)
        except ApiError:
            pass
    return (time.perf_counter_ns() - started) / BATCH


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--keys", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=400)
    args = parser.parse_args()
    edge = Edge(Settings())
    edge.assume_caught_up()  # fed by hand
    real = _load(edge, args.keys)
    body = real.removeprefix("sk-")
    other = new_api_key()
    guesses = {
        "unrelated": other,
        "first half right": "sk-" + body[: len(body) // 2] + other[3 + len(body) // 2 :],
        "all but last right": real[:-1] + ("A" if real[-1] != "A" else "B"),
    }
    now = datetime.now(UTC)
    samples: dict[str, list[float]] = {name: [] for name in guesses}
    for _ in range(args.rounds):  # interleaved, so drift in machine load hits every kind alike
        for name, guess in guesses.items():
            samples[name].append(_batch_ns(edge, guess, now))
    medians = {name: statistics.median(s) for name, s in samples.items()}
    print(f"key lookup refusals, {len(edge.keys)} keys loaded, {args.rounds} x {BATCH} per kind (median ns per refusal)")
    for name, median in medians.items():
        print(f"  {name:>20}: {median:8.0f} ns")
    for name in ("first half right", "all but last right"):
        print(ratio_line(f"{name} vs unrelated", medians[name], medians["unrelated"], "ns"))


if __name__ == "__main__":
    main()
