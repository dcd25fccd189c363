#!/usr/bin/env bash
# Session 6 decode device call (attention helper): (1) GPU tests of the decode kernels ($TEST_K on
# test_attention_gpu.py, the version-3 warp-slice file) and the engine's CUDA-graph tests under
# $GRAPH_PRESETS (DAYZERO_DECODE_ATTENTION; "default" = no override), all at once; (2) the decode
# benchmark (bench_decode_s6.py: shipped op vs version-3 variants, $PLAN / $CONFIGS). Each step capped
# so the call ends by DEADLINE_S (default 170 s). Writes under $OUT: s6.log, tests.tgz, decode-s6.json.
set -u
cd "$(dirname "$0")/../.."
source bench/steps.sh
bench_env s6.log
export DAYZERO_DEADLINE=$(( $(date +%s) + ${DEADLINE_S:-170} ))
steps=",${STEPS:-tests,bench},"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv | tee -a "$log"
xdist=$(python3 -c "import xdist" 2>/dev/null && echo "-n ${XDIST:-6}")
mkdir -p "$OUT/tests"
pt() { python3 -m pytest -q -p no:cacheprovider --noconftest -o addopts="" "$@"; }
run_tests() {
  pt $xdist tests/kernels/test_attention_gpu.py tests/kernels/test_attention_wslice_gpu.py \
    -k "${TEST_K:-decode or registered or wslice}" > "$OUT/tests/attention.log" 2>&1 &
  local pids=$!
  for p in ${GRAPH_PRESETS:-wslice}; do
    if [ "$p" = default ]; then
      pt tests/kernels/test_cuda_graph_gpu.py > "$OUT/tests/graph_default.log" 2>&1 &
    else
      DAYZERO_DECODE_ATTENTION=$p pt tests/kernels/test_cuda_graph_gpu.py > "$OUT/tests/graph_$p.log" 2>&1 &
    fi
    pids="$pids $!"
  done
  local r=0
  for p in $pids; do wait "$p" || r=1; done
  tail -n 4 "$OUT"/tests/*.log
  return $r
}
export -f run_tests pt
export xdist OUT
step tests "${TEST_CAP_S:-90}" bash -c run_tests
step bench "${BENCH_CAP_S:-100}" python3 bench/attention/bench_decode_s6.py --out "$OUT" \
  ${PLAN:+--plan "$PLAN"} ${CONFIGS:+--configs "$CONFIGS"}
(cd "$OUT" && tar czf tests.tgz tests && rm -rf tests)
sed -i -e 's#/[^ ]*/site-packages/#<site>/#g' -e 's#/root/[^ ]*#<home>#g' -e 's#/tmp/[^ ]*#<tmp>#g' \
  -e 's#"/[^"]*/\(bench\|shared\|tests\)/#"\1/#g' "$log"
echo "s6: rc=$rc" | tee -a "$log"
exit $rc
