#!/usr/bin/env bash
# Session 5 decode device call, priorities first: (1) the decode GPU tests (PDL twins bitwise, the
# strided kernel as one split) and the engine's CUDA-graph tests with decode PDL on (and with the
# strided one-split candidate); (2) pdl_diag.py (graph vs eager vs eager: where the logits move);
# (3) the decode grid (shipped vs PDL) and the B=1/8 sweep; (4) the latency floor; (5) the one-split
# kernels at B >= 64; (6) "decode1": the B=1/8 split sweep alone ($DECODE1_PLAN); (7) "probe": the window
# prefill probe (GPU / host / do_bench time) on a quiet host, then with 14 CPU-bound processes beside it.
# Every step is capped so the call ends by DEADLINE_S (default 185 s). Writes under $OUT: s5.log,
# tests.tgz, pdl-diag.json, attention.json, decode-floor.json, decode-onesplit.json, probe_{quiet,load}/attention.json.
set -u
cd "$(dirname "$0")/../.."
source bench/steps.sh
bench_env s5.log
export DAYZERO_DEADLINE=$(( $(date +%s) + ${DEADLINE_S:-185} ))
steps=",${STEPS:-tests,diag,decode,floor,onesplit},"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv | tee -a "$log"
xdist=$(python3 -c "import xdist" 2>/dev/null && echo "-n 6")
mkdir -p "$OUT/tests"
pt() { python3 -m pytest -q -p no:cacheprovider --noconftest -o addopts="" "$@"; }
run_tests() {
  pt $xdist tests/kernels/test_attention_gpu.py -k "${TEST_K:-decode or registered}" > "$OUT/tests/attention.log" 2>&1 &
  local pids=$!
  DAYZERO_DECODE_PDL=1 pt tests/kernels/test_cuda_graph_gpu.py > "$OUT/tests/graph_pdl.log" 2>&1 &
  pids="$pids $!"
  DAYZERO_DECODE_PDL=1 DAYZERO_DECODE_ONESPLIT=strided_n64 pt tests/kernels/test_cuda_graph_gpu.py \
    > "$OUT/tests/graph_pdl_onesplit.log" 2>&1 &
  pids="$pids $!"
  local r=0
  for p in $pids; do wait "$p" || r=1; done
  tail -n 4 "$OUT"/tests/*.log
  return $r
}
export -f run_tests pt
export xdist OUT
step tests 85 bash -c run_tests
step diag 45 python3 bench/attention/pdl_diag.py
step decode 70 python3 bench/attention/bench_attention.py --quick --decode1 --out "$OUT" \
  --skip prefill,sdpa,chunked,probe,store
step floor 20 python3 bench/attention/bench_floor.py
step onesplit 40 python3 bench/attention/decode_onesplit.py
step decode1 45 python3 bench/attention/bench_attention.py --decode1 --out "$OUT" \
  --skip prefill,sdpa,chunked,probe,decode,store
probe() {  # $1: quiet | load
  mkdir -p "$OUT/probe_$1"
  local burners=""
  if [ "$1" = load ]; then
    for _ in $(seq 14); do python3 -c "while True: pass" & burners="$burners $!"; done
  fi
  python3 bench/attention/bench_attention.py --out "$OUT/probe_$1" --skip prefill,sdpa,chunked,decode1,decode,store
  local r=$?
  for p in $burners; do kill "$p"; done
  return $r
}
export -f probe
step probe 30 bash -c "probe quiet"
step probe 30 bash -c "probe load"
(cd "$OUT" && tar czf tests.tgz tests && rm -rf tests)
sed -i -e 's#/[^ ]*/site-packages/#<site>/#g' -e 's#/root/[^ ]*#<home>#g' -e 's#/tmp/[^ ]*#<tmp>#g' \
  -e 's#"/[^"]*/\(bench\|shared\|tests\)/#"\1/#g' "$log"
echo "s5: rc=$rc" | tee -a "$log"
exit $rc
