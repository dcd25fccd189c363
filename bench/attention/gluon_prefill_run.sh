#!/usr/bin/env bash
# Gluon ping-pong causal prefill (gluon_attention_prefill, opt-in) on the GPU in one device call (issue 5):
# per configuration of RUN_CONFIGS (or GLUON_CONFIGS=a,b), in its own process (all at once) so that one
# that hangs or faults is cut by its own timeout: the GPU tests of tests/kernels/test_attention_gluon_gpu.py for it
# (GLUON_TEST_S, default 150 s); then one process times every configuration that passed beside the
# shipped Triton prefill at 8k / 32k / 128k (gluon_prefill_bench.py, GLUON_BENCH_S, default 300 s;
# GLUON_N=8192,... other lengths; GLUON_ROUNDS=2: every row twice; GLUON_REGISTERED=cfg: see below). First the configuration-free tests (bad input, schedule emulation).
# Writes $OUT/gluon_prefill.log, $OUT/gluon_prefill.json (rows; meta: commit, GPU, date) and
# $OUT/gluon_prefill_parts.tgz (per-configuration pytest logs). Copy gluon_prefill.json to bench/results/gluon-prefill-<date>.json afterwards.
set -u
cd "$(dirname "$0")/../.."
source bench/steps.sh
bench_env gluon_prefill.log
cfgs="${GLUON_CONFIGS:-$(python3 -c 'from dayzero.kernels.gluon_attention_prefill import RUN_CONFIGS as c; print(",".join(c))')}"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv | tee "$log"
parts="$OUT/parts"
mkdir -p "$parts"
# pytest on the test file, quiet, no cache, the repository's conftest not needed (an array: timeout runs it)
pt=(python3 -m pytest -q -p no:cacheprovider --noconftest -o addopts="" --durations=4 tests/kernels/test_attention_gluon_gpu.py)
echo "=== tests without a configuration" | tee -a "$log"
DAYZERO_GLUON_CFGS=pp2 timeout 120 "${pt[@]}" -k "schedule or tile_plan or protocol or unsupported or run_configs" 2>&1 | tee -a "$log"
# every configuration's tests at once, each in its own process under its own timeout (a hang or fault
# costs only that configuration; small cases, so they share the GPU)
echo "=== tests per configuration, in parallel ($(date -u +%H:%M:%S))" | tee -a "$log"
for c in ${cfgs//,/ }; do
  ( DAYZERO_GLUON_CFGS=$c timeout -k 5 "${GLUON_TEST_S:-150}" "${pt[@]}" -k "ragged or long or emulation_bitwise or registered" \
      > "$parts/test-$c.log" 2>&1; echo $? > "$parts/rc-$c" ) &
done
# GLUON_REGISTERED=cfg: the registered op's suites with DAYZERO_PREFILL_GLUON=cfg (the Gluon kernel where it
# applies, the Triton kernels elsewhere), beside the per-configuration tests: prefill cases of
# test_attention_gpu.py, test_attention_prefill_gpu.py (its shipped-default variant: no tile config, so the
# Gluon path) and the engine's FP8 model vs the torch ops (chunked prefill from row-strided q/k/v views)
if [ -n "${GLUON_REGISTERED:-}" ]; then
  reg_tests=(tests/kernels/test_attention_gpu.py tests/kernels/test_attention_prefill_gpu.py
             tests/kernels/test_engine_triton_gpu.py)
  xdist=$(python3 -c "import xdist" 2>/dev/null && echo "-n 4")
  ( DAYZERO_PREFILL_GLUON=$GLUON_REGISTERED DAYZERO_PREFILL_VARIANTS=default timeout -k 5 "${GLUON_TEST_S:-150}" \
      python3 -m pytest -q -p no:cacheprovider --noconftest -o addopts="" $xdist "${reg_tests[@]}" \
      -k "prefill or ragged or other_shapes or random or long or bad or triton_model" \
      > "$parts/test-registered.log" 2>&1
    echo $? > "$parts/rc-registered" ) &
fi
wait
if [ -n "${GLUON_REGISTERED:-}" ]; then
  echo "=== registered op with DAYZERO_PREFILL_GLUON=$GLUON_REGISTERED" | tee -a "$log"
  tail -n 12 "$parts/test-registered.log" | tee -a "$log"
  echo "=== registered: tests rc=$(cat "$parts/rc-registered")" | tee -a "$log"
  [ "$(cat "$parts/rc-registered")" = 0 ] || rc=1
fi
passed=""
for c in ${cfgs//,/ }; do
  trc=$(cat "$parts/rc-$c")
  echo "=== $c: tests" | tee -a "$log"
  tail -n 12 "$parts/test-$c.log" | tee -a "$log"
  echo "=== $c: tests rc=$trc" | tee -a "$log"
  if [ "$trc" = 0 ]; then passed="$passed,$c"; else rc=1; fi
done
# one timing process over every configuration whose tests passed: the Triton default first and last
# (drift), each row written to the JSON as it is measured (a hang keeps the rows before it)
if [ -n "$passed" ]; then
  echo "=== bench ${passed#,} ($(date -u +%H:%M:%S))" | tee -a "$log"
  timeout -k 5 "${GLUON_BENCH_S:-300}" python3 bench/attention/gluon_prefill_bench.py --out "$OUT" \
    --configs "${passed#,}" ${GLUON_N:+--n "$GLUON_N"} --rounds "${GLUON_ROUNDS:-1}" \
    ${GLUON_REGISTERED:+--registered "$GLUON_REGISTERED"} 2>&1 | tee -a "$log"
  brc=${PIPESTATUS[0]}
  echo "=== bench rc=$brc" | tee -a "$log"
  [ "$brc" = 0 ] || rc=1
else
  echo "=== no configuration passed its tests: nothing timed" | tee -a "$log"
fi
tar czf "$OUT/gluon_prefill_parts.tgz" -C "$OUT" parts && rm -rf "$parts"
echo "gluon prefill: rc=$rc" | tee -a "$log"
exit "$rc"
