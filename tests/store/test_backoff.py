"""The one retry policy: delays double up to a cap, jittered, and stop at the deadline."""

from tracedb.backoff import Backoff


def test_delays_double_up_to_the_cap_each_drawn_between_half_and_the_whole():
    draws = []

    def rng(lo, hi):
        draws.append((lo, hi))
        return hi

    b = Backoff(first_s=0.1, max_s=0.5, rng=rng)
    delays = [b.next_delay() for _ in range(5)]
    assert delays == [0.1, 0.2, 0.4, 0.5, 0.5]
    assert draws == [(0.05, 0.1), (0.1, 0.2), (0.2, 0.4), (0.25, 0.5), (0.25, 0.5)]


def test_real_jitter_stays_inside_its_bounds_and_spreads_clients_apart():
    delays = {Backoff(first_s=1.0, max_s=1.0).next_delay() for _ in range(50)}
    assert all(0.5 <= d <= 1.0 for d in delays)
    assert len(delays) > 10  # not one value for every client


def test_no_delay_is_given_past_the_deadline():
    now = [100.0]
    b = Backoff(first_s=1.0, max_s=8.0, deadline=103.5, clock=lambda: now[0], rng=lambda lo, hi: hi)
    assert b.next_delay() == 1.0
    now[0] += 1.0
    assert b.next_delay() == 2.0
    now[0] += 2.0
    assert b.next_delay() is None  # 103 + 4 > 103.5: give up now rather than sleep past it
    assert b.attempts == 2


def test_reset_starts_again_from_the_first_delay():
    b = Backoff(first_s=0.1, max_s=10.0, rng=lambda lo, hi: hi)
    for _ in range(4):
        b.next_delay()
    b.reset()
    assert b.next_delay() == 0.1
