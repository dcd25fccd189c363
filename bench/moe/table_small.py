"""Markdown table of a ``bench_small.py`` result: per (model, T) the old and the new decode default of
the registered op, both from the same run (us per call in a CUDA graph, TB/s and % of the copy
ceiling on the expert bytes touched), then the T = 1 floor rows.

    python3 bench/moe/table_small.py OUT/moe-small.json OLD_RULE NEW_RULE [--new-split-max16]

A rule is ``DAYZERO_MOE_SMALL_TILES``'s "name@max_pairs,..." (pairs past every entry: bn64); the
aligned path (``old_small``) stands where ``takes_split`` sends a call there (8 < T * k <= 16 with
< 64 local experts), unless --new-split-max16 says the new dispatch keeps those on the split path.
"""

from __future__ import annotations

import json
import sys

K_TOP = 4
COPY_TBS = 4.26


def tiles(rule: str, pairs: int) -> str:
    for entry in rule.split(","):
        name, _, most = entry.partition("@")
        if not most or pairs <= int(most):
            return name
    return "bn64"


def variant(rule: str, T: int, E: int, split_max16: bool) -> str:
    pairs = T * K_TOP
    if E < 64 and 8 < pairs <= 16 and not split_max16:
        return "old_small"
    return f"split_{tiles(rule, pairs)}"


def main() -> int:
    path, old_rule, new_rule = sys.argv[1:4]
    split16 = "--new-split-max16" in sys.argv
    rows = json.load(open(path, encoding="utf-8"))["rows"]
    g = {(r["E"], r["T"], r["variant"]): r for r in rows if r.get("section") == "small_graph" and "us" in r}
    print("| model, T | MB touched | floor us | new default | us | TB/s | % of 4.26 | old default | us | TB/s | % "
          "| new vs old |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for E, model in ((32, "20B"), (128, "120B")):
        for T in sorted({t for e, t, _ in g if e == E}):
            vn, vo = variant(new_rule, T, E, split16), variant(old_rule, T, E, False)
            if (E, T, vn) not in g or (E, T, vo) not in g:
                continue
            n, o = g[(E, T, vn)], g[(E, T, vo)]
            mb = n["mb_touched"]
            print(f"| {model}, {T} | {mb} | {n['floor_us']:.1f} | {vn.removeprefix('split_')} | {n['us']:.1f} | "
                  f"{mb / n['us']:.2f} | {100 * mb / n['us'] / COPY_TBS:.0f} % | {vo.removeprefix('split_')} | "
                  f"{o['us']:.1f} | {mb / o['us']:.2f} | {100 * mb / o['us'] / COPY_TBS:.0f} % | "
                  f"{100 * (n['us'] / o['us'] - 1):+.1f} % |")
    print()
    print("| floor row (20B T = 1, CUDA graph of 8 calls) | grid | us | MB | TB/s | % of 4.26 |")
    print("| --- | --- | --- | --- | --- | --- |")
    for r in rows:
        if r.get("section") == "floor":
            mb = r.get("mb")
            extra = f"{mb} | {mb / r['us']:.2f} | {100 * mb / r['us'] / COPY_TBS:.0f} %" if mb else "| |"
            print(f"| {r['name']} | {r.get('grid', '')} | {r['us']:.1f} | {extra} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
