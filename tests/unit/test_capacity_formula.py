"""The capacity arithmetic of `memworker stats` (no server: measurements given by hand)."""

from __future__ import annotations

import math

import pytest

from worker.keys import DEDUPE_KIND, SEQ_KIND
from worker.ops.capacity import assess
from worker.ops.capacity_sampling import KeySample, RateMeter, StreamUsage
from worker.settings import Settings

SETTINGS = Settings(
    stream_prefix="agents",
    retention_seconds=3600,
    dedupe_ttl_seconds=600,
    tombstone_ttl_seconds=1200,
    session_ttl_seconds=100,
)
MB = 1_000_000


def measured() -> tuple[KeySample, list[StreamUsage]]:
    """100 finished sessions of 4 commands: 400 dedupe records, 100 seq counters."""
    sample = KeySample(scanned=1_000, complete=True)
    sample.kinds["finished"].seen, sample.kinds["finished"].measured = 100, 10
    sample.kinds["finished"].bytes = 10 * 300
    sample.kinds[DEDUPE_KIND].seen, sample.kinds[DEDUPE_KIND].measured = 400, 10
    sample.kinds[DEDUPE_KIND].bytes = 10 * 100
    sample.kinds[SEQ_KIND].seen, sample.kinds[SEQ_KIND].measured = 100, 10
    sample.kinds[SEQ_KIND].bytes = 10 * 80
    streams = [
        StreamUsage("agents:lifecycle:{0}", 400, 400 * 200, 400, 0, 1000),
        StreamUsage("agents:results:{0}", 400, 400 * 500, 400, 0, 1000),
    ]
    return sample, streams


def test_one_gb_sustains_1e9_over_the_sum_of_bytes_times_seconds_held() -> None:
    sample, streams = measured()
    c = assess(SETTINGS, (10 * MB, 0, "noeviction"), 1_000, sample, streams, 1.0, "test")
    byte_seconds = (
        (200 + 500) * 3600  # the command's two stream entries, held for retention
        + 100 * 600  # its dedupe record
        + 300 / 4 * 1200  # a quarter of its session's tombstone (the longer window)
        + 80 / 4 * 1200  # a quarter of the seq counter, kept as long after the terminate
    )
    assert c.commands_per_session == 4
    assert c.byte_seconds_per_command == pytest.approx(byte_seconds)
    assert c.commands_per_second_per_gb == pytest.approx(1e9 / byte_seconds)
    assert c.bytes_per_finished_session == pytest.approx(300 + 80)  # tombstone + seq counter
    assert c.verdict.startswith("no maxmemory") and c.seconds_until_full is None


def test_each_command_carries_its_share_of_an_episode_announcement_for_the_retention() -> None:
    sample, streams = measured()
    without = assess(SETTINGS, (10 * MB, 0, "noeviction"), 1_000, sample, streams, 1.0, "t")
    # 100 sessions of 4 commands announced 100 episodes of ~600 B each (P:episodes).
    streams.append(StreamUsage("agents:episodes", 100, 100 * 600, 100, 0, 1000))
    c = assess(SETTINGS, (10 * MB, 0, "noeviction"), 1_000, sample, streams, 1.0, "t")
    assert c.bytes_per_episodes_entry == 600
    assert c.episodes_per_command == pytest.approx(100 / 400)
    assert without.byte_seconds_per_command is not None
    assert c.byte_seconds_per_command == pytest.approx(
        without.byte_seconds_per_command + 600 / 4 * 3600  # a quarter, held for retention
    )
    assert c.bytes_per_command == pytest.approx((without.bytes_per_command or 0) + 600 / 4)
    assert c.window_bytes_now == pytest.approx(without.window_bytes_now + 100 * 600)


def test_redis_that_levels_off_below_maxmemory_is_not_filling() -> None:
    sample, streams = measured()
    c = assess(SETTINGS, (10 * MB, 100 * MB, "noeviction"), 1_000, sample, streams, 1.0, "t")
    assert c.steady_state_used_memory is not None and c.steady_state_used_memory < 100 * MB
    assert c.seconds_until_full == math.inf
    assert c.verdict.startswith("not filling: at this rate Redis levels off at")


def test_redis_that_would_outgrow_maxmemory_is_full_when_the_growth_fills_the_room() -> None:
    sample, streams = measured()
    rate = 1_000.0
    c = assess(SETTINGS, (10 * MB, 20 * MB, "noeviction"), 1_000, sample, streams, rate, "t")
    assert c.bytes_per_command is not None
    assert c.seconds_until_full == pytest.approx(10 * MB / (rate * c.bytes_per_command))
    assert c.verdict.startswith("full in")


def test_no_commands_is_not_filling_and_no_reading_is_unknown() -> None:
    sample, streams = measured()
    idle = assess(SETTINGS, (10 * MB, 20 * MB, "noeviction"), 1_000, sample, streams, 0.0, "t")
    assert idle.seconds_until_full == math.inf and idle.verdict.startswith("not filling")
    unknown = assess(SETTINGS, (10 * MB, 20 * MB, "noeviction"), 1_000, sample, streams, None, "")
    assert unknown.seconds_until_full is None and unknown.verdict.startswith("rate unknown")


def test_a_partial_scan_scales_counts_by_the_share_of_keys_it_saw() -> None:
    sample = KeySample(scanned=100)
    sample.kinds[DEDUPE_KIND].seen = 25
    assert sample.estimate(DEDUPE_KIND, dbsize=10_000) == 2_500
    sample.complete = True
    assert sample.estimate(DEDUPE_KIND, dbsize=10_000) == 25


def test_the_rate_is_entries_added_over_the_readings_of_the_last_window() -> None:
    meter = RateMeter(window_s=60)
    assert meter.rate() is None
    meter.add(1_000, at=0.0)
    meter.add(1_500, at=10.0)
    assert meter.rate() == 50
    for t in range(20, 200, 10):
        meter.add(1_500 + 10 * t, at=float(t))
    assert meter.rate() == pytest.approx(10)  # the early, faster part has aged out


def test_an_evicting_policy_is_called_out() -> None:
    sample, streams = measured()
    c = assess(SETTINGS, (10 * MB, 100 * MB, "allkeys-lru"), 1_000, sample, streams, 1.0, "t")
    assert "maxmemory-policy allkeys-lru evicts memworker's keys" in c.verdict
    assert "set noeviction" in c.verdict


def test_without_dedupe_records_to_count_commands_per_session_come_from_the_stream() -> None:
    """A layout that keeps no dedupe record per key still gets the tombstone's share."""
    sample, streams = measured()
    sample.kinds[DEDUPE_KIND] = type(sample.kinds[DEDUPE_KIND])()
    c = assess(SETTINGS, (10 * MB, 0, ""), 1_000, sample, streams, 1.0, "t", 4.0)
    assert c.commands_per_session == 4
    assert c.byte_seconds_per_command == pytest.approx(
        (200 + 500) * 3600 + 300 / 4 * 1200 + 80 / 4 * 1200
    )
