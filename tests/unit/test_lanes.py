"""The lab lanes (tests/lanes.py): modules sharing a lab host never run side by side."""

from __future__ import annotations

from itertools import combinations

import pytest

from tests import lanes


def test_modules_sharing_a_host_directly_or_through_another_are_one_lane() -> None:
    got = lanes.lanes({"a": frozenset({1}), "b": frozenset({2}), "c": frozenset({2, 3}),
                       "d": frozenset({3, 1}), "e": frozenset({9})})
    assert got["a"] == got["b"] == got["c"] == got["d"] == "lab-hosts-1,2,3"
    assert got["e"] == "lab-hosts-9"


def test_the_shipped_lab_modules_share_no_host_across_lanes() -> None:
    hosts_of = lanes.lab_modules()
    lane_of = lanes.lanes(hosts_of)
    assert len(hosts_of) >= 15 and len(set(lane_of.values())) >= 4, lane_of
    for a, b in combinations(hosts_of, 2):
        if lane_of[a] != lane_of[b]:
            assert not hosts_of[a] & hosts_of[b], (a, b)
    # the node group (lab6, lab7) runs beside the single-host tests of lab1 and lab2
    assert lane_of["tests/lab/test_group_lab.py"] != lane_of["tests/lab/test_deploy_lab.py"]


def test_drives_reads_one_mark_or_a_list_and_says_none_without_it() -> None:
    assert lanes.drives(pytest.mark.drives(2, 1)) == {1, 2}
    assert lanes.drives([pytest.mark.lab, pytest.mark.drives(5)]) == {5}
    assert lanes.drives([pytest.mark.lab]) is None and lanes.drives(None) is None


def test_a_lab_test_is_scheduled_by_its_lane_and_a_unit_test_alone() -> None:
    sched = lanes.LaneScheduling.__new__(lanes.LaneScheduling)
    sched.lane_of = {"tests/lab/test_x.py": "lab-hosts-1"}
    assert sched._split_scope("tests/lab/test_x.py::test_a[p]") == "lab-hosts-1"
    assert sched._split_scope("tests/unit/test_y.py::test_b") == "tests/unit/test_y.py::test_b"
