#!/usr/bin/env bash
# Causal prefill variants on the GPU in one go (issue 5): compile every variant in the background while
# the prefill GPU tests run (the new variants' file + the prefill cases of test_attention_gpu.py, which
# cover the shipped default), then time every variant beside the default (bench/attention/prefill_exp.py).
# Tests are capped at PREFILL_TEST_S seconds (default 80). Writes $OUT/prefill.log, $OUT/warmup.log and $OUT/prefill_exp.json.
set -u
cd "$(dirname "$0")/../.."
source bench/steps.sh
bench_env prefill.log
# PREFILL_VARIANTS=a,b: only these variants (tests and timing); default: all of prefill_variants.py
export DAYZERO_PREFILL_VARIANTS="${PREFILL_VARIANTS:-}"
only=${PREFILL_VARIANTS:+--variants $PREFILL_VARIANTS}
python3 bench/attention/prefill_exp.py --warmup-only --workers 6 $only > "$OUT/warmup.log" 2>&1 &
warm=$!
xdist=$(python3 -c "import xdist" 2>/dev/null && echo "-n 8")
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv | tee "$log"
timeout "${PREFILL_TEST_S:-80}" python3 -m pytest -q -p no:cacheprovider --noconftest -o addopts="" $xdist tests/kernels/test_attention_prefill_gpu.py \
  tests/kernels/test_attention_gpu.py -k "prefill or ragged or other_shapes or random or long or bad" 2>&1 | tee -a "$log"
tests_rc=${PIPESTATUS[0]}
wait "$warm"
python3 bench/attention/prefill_exp.py --out "$OUT" $only "$@" 2>&1 | tee -a "$log"
bench_rc=${PIPESTATUS[0]}
echo "prefill: tests rc=$tests_rc bench rc=$bench_rc" | tee -a "$log"
[ "$tests_rc" = 0 ] && [ "$bench_rc" = 0 ]
