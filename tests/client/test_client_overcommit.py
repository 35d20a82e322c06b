from __future__ import annotations

import pytest

from pagedserve.client.adaptive.overcommit import Overcommit, projected_capacity, projection_fits
from pagedserve.common.load_hints import LoadHints


def answered(overcommit: Overcommit, count: int, used: int = 100, now: float = 0.0,
             round_trip: float = 1.0) -> None:
    for _ in range(count):
        overcommit.on_answer(100, used, now=now, sent_at=now - round_trip)


def test_no_growth_before_enough_answers():
    o = Overcommit(interval_s=0.25, kv_usage_low=0.75)
    answered(o, 7)
    assert o.growth(0.5, 0.3, tokens_full=True, now=1.0) is None
    answered(o, 1)
    assert o.growth(0.5, 0.3, tokens_full=True, now=1.0) == 1.25


def test_no_growth_without_evidence_or_while_reservations_do_not_bind():
    o = Overcommit(interval_s=0.25, kv_usage_low=0.75)
    answered(o, 20)
    assert o.growth(0.8, 0.3, tokens_full=True, now=1.0) is None  # the cache holds 0.8
    assert o.growth(0.5, 0.3, tokens_full=False, now=1.0) is None
    assert o.growth(0.5, 0.8, tokens_full=True, now=1.0) is None  # past kv_usage_low


def test_early_stops_are_evidence_on_their_own():
    o = Overcommit(interval_s=0.25, kv_usage_low=0.75)
    answered(o, 40, used=20)
    assert o.used_share < 0.6
    assert o.growth(0.9, 0.3, tokens_full=True, now=1.0) == 1.25


def test_growth_stops_short_of_kv_usage_low_and_waits_a_round_trip():
    o = Overcommit(interval_s=0.25, kv_usage_low=0.75)
    answered(o, 20, round_trip=2.0)
    assert o.growth(0.6, 0.7, tokens_full=True, now=1.0) == pytest.approx(0.75 / 0.7)
    assert o.growth(0.6, 0.3, tokens_full=True, now=2.0) is None  # within a round trip
    assert o.growth(0.6, 0.3, tokens_full=True, now=3.0) == 1.25


def test_a_cache_low_for_a_whole_round_trip_allows_a_doubling():
    o = Overcommit(interval_s=0.25, kv_usage_low=0.75)
    answered(o, 20, round_trip=1.0)
    assert o.round_trip_s == pytest.approx(1.0, rel=0.2)
    # Low from t=1 on: young answers look the same at first, so a quarter only.
    assert o.growth(0.2, 0.1, tokens_full=True, now=1.0) == 1.25
    assert o.growth(0.2, 0.1, tokens_full=True, now=1.5) is None
    assert o.growth(0.2, 0.1, tokens_full=True, now=2.5) == 2.0
    # Once the cache holds more, the streak ends.
    assert o.growth(0.5, 0.1, tokens_full=True, now=4.0) == 1.25


def hints(projected: float | None, running: int = 10, waiting: int = 0) -> LoadHints:
    return LoadHints(0.5, waiting, running, 500, 0, 20.0, 0, projected)


def test_a_projection_under_target_lends_its_room_on_top_of_what_the_server_has_seen():
    # 12 requests of 400 tokens in flight, 10 of them on the server: the 2 on their way
    # are not in its projection. The projected peak at 0.55 of 4,000 tokens leaves 0.4.
    assert projected_capacity(hints(0.55), 4800, 12, 4000) == pytest.approx(4000 + 1600)
    # Never under the 0.9 of the cache that reservations alone keep safe.
    assert projected_capacity(hints(0.55), 1200, 12, 4000) == pytest.approx(3600)
    assert projection_fits(hints(0.95)) and not projection_fits(hints(0.96))


def test_a_projection_over_target_takes_back_the_excess_down_to_the_safe_share():
    assert projected_capacity(hints(1.0, running=40), 4000, 40, 4000) == pytest.approx(3800)
    assert projected_capacity(hints(1.5, running=40), 4000, 40, 4000) == pytest.approx(3600)


def test_no_projection_no_capacity():
    assert projected_capacity(hints(None), 1200, 12, 4000) is None
    assert not projection_fits(hints(None))
