"""How forget reads a stream entry that gives a field name more than once, or bare ids beside
its ``data`` (``worker.erasure.readings``): each value of a name that says whose the entry is
makes a reading of its own, however many there are, and carries only those names, so a
publisher's entry of thousands of values costs a forget the entry's size, and no value
escapes it."""

from __future__ import annotations

from worker.erasure.readings import SCOPE_NAMES, entry_of

SPAWN = b'{"type":"spawn","project_id":"n3","session_id":"s9","user_id":"uma","initial_state":{}}'


def test_an_entry_naming_a_field_twice_is_judged_by_each_value() -> None:
    entry = entry_of(b"1-0", [b"data", b'{"user_id":"uma"}', b"data", b"{}"])
    assert entry.fields == {b"data": b"{}"}  # the worker's reading: the last value
    assert [r[b"data"] for r in entry.readings] == [b"{}", b'{"user_id":"uma"}']
    assert entry.pairs is not None and len(entry.pairs) == 2


def test_a_value_among_thousands_is_read_and_each_reading_carries_only_scope_names() -> None:
    flat: list[bytes] = []
    for n in range(3_000):
        flat += [b"data", b"j%d" % n, b"junk%d" % (n % 50), b"x"]
    flat[2_000 * 4 + 1] = SPAWN
    flat += [b"data", b"x"]
    entry = entry_of(b"1-0", flat)
    assert entry.fields[b"data"] == b"x"
    assert any(r.get(b"data") == SPAWN for r in entry.readings)
    assert len(entry.readings) == 3_000 + 1  # one a data value; a junk name makes none
    assert all(set(r) <= SCOPE_NAMES for r in entry.readings[1:])


def test_bare_ids_naming_another_project_than_the_data_are_a_reading_of_their_own() -> None:
    other = entry_of(b"1-0", [b"data", SPAWN, b"project_id", b"n13", b"user_id", b"vic"])
    assert other.readings[1] == {b"project_id": b"n13", b"user_id": b"vic"}
    same = entry_of(b"1-0", [b"data", SPAWN, b"project_id", b"n3"])
    assert same.readings == (same.fields,)  # the data names it: nothing more to read
