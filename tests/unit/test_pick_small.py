"""bench/moe/pick_small.py: which decode-MoE tiles a device call's timings make the default (the rule that
``bench/moe/run_wg.sh`` then tests the engine under). The shipped tiles' names come from a stand-in for
``default_tiles`` (it needs triton, which CI does not install): a test double at that one seam."""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench" / "moe"))
import pick_small  # noqa: E402

SHIPPED = {1: "a1", 2: "a2", 4: "a4", 8: "a8"}.get   # stand-in for default_tiles' names at T


def rows(times: dict) -> list:
    """bench_small's small_graph rows from {(E, T, variant): us}."""
    return [dict(section="small_graph", E=e, T=t, variant=f"split_{v}", us=us) for (e, t, v), us in times.items()]


def test_a_candidate_wins_only_when_faster_at_both_expert_counts():
    times = {(32, 1, "a1"): 40.0, (128, 1, "a1"): 40.0, (32, 1, "b"): 30.0, (128, 1, "b"): 30.0,     # wins
             (32, 2, "a2"): 60.0, (128, 2, "a2"): 60.0, (32, 2, "c"): 50.0, (128, 2, "c"): 60.5,     # E = 128 slower
             (32, 4, "a4"): 90.0, (128, 4, "a4"): 90.0, (32, 4, "d"): 89.0, (128, 4, "d"): 89.0,     # within 2 %
             (32, 8, "a8"): 170.0, (128, 8, "a8"): 220.0, (32, 8, "b"): 150.0, (128, 8, "b"): 200.0}
    rule, table = pick_small.pick(rows(times), base_of=SHIPPED)
    assert rule == "b@4,a2@8,a4@16,b@32"
    assert [(t, c) for t, c, _ in table] == [(1, "split_b"), (2, "split_a2"), (4, "split_a4"), (8, "split_b")]


def test_consecutive_picks_merge_and_nothing_winning_gives_the_shipped_rule():
    times = {(e, t, SHIPPED(t)): 10.0 * t for e in (32, 128) for t in (1, 2, 4, 8)}
    times.update({(e, t, "slow"): 20.0 * t for e in (32, 128) for t in (1, 2, 4, 8)})
    rule, _ = pick_small.pick(rows(times), base_of=SHIPPED)
    assert rule == pick_small.shipped_rule(base_of=SHIPPED) == "a1@4,a2@8,a4@16,a8@32"
    same = {1: "x", 2: "x", 4: "y", 8: "y"}.get
    assert pick_small.shipped_rule(base_of=same) == "x@8,y@32"


def test_a_variant_with_a_failed_gpu_test_is_never_picked(tmp_path):
    suite = ET.Element("testsuite")
    case = ET.SubElement(suite, "testcase", name="test_wg_vs_reference[20b-1-b]")
    ET.SubElement(case, "failure", message="rel 0.02")
    ET.SubElement(suite, "testcase", name="test_wg_vs_reference[20b-1-c]")
    xml = tmp_path / "tests.xml"
    ET.ElementTree(suite).write(xml)
    bad = frozenset(pick_small.failed_variants(str(xml)))
    assert bad == {"split_b"}
    times = {(32, 1, "a1"): 40.0, (128, 1, "a1"): 40.0, (32, 1, "b"): 20.0, (128, 1, "b"): 20.0,
             (32, 1, "c"): 35.0, (128, 1, "c"): 35.0}
    rule, _ = pick_small.pick(rows(times), bad, base_of=SHIPPED)
    assert rule == "c@4"
