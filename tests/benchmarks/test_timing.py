"""The benchmarks' timing loop: the order of the calls, warm-up, and the seconds it reports."""
import pytest

from benchmarks import timing


@pytest.fixture
def clock(monkeypatch):
    """A fake host clock that only the steps advance."""
    state = {'now': 0.0}
    monkeypatch.setattr(timing.time, 'perf_counter', lambda: state['now'])
    return state


def test_rounds_call_every_step_in_turns_after_the_warm_up(clock):
    calls = []

    def step(name, seconds):
        def run():
            calls.append(name)
            clock['now'] += seconds
        return run

    times = timing.paired_rounds({'a': step('a', 1.0), 'b': step('b', 2.0)}, 3, warmup=1)
    assert calls == ['a', 'b'] * 4
    assert times == {'a': [1.0, 1.0, 1.0], 'b': [2.0, 2.0, 2.0]}


def test_rotated_rounds_start_with_the_next_step_and_callbacks_run_untimed(clock):
    calls = []

    def step(name):
        return lambda: calls.append(name)

    def before_round():
        calls.append('|')
        clock['now'] += 10.0

    def after_step(name):
        calls.append(f'after {name}')
        clock['now'] += 10.0

    times = timing.paired_rounds({n: step(n) for n in 'abc'}, 4, rotate=True, before_round=before_round,
                                 after_step=after_step)
    order = [c for c in calls if c in 'abc|']
    assert ''.join(order) == '|abc|bca|cab|abc'
    assert calls[:3] == ['|', 'a', 'after a']
    assert times == {n: [0.0] * 4 for n in 'abc'}  # the callbacks' time is in no step's


def test_steps_with_their_own_clock_report_their_seconds():
    reported = iter([0.5, 0.25, 0.125])
    assert timing.paired_rounds({'run': lambda: next(reported)}, 3, own_clock=True) == {'run': [0.5, 0.25, 0.125]}


def test_time_calls_and_median(clock):
    durations = iter([100.0, 3.0, 1.0, 2.0])  # the first call is the warm-up

    def step():
        clock['now'] += next(durations)

    assert timing.time_calls(step, 3, warmup=1) == [3.0, 1.0, 2.0]
    durations = iter([100.0, 3.0, 1.0, 2.0])
    assert timing.time_median(step, repeats=3, warmup=1) == 2.0
