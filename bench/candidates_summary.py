"""Summarise the JSON a device call wrote (bench/candidates.sh, or files copied to bench/results/): per case, each
implementation's GPU time beside the shipped one, so the decision rules in bench/NOTES.md can be applied at a glance.

    python3 bench/candidates_summary.py DIR_OR_FILE [...]     (.json files, or the .tgz that candidates.sh packs)

Knows the rows of bench_decode_s6.py (decode attention), gluon_window_bench.py (window prefill), bench_gluon.py (MoE
prefill), bench_small.py (decode MoE) and bench_gemv.py (small-M linear); other files are listed as not understood.
Reads JSON only: no torch, no GPU.
"""

from __future__ import annotations

import json
import pathlib
import sys
import tarfile
from collections import defaultdict

# kind -> (how a row is recognised, case key, implementation name, time in us, the shipped implementation)
KINDS = {
    "decode attention": (lambda r: r.get("kind") == "decode_s6" and r.get("us"),
                         lambda r: f"B={r['batch']} ctx={r['context']}",
                         lambda r: f"{r['config']} s{r['num_splits']}", lambda r: r["us"], "default"),
    "window prefill": (lambda r: "x_floor" in r and r.get("graph_ms"),
                       lambda r: f"n={r['n']}", lambda r: r["impl"], lambda r: 1e3 * r["graph_ms"], "registered"),
    "MoE prefill": (lambda r: r.get("section") == "moe_gluon" and r.get("ms"),
                    lambda r: f"E={r['E']} T={r['T']} {'balanced' if r.get('balanced') else 'random'}",
                    lambda r: r["variant"], lambda r: 1e3 * r["ms"], "op"),
    "MoE prefill, interleaved graphs": (lambda r: r.get("section") == "moe_gluon_interleaved" and r.get("layer_ms_graph_il"),
                                        lambda r: f"E={r['E']} T={r['T']} {'balanced' if r.get('balanced') else 'random'}",
                                        lambda r: r["variant"], lambda r: 1e3 * r["layer_ms_graph_il"], "op"),
    "decode MoE": (lambda r: r.get("section") == "small_graph" and r.get("us"),
                   lambda r: f"E={r['E']} T={r['T']}", lambda r: r["variant"], lambda r: r["us"], None),
    "small-M linear": (lambda r: str(r.get("kernel", "")).startswith("gemv") and r.get("us"),
                       lambda r: f"{r['shape']} x={r.get('x', 'bf16')} M={r['m']}", lambda r: r["kernel"],
                       lambda r: r["us"], "gemv bf16"),
}


def rows_of_doc(doc) -> list[dict]:
    if isinstance(doc, list):
        return doc
    return list(doc.get("rows") or doc.get("results") or [])


def docs_of(path: pathlib.Path) -> list[tuple[str, object]]:
    """(name, parsed JSON) of a .json file, or of every .json member of a .tgz / .tar.gz (what candidates.sh packs)."""
    if path.name.endswith((".tgz", ".tar.gz")):
        with tarfile.open(path) as tar:
            return [(f"{path}:{m.name}", json.load(tar.extractfile(m))) for m in tar.getmembers()
                    if m.isfile() and m.name.endswith(".json")]
    return [(str(path), json.loads(path.read_text()))]


def shipped_decode_moe(case: str) -> str | None:
    """The decode-MoE tiles the code picks for a case "E=.. T=.." (None where dayzero cannot be imported here)."""
    try:
        from dayzero.kernels.triton_moe_small_split import VARIANTS, default_tiles
    except Exception:  # noqa: BLE001 - no triton on this machine: no baseline marked
        return None
    e, t = (int(x.split("=")[1]) for x in case.split())
    names = {id(v): n for n, v in VARIANTS.items()}
    return "split_" + names.get(id(default_tiles(4 * t, e)), "?")


def files_of(args: list[str]) -> list[pathlib.Path]:
    """The .json / .tgz files named, or found under the folders named."""
    files = []
    for a in args:
        p = pathlib.Path(a)
        files += sorted([*p.rglob("*.json"), *p.rglob("*.tgz")]) if p.is_dir() else [p]
    return files


def summarise(rows: list[dict]) -> dict[str, dict[str, dict[str, float]]]:
    """kind -> case -> implementation -> best time (us) over its rows."""
    out: dict = defaultdict(lambda: defaultdict(dict))
    for r in rows:
        for kind, (match, case, impl, us, _) in KINDS.items():
            try:
                if not match(r):
                    continue
                c, i, t = case(r), impl(r), float(us(r))
            except (KeyError, TypeError, ValueError):
                continue
            if i not in out[kind][c] or t < out[kind][c][i]:
                out[kind][c][i] = t
            break
    return out


def print_table(kind: str, cases: dict[str, dict[str, float]]) -> None:
    """Fastest first; "+x %" = x % faster than the best shipped row of the case."""
    print(f"\n## {kind}")
    for case, impls in cases.items():
        base_name = KINDS[kind][4] if kind != "decode MoE" else shipped_decode_moe(case)
        shipped = [i for i in impls if base_name and (i == base_name or i.startswith(base_name + " "))]
        base = [impls[i] for i in shipped]
        ref = min(base) if base else None
        print(f"{case}:")
        for i, t in sorted(impls.items(), key=lambda kv: kv[1]):
            rel = f" {100 * (ref / t - 1):+6.1f} % vs shipped" if ref else ""
            mark = " (shipped)" if i in shipped else ""
            print(f"   {t:10.2f} us  {i}{mark}{rel}")


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__)
        return 2
    rows, unknown = [], []
    for f in files_of(argv):
        try:
            docs = docs_of(f)
        except (OSError, ValueError, tarfile.TarError) as e:
            unknown.append(f"{f} ({type(e).__name__})")
            continue
        if not docs:
            unknown.append(f"{f} (no JSON)")
        for name, doc in docs:
            before = sum(len(c) for k in summarise(rows).values() for c in k.values())
            try:
                rows += rows_of_doc(doc)
            except AttributeError:
                pass
            if sum(len(c) for k in summarise(rows).values() for c in k.values()) == before:
                unknown.append(name)
    for kind, cases in summarise(rows).items():
        print_table(kind, cases)
    if unknown:
        print("\nnot understood:", ", ".join(unknown))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
