"""What the usage rules (contracts/usage_rules.py) cost the metering sink's validation.

`services.metering.validation.judge` over a batch the size of the sink's (50k usage.v1 records,
with record timestamps), with the rules (as the sink runs it) against without them (the baseline,
measured in the same run, alternating). Pure CPU, no infrastructure.

(issue 38) Also the same judge, rules included, without its msgspec first pass (pydantic alone, as
before contracts/fast_events.py), alternating in the same run: CPU time of this process per event.

Run: .venv/bin/python bench/usage_rules.py   (BENCH_ROUNDS to resize)
"""

import gc
import os
import statistics
import sys
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from unittest.mock import patch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from aiokafka.structs import ConsumerRecord

from bench.stats import ratio_line
from contracts.common import Resource
from contracts.events import UsageEvent
from services.metering import validation
from services.metering.consumers import MAX_RECORDS
from services.metering.ingest import usage_rules
from services.metering.validation import judge

ROUNDS = int(os.environ.get("BENCH_ROUNDS", "7"))


def records(n: int) -> list[ConsumerRecord]:
    now = datetime.now(UTC)
    accounts = [uuid.uuid4() for _ in range(50)]
    made = []
    for i in range(n):
        e = UsageEvent(
            time=now - timedelta(seconds=i % 3600),
            account_id=accounts[i % 50],
            resource=Resource.AI_TOKENS,
            quantity=30,
            provider="openai",
            model="gpt-4o",
            input_tokens=10,
            output_tokens=20,
            source="bench",
        )
        value = e.model_dump_json().encode()
        stamp = int(now.timestamp() * 1000)
        made.append(ConsumerRecord("usage.v1", 0, i, stamp, 0, None, value, None, len(value), -1, []))
    return made


def main() -> None:
    batch = records(MAX_RECORDS)
    values = [r.value for r in batch]
    gc.collect()
    gc.freeze()  # as the host does after start: the batch is not what the collector should walk
    with_rules: list[float] = []
    without: list[float] = []
    pydantic_cpu: list[float] = []
    first_pass_cpu: list[float] = []
    for _ in range(ROUNDS):
        started = time.process_time()
        with patch.object(validation, "fast_decoder", lambda _model: None):
            old = judge(UsageEvent, values, usage_rules(batch))
        pydantic_cpu.append(time.process_time() - started)
        started = time.process_time()
        new = judge(UsageEvent, values, usage_rules(batch))
        first_pass_cpu.append(time.process_time() - started)
        assert old == new and not new.rejected
        started = time.perf_counter()
        plain = judge(UsageEvent, values)
        without.append(time.perf_counter() - started)
        started = time.perf_counter()
        ruled = judge(UsageEvent, values, usage_rules(batch))
        with_rules.append(time.perf_counter() - started)
        assert not plain.rejected and not ruled.rejected
    n = len(values)
    measured = n / statistics.median(with_rules)
    baseline = n / statistics.median(without)
    print(f"batch of {n:,} usage.v1 records, {ROUNDS} rounds, medians")
    print(ratio_line("judge with the usage rules", measured, baseline, "events/s"))
    per_event_us = (statistics.median(with_rules) - statistics.median(without)) / n * 1e6
    print(f"the rules' cost: {per_event_us:.2f} us per event")
    old_us, new_us = (statistics.median(cpu) / n * 1e6 for cpu in (pydantic_cpu, first_pass_cpu))
    print(f"judge with the rules, CPU per event: msgspec first pass {new_us:.2f} us vs pydantic alone {old_us:.2f} us")


if __name__ == "__main__":
    main()
