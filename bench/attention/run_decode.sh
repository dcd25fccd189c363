#!/usr/bin/env bash
# Decode attention in one device call: the decode GPU tests, the engine's CUDA-graph tests under the
# default and each candidate preset (DAYZERO_DECODE_ATTENTION), all at once; then the decode
# benchmark (every config, split sweep at B=1, B=64/256 at 128k). Logs and JSON under $OUT.
set -u
cd "$(dirname "$0")/../.."
source bench/steps.sh
bench_env decode.log
xdist=$(python3 -c "import xdist" 2>/dev/null && echo "-n 6")
pt() { timeout "${TEST_CAP_S:-150}" python3 -m pytest -q -p no:cacheprovider --noconftest -o addopts="" "$@"; }
pt $xdist tests/kernels/test_attention_gpu.py -k "${TEST_K:-decode or store or registered or bad_input}" > "$OUT/tests_attention.log" 2>&1 &
pids=$!
for preset in ${PRESETS:-kernel_strided_n64 combine}; do
  DAYZERO_DECODE_ATTENTION=$preset pt tests/kernels/test_cuda_graph_gpu.py > "$OUT/tests_graph_$preset.log" 2>&1 &
  pids="$pids $!"
done
trc=0
for p in $pids; do wait "$p" || trc=1; done
tail -n 3 "$OUT"/tests_*.log | tee -a "$log"
echo "tests rc=$trc ($(date -u +%H:%M:%S))" | tee -a "$log"
timeout "${BENCH_CAP_S:-150}" python3 bench/attention/bench_attention.py --out "$OUT" \
  --skip prefill,sdpa,chunked,probe,store "$@" 2>&1 | tee -a "$log"
brc=${PIPESTATUS[0]}
echo "decode: tests rc=$trc bench rc=$brc" | tee -a "$log"
[ "$trc" = 0 ] && [ "$brc" = 0 ]
