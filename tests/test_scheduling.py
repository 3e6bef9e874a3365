"""The scheduling marks (tests/scheduling.py): the order they give, the worker groups, and the checks that stop a
collection on a broken or copied mark."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from scheduling import check_schedule_marks, one_worker_scope, start_rank


def item(nodeid: str, *marks: pytest.MarkDecorator) -> SimpleNamespace:
    """A collected test as the scheduling reads it: its node id and its closest marks."""
    by_name = {decorator.mark.name: decorator.mark for decorator in marks}
    return SimpleNamespace(nodeid=nodeid, get_closest_marker=by_name.get)


def test_the_longest_start_in_rank_order_and_the_readers_last():
    items = [
        item("a.py::reader", pytest.mark.run_last),
        item("a.py::plain"),
        item("b.py::long", pytest.mark.longest_first(1)),
        item("c.py::longest[x]", pytest.mark.longest_first(0)),
        item("c.py::longest[y]", pytest.mark.longest_first(0)),  # one module's tests may share a rank
        item("a.py::other"),
    ]
    check_schedule_marks(items)
    assert [i.nodeid for i in sorted(items, key=start_rank)] == [
        "c.py::longest[x]",
        "c.py::longest[y]",
        "b.py::long",
        "a.py::plain",
        "a.py::other",
        "a.py::reader",
    ]


def test_tests_that_mostly_wait_start_right_after_the_first_long_ones():
    from scheduling import MOSTLY_WAITS_AFTER_RANK

    items = [
        item("a.py::plain"),
        item("w.py::sleeps", pytest.mark.mostly_waits),
        item("b.py::later", pytest.mark.longest_first(MOSTLY_WAITS_AFTER_RANK + 1)),
        item("c.py::first", pytest.mark.longest_first(MOSTLY_WAITS_AFTER_RANK)),
        item("a.py::reader", pytest.mark.run_last),
    ]
    check_schedule_marks(items)
    order = [i.nodeid for i in sorted(items, key=start_rank)]
    assert order == ["c.py::first", "w.py::sleeps", "b.py::later", "a.py::plain", "a.py::reader"]


def test_a_group_is_its_name_or_its_module_and_an_unmarked_test_is_its_own_unit():
    probes = [item(f"tests/x.py::t{n}", pytest.mark.one_worker_group("probes")) for n in range(2)]
    module = [item(f"tests/y.py::t{n}[p]", pytest.mark.one_worker_group) for n in range(2)]
    check_schedule_marks([*probes, *module])
    assert one_worker_scope(probes[0]) == one_worker_scope(probes[1])
    assert one_worker_scope(module[0]) == one_worker_scope(module[1]) != one_worker_scope(probes[0])
    assert one_worker_scope(item("tests/z.py::alone")) == "tests/z.py::alone"


@pytest.mark.parametrize(
    ("items", "message"),
    [
        ([item("a.py::t", pytest.mark.longest_first("3"))], "a.py::t: longest_first takes one rank"),
        ([item("a.py::t", pytest.mark.longest_first(-1))], "a.py::t: longest_first takes one rank"),
        (
            [item("a.py::t", pytest.mark.mostly_waits, pytest.mark.run_last)],
            "a.py::t: mostly_waits takes no arguments and excludes longest_first and run_last",
        ),
        ([item("a.py::t", pytest.mark.mostly_waits(2))], "a.py::t: mostly_waits takes no arguments"),
        ([item("a.py::t", pytest.mark.longest_first)], "a.py::t: longest_first takes one rank"),
        (
            [item("a.py::t", pytest.mark.longest_first(2)), item("b.py::u", pytest.mark.longest_first(2))],
            r"longest_first rank 2 is used in \['a.py', 'b.py'\]",
        ),
        (
            [item("a.py::t", pytest.mark.one_worker_group("g")), item("b.py::u", pytest.mark.one_worker_group("g"))],
            r"one_worker_group 'g' is used in \['a.py', 'b.py'\]",
        ),
        ([item("a.py::t", pytest.mark.one_worker_group(3))], "a.py::t: one_worker_group takes at most a group name"),
        (
            [item("a.py::t", pytest.mark.run_last, pytest.mark.longest_first(0))],
            "a.py::t: run_last takes no arguments and excludes longest_first",
        ),
    ],
)
def test_a_broken_or_copied_mark_stops_the_collection(items, message):
    with pytest.raises(pytest.UsageError, match=message):
        check_schedule_marks(items)
