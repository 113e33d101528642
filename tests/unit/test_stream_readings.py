"""How forget reads a stream entry that gives a field name more than once
(``worker.erasure.readings``): each other value is a reading of its own, up to a cap, so a
publisher's entry of thousands of repeated values cannot make a forget copy its fields for each."""

from __future__ import annotations

from worker.erasure.readings import READINGS_CAP, entry_of


def test_an_entry_naming_a_field_twice_is_judged_by_each_value() -> None:
    entry = entry_of(b"1-0", [b"data", b'{"user_id":"uma"}', b"data", b"{}"])
    assert entry.fields == {b"data": b"{}"}  # the worker's reading: the last value
    assert [r[b"data"] for r in entry.readings] == [b"{}", b'{"user_id":"uma"}']
    assert entry.pairs is not None and len(entry.pairs) == 2


def test_a_name_given_thousands_of_times_gives_at_most_the_cap_of_readings() -> None:
    flat: list[bytes] = []
    for n in range(5_000):
        flat += [b"data", b'{"n":%d}' % n]
    entry = entry_of(b"1-0", flat)
    assert entry.fields == {b"data": b'{"n":4999}'}
    assert entry.readings[0] is entry.fields
    assert len(entry.readings) == READINGS_CAP + 1
    assert entry.readings[1] == {b"data": b'{"n":0}'}  # the first values, in order
