"""From a ``bench_small.py`` result (moe-small.json), the split-K tiles that win at each decode T <= 8,
as a ``DAYZERO_MOE_SMALL_TILES`` rule ("name@max_pairs,...") for the device tests of the engine
(run.sh step ``small_graph``) and a table (stderr) of every variant against the shipped default.

    python3 bench/moe/pick_small.py OUT/moe-small.json [OUT/small-tests.xml]
    python3 bench/moe/pick_small.py --shipped [TS]  (the shipped tiles at T = 1, 2, 4, 8 or TS as such a rule)

A variant replaces the shipped default at a T only when it is faster at both E = 32 and E = 128 by
more than ``MARGIN`` (run-to-run spread of graph timings here: ~1 %); else the default stays. With the
GPU tests' JUnit XML, a variant named in the id of any failed or erroring test is never picked.
"""

from __future__ import annotations

import json
import sys

K_TOP = 4
MARGIN = 0.02


def shipped(T: int) -> str:
    """The ``VARIANTS`` name of the shipped split tiles at T for 20B's 32 experts (``default_tiles``; since session 10
    120B's T = 3-4 tiles differ: wg8_d64_qtp there, the 20B pick wg8_d64_qtp_st2 was under the margin at 120B)."""
    from dayzero.kernels.triton_moe_small_split import VARIANTS, default_tiles

    t = default_tiles(T * K_TOP, 32)
    return next(n for n, v in VARIANTS.items() if v == t)


def failed_variants(xml_path: str) -> set:
    """``split_<name>`` of every variant named last in the parameter id of a failed / erroring test."""
    import xml.etree.ElementTree as ET

    out = set()
    for case in ET.parse(xml_path).iter("testcase"):
        if case.find("failure") is not None or case.find("error") is not None:
            name = case.get("name", "")
            if "[" in name:
                out.add("split_" + name[name.index("[") + 1:-1].split("-")[-1])
    return out


def pick(rows: list, bad: frozenset = frozenset(), base_of=None) -> tuple[str, list]:
    """(rule, table) from bench_small's rows; ``base_of(T)``: the shipped tiles' name at T (``shipped``)."""
    base_of = base_of or shipped
    us = {(r["E"], r["T"], r["variant"]): r["us"] for r in rows if r.get("section") == "small_graph" and "us" in r
          and r["variant"] not in bad}
    rule, table = [], []
    for T in sorted({t for _, t, _ in us if t <= 8}):
        names = {v for e, t, v in us if t == T and v.startswith("split_") and (32, T, v) in us and (128, T, v) in us}
        if not names:
            continue
        base = f"split_{base_of(T)}"
        best = min(names, key=lambda v: us[(32, T, v)] + us[(128, T, v)])
        wins = base in names and all(us[(e, T, best)] < (1 - MARGIN) * us[(e, T, base)] for e in (32, 128))
        choice = best if wins else base
        table.append((T, choice, {v: (round(us[(32, T, v)], 1), round(us[(128, T, v)], 1)) for v in sorted(names)}))
        name = choice.removeprefix("split_")
        if rule and rule[-1][0] == name:
            rule[-1] = (name, T * K_TOP)
        else:
            rule.append((name, T * K_TOP))
    return ",".join(f"{n}@{p}" for n, p in rule), table


def shipped_rule(ts=(1, 2, 4, 8), base_of=None) -> str:
    """The shipped tiles at those T as a rule of ``pick``'s form (what ``pick`` prints when nothing wins)."""
    base_of = base_of or shipped
    rule = []
    for T in ts:
        if rule and rule[-1][0] == base_of(T):
            rule[-1] = (base_of(T), T * K_TOP)
        else:
            rule.append((base_of(T), T * K_TOP))
    return ",".join(f"{n}@{p}" for n, p in rule)


def main() -> int:
    if sys.argv[1:2] == ["--shipped"]:   # [--shipped [TS]]: the shipped tiles at those T (default 1,2,4,8)
        print(shipped_rule(tuple(int(t) for t in sys.argv[2].split(","))) if len(sys.argv) > 2 else shipped_rule())
        return 0
    with open(sys.argv[1], encoding="utf-8") as f:
        rows = json.load(f)["rows"]
    bad = frozenset(failed_variants(sys.argv[2])) if len(sys.argv) > 2 else frozenset()
    if bad:
        print("not picked (failed GPU tests):", ", ".join(sorted(bad)), file=sys.stderr)
    rule, table = pick(rows, bad)
    for T, choice, times in table:
        print(f"T={T}: {choice} | " + " ".join(f"{v}={a}/{b}" for v, (a, b) in times.items()), file=sys.stderr)
    print(rule)
    return 0


if __name__ == "__main__":
    sys.exit(main())
