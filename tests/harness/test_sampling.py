"""The observers' sampler (e2e/lib/sampling.py): a failing tick is recorded and sampling goes on."""
import time

from e2e.lib.sampling import Sampler


class Flaky(Sampler):
    name = "flaky"

    def __init__(self):
        super().__init__(t0=time.time(), interval=0.01, error_chars=40)
        self.ticks = 0

    def tick(self):
        self.ticks += 1
        if self.ticks == 2:
            raise RuntimeError("the API server went away for a moment " * 3)
        return self.ticks


def test_a_failing_tick_is_recorded_and_the_sampling_goes_on():
    sampler = Flaky().start()
    deadline = time.monotonic() + 10
    while sampler.ticks < 5 and time.monotonic() < deadline:
        time.sleep(0.01)
    sampler.stop()
    assert sampler.ticks >= 5
    assert len(sampler.errors) == 1 and "RuntimeError: the API server" in sampler.errors[0]
    assert len(sampler.errors[0]) == 40
    stopped_at = sampler.ticks
    time.sleep(0.05)
    assert sampler.ticks == stopped_at, "no tick after stop()"
