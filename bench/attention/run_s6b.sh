#!/usr/bin/env bash
# Decode candidate of session 6 (CPU-only helper; never run on a GPU before): TMA K/V pages
# (triton_attention_decode_tma.py, presets tma_*), tested and timed beside the shipped default in ONE device
# call of <= 150 s: (1) GPU tests, all at once: tests/kernels/test_attention_decode_s6b_gpu.py (every tma preset
# vs the torch reference, graph replay == eager, determinism), the shipped decode tests under
# DAYZERO_DECODE_ATTENTION=$PRESET (test_attention_gpu.py -k $TEST_K) and the engine's CUDA-graph tests under it;
# (2) bench_decode_s6.py at B=1 8k / 32k / 128k, B=8 1k, B=64 8k (one split) for the shipped op and the presets
# ($CONFIGS), split counts heuristic / 2, heuristic, 2 x heuristic. Each step capped so the call ends by
# DEADLINE_S (default 145 s). Writes under $OUT: s6b.log, tests.tgz, decode-s6b.json.
#   run: DEADLINE_S=145 bash bench/attention/run_s6b.sh   (carry .devmeta with the commit)
set -u
cd "$(dirname "$0")/../.."
source bench/steps.sh
bench_env s6b.log
export DAYZERO_DEADLINE=$(( $(date +%s) + ${DEADLINE_S:-145} ))
steps=",${STEPS:-tests,bench},"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv | tee -a "$log"
mkdir -p "$OUT/tests"
pt() { python3 -m pytest -q -p no:cacheprovider --noconftest -o addopts="" "$@"; }
run_tests() {
  local pids="" p r=0 preset=${PRESET:-tma_p4}
  PYTHONPATH="$PYTHONPATH:tests/kernels" pt tests/kernels/test_attention_decode_s6b_gpu.py \
    > "$OUT/tests/s6b.log" 2>&1 &
  pids="$pids $!"
  DAYZERO_DECODE_ATTENTION=$preset pt tests/kernels/test_attention_gpu.py \
    -k "${TEST_K:-(decode and not variants) or other_shapes or long_sequences or random_batches}" \
    > "$OUT/tests/attention_$preset.log" 2>&1 &
  pids="$pids $!"
  DAYZERO_DECODE_ATTENTION=$preset pt tests/kernels/test_cuda_graph_gpu.py > "$OUT/tests/graph_$preset.log" 2>&1 &
  pids="$pids $!"
  for p in $pids; do wait "$p" || r=1; done
  tail -n 3 "$OUT"/tests/*.log
  return $r
}
export -f run_tests pt
export OUT
step tests "${TEST_CAP_S:-70}" bash -c run_tests
mkdir -p "$OUT/bench"
step bench "${BENCH_CAP_S:-70}" python3 bench/attention/bench_decode_s6.py --out "$OUT/bench" \
  --plan "${PLAN:-1:32768,8:1024,1:8192,1:131072,64:8192}" \
  --configs "${CONFIGS:-default,tma_p4,tma_p4_s4,tma_p4_w1,tma_p4_w1_s4}"
[ -f "$OUT/bench/decode-s6.json" ] && mv "$OUT/bench/decode-s6.json" "$OUT/decode-s6b.json"
rmdir "$OUT/bench" 2>/dev/null
(cd "$OUT" && tar czf tests.tgz tests && rm -rf tests)
sed -i -e 's#/[^ ]*/site-packages/#<site>/#g' -e 's#/root/[^ ]*#<home>#g' -e 's#/tmp/[^ ]*#<tmp>#g' \
  -e 's#"/[^"]*/\(bench\|shared\|tests\)/#"\1/#g' "$log"
echo "s6b: rc=$rc" | tee -a "$log"
exit $rc
