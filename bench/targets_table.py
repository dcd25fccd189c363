"""Issues 5 and 6's numeric targets against the JSON a device call wrote (``bench/candidates.sh tables``, or the
files copied to bench/results/): one markdown table per target with our number, the same-run peer, the target
and met / missed, so a closing note quotes what the run measured and nothing typed by hand.

    python3 bench/targets_table.py DIR_OR_FILE [...] [--json OUT.json]   (.json files or candidates.sh's .tgz)

Reads the rows of flashinfer_compare.py (prefill / decode beside FlashInfer and SDPA), gluon_window_bench.py
(window prefill in graphs vs the QKVO floor), bench_small.py (decode MoE, rows marked ``shipped``),
bench_gluon.py (MoE prefill layer), bench_kernels.py (dense FP8 linear) and ``dayzero bench`` (engine rows).
Reads JSON only: no torch, no GPU.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
from dataclasses import asdict, dataclass

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from candidates_summary import docs_of, files_of, rows_of_doc  # noqa: E402

COPY_TBS = 4.26             # the H200 copy ceiling the issues measure bandwidth against
MODEL_OF_E = {32: "20B", 128: "120B"}


@dataclass
class Check:
    table: str              # which target
    case: str
    ours: float
    unit: str
    target: str             # the target in words, e.g. ">= 400 and >= fa3"
    met: bool | None        # None: the target does not apply to this case (shown, not counted)
    peers: str = ""         # same-run peers, formatted
    commit: str = ""


def _commit(doc) -> str:
    meta = doc.get("meta", {}) if isinstance(doc, dict) else {}
    return str(meta.get("commit") or meta.get("git_commit") or "")[:12]


def load(paths: list[str]) -> list[tuple[dict, str]]:
    """(row, commit of its file) for every row of every JSON file / .tgz member under ``paths``."""
    out = []
    for f in files_of(paths):
        for _, doc in docs_of(f):
            commit = _commit(doc)
            model = doc.get("meta", {}).get("model") if isinstance(doc, dict) else None   # dayzero bench's files
            out += [({"model": model, **r}, commit) for r in rows_of_doc(doc) if isinstance(r, dict)]
    return out


def _fmt_peers(peers: dict[str, float], unit: str) -> str:
    return ", ".join(f"{k} {v:.4g} {unit}" for k, v in sorted(peers.items()))


def attention_checks(rows) -> list[Check]:
    out = []
    pre = [(r, c) for r, c in rows if r.get("kind") == "prefill" and r.get("tflops")]
    for n in sorted({r["n"] for r, _ in pre if r["window"] == 0}):
        here = {r["impl"]: (r["tflops"], c) for r, c in pre if r["n"] == n and r["window"] == 0}
        if "ours" not in here:
            continue
        ours, commit = here.pop("ours")
        peers = {k: v for k, (v, _) in here.items()}
        need = max(400.0, peers.get("fa3", 0.0))
        out.append(Check("causal prefill with sinks", f"N={n}", ours, "TFLOP/s", ">= 400 and >= fa3 (same run)",
                         ours >= need if "fa3" in peers else None, _fmt_peers(peers, "TFLOP/s"), commit))
    win_eager = {(r["n"], r["impl"]): r["ms"] * 1e3 for r, _ in pre if r["window"] > 0}
    for r, c in rows:
        if r.get("impl") == "registered" and "x_floor" in r and r.get("graph_ms"):
            peers = {k[1]: v for k, v in win_eager.items() if k[0] == r["n"] and k[1] != "ours"}
            peers["QKVO floor"] = r["floor_ms"] * 1e3
            out.append(Check("sliding window 128 (CUDA graph)", f"N={r['n']}", r["graph_ms"] * 1e3, "us",
                             f"<= 1.5x the QKVO floor (here {r['x_floor']:.2f}x)", r["x_floor"] <= 1.5,
                             _fmt_peers(peers, "us") + " (FlashInfer / SDPA: eager)", c))
    dec = [(r, c) for r, c in rows if r.get("kind") == "decode" and r.get("us")]
    for b, ctx in sorted({(r["batch"], r["context"]) for r, _ in dec}):
        here = {r["impl"]: (r, c) for r, c in dec if (r["batch"], r["context"]) == (b, ctx)}
        if "ours" not in here:
            continue
        ours, commit = here.pop("ours")
        peers = {k: v["us"] for k, (v, _) in here.items()}
        faster = all(ours["us"] < v for v in peers.values()) if peers else None
        frac = ours["tbps"] / COPY_TBS
        bw_ok = frac >= 0.75
        out.append(Check("decode, paged, sinks", f"B={b} ctx={ctx}", ours["us"], "us",
                         f">= 75 % of {COPY_TBS} TB/s (here {100 * frac:.0f} %) and faster than FlashInfer",
                         None if faster is None else bw_ok and faster, _fmt_peers(peers, "us"), commit))
        if b == 1 and ctx == 8192:
            out.append(Check("decode batch 1 time", "B=1 ctx=8192", ours["us"], "us", "< 15 us", ours["us"] < 15.0,
                             _fmt_peers(peers, "us"), commit))
    return out


def moe_checks(rows) -> list[Check]:
    out = []
    for r, c in rows:
        if r.get("section") == "moe_gluon" and r.get("variant") == "op" and r.get("tflops_useful_graph"):
            routing = "balanced" if r.get("balanced") else "random"
            out.append(Check("MoE prefill layer (CUDA graph)",
                             f"{MODEL_OF_E.get(r['E'], r['E'])} T={r['T']} {routing}", r["tflops_useful_graph"],
                             "TFLOP/s", ">= 800 useful", r["tflops_useful_graph"] >= 800.0,
                             f"layer {r['layer_ms_graph']:.3f} ms (do_bench {r['tflops_useful']:.0f} TFLOP/s)", c))
        elif r.get("section") == "small_graph" and r.get("shipped") and r.get("us"):
            out.append(Check("MoE decode (CUDA graph)", f"{MODEL_OF_E.get(r['E'], r['E'])} T={r['T']}", r["us"], "us",
                             f">= 70 % of {COPY_TBS} TB/s on {r['mb_touched']} MB (here {100 * r['frac_copy']:.1f} %)",
                             r["frac_copy"] >= 0.70, r["variant"].removeprefix("split_"), c))
        elif r.get("section") == "linear_prefill" and r.get("variant") == "linear_op_total" and r.get("M", 0) >= 4096:
            out.append(Check("dense FP8 linear (whole op incl. quantization)", f"{r['shape']} M={r['M']}", r["tflops"],
                             "TFLOP/s", ">= 900", r["tflops"] >= 900.0, "", c))
    return out


def engine_rows(rows) -> list[str]:
    lines = []
    for r, c in rows:
        if r.get("mode") == "prefill" and "usd_per_1m_input_tokens" in r:
            lines.append(f"| prefill | {r.get('model', '?')} | {r['tokens']} tokens | {r['seconds']:.4f} s | "
                         f"${r['usd_per_1m_input_tokens']:.4f} per 1M input tokens | {c} |")
        elif r.get("mode") == "decode" and "tokens_per_s" in r:
            lines.append(f"| decode | {r.get('model', '?')} | batch {r['batch']}, context {r['context']} | "
                         f"{r['tokens_per_s']:.1f} tok/s | q/k/v {r.get('qkv', '?')}, graphs {r.get('cuda_graphs')} | {c} |")
    return lines


def render(checks: list[Check], engine: list[str]) -> str:
    out = []
    for table in dict.fromkeys(ch.table for ch in checks):
        mine = [ch for ch in checks if ch.table == table]
        out += [f"\n### {table}", "", "| case | ours | target | status | same run | commit |", "| --- | --- | --- | --- | --- | --- |"]
        for ch in mine:
            status = "n/a" if ch.met is None else "met" if ch.met else "**missed**"
            out.append(f"| {ch.case} | {ch.ours:.4g} {ch.unit} | {ch.target} | {status} | {ch.peers} | {ch.commit} |")
    if engine:
        out += ["\n### engine (`dayzero bench`)", "", "| mode | model | case | result | | commit |",
                "| --- | --- | --- | --- | --- | --- |", *engine]
    counted = [ch for ch in checks if ch.met is not None]
    out.append(f"\n{sum(ch.met for ch in counted)} of {len(counted)} checks met")
    return "\n".join(out)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("paths", nargs="+", help=".json files, candidates.sh's .tgz files, or folders of them")
    ap.add_argument("--json", help="also write the checks here")
    a = ap.parse_args(argv)
    rows = load(a.paths)
    checks = attention_checks(rows) + moe_checks(rows)
    print(render(checks, engine_rows(rows)))
    if a.json:
        pathlib.Path(a.json).write_text(json.dumps([asdict(ch) for ch in checks], indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
