"""The Clock port: use cases ask it for "now" (UTC), so tests can set the time (a fake clock).

The system clock lives in `services/runtime/platform/clock.py`.
"""

from collections.abc import Callable
from datetime import datetime

Clock = Callable[[], datetime]
