#!/usr/bin/env bash
# Session 6 decode device call (attention helper): (1) GPU tests under each candidate preset
# ($PRESETS, DAYZERO_DECODE_ATTENTION; every test that takes the default decode config then runs the
# candidate): test_attention_gpu.py -k $TEST_K for the first preset, -k $TEST_K2 for the others, and the
# engine's CUDA-graph tests under each, all at once; (2) bench_decode_s6.py ($PLAN / $CONFIGS). Each step
# capped so the call ends by DEADLINE_S (default 120 s). Writes under $OUT: s6.log, tests.tgz, decode-s6.json.
set -u
cd "$(dirname "$0")/../.."
source bench/steps.sh
bench_env s6.log
export DAYZERO_DEADLINE=$(( $(date +%s) + ${DEADLINE_S:-120} ))
steps=",${STEPS:-tests,bench},"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv | tee -a "$log"
xdist=$(python3 -c "import xdist" 2>/dev/null && echo "-n ${XDIST:-4}")
mkdir -p "$OUT/tests"
pt() { python3 -m pytest -q -p no:cacheprovider --noconftest -o addopts="" "$@"; }
run_tests() {
  local pids="" first=1 p kexpr
  for p in ${PRESETS:-kernel_strided_n64_hm_en}; do
    if [ $first = 1 ]; then kexpr=${TEST_K:-decode or registered or other_shapes or long_sequences or random_batches}
    else kexpr=${TEST_K2:-(decode and not variants) or other_shapes or long_sequences or random_batches}; fi
    first=0
    DAYZERO_DECODE_ATTENTION=$p pt $xdist tests/kernels/test_attention_gpu.py -k "$kexpr" \
      > "$OUT/tests/attention_$p.log" 2>&1 &
    pids="$pids $!"
    DAYZERO_DECODE_ATTENTION=$p pt tests/kernels/test_cuda_graph_gpu.py > "$OUT/tests/graph_$p.log" 2>&1 &
    pids="$pids $!"
  done
  local r=0
  for p in $pids; do wait "$p" || r=1; done
  tail -n 3 "$OUT"/tests/*.log
  return $r
}
export -f run_tests pt
export xdist OUT
step tests "${TEST_CAP_S:-60}" bash -c run_tests
step bench "${BENCH_CAP_S:-50}" python3 bench/attention/bench_decode_s6.py --out "$OUT" \
  ${PLAN:+--plan "$PLAN"} ${CONFIGS:+--configs "$CONFIGS"}
(cd "$OUT" && tar czf tests.tgz tests && rm -rf tests)
sed -i -e 's#/[^ ]*/site-packages/#<site>/#g' -e 's#/root/[^ ]*#<home>#g' -e 's#/tmp/[^ ]*#<tmp>#g' \
  -e 's#"/[^"]*/\(bench\|shared\|tests\)/#"\1/#g' "$log"
echo "s6: rc=$rc" | tee -a "$log"
exit $rc
