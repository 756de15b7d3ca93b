"""A clock for tests of code that measures intervals (imgcls.training.timing, imgcls.bench.inference): `sleep` moves it,
nothing waits, so the intervals the code measures are exactly the ones the test made, on any machine under any
load. Patched in as the module's `time` (the code under test calls time.perf_counter)."""

from __future__ import annotations


class FakeClock:
    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def perf_counter(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds
