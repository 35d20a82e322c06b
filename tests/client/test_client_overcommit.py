from __future__ import annotations

import pytest

from pagedserve.client.overcommit import Overcommit


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
