#!/usr/bin/env bash
# Gluon ping-pong causal prefill (gluon_attention_prefill, opt-in) on the GPU in one device call (issue 5):
# per configuration of RUN_CONFIGS (or GLUON_CONFIGS=a,b), in its own process (all at once) so that one
# that hangs or faults is cut by its own timeout: the GPU tests of tests/kernels/test_attention_gluon_gpu.py for it
# (GLUON_TEST_S, default 150 s); then one process times every configuration that passed beside the
# shipped Triton prefill at 8k / 32k / 128k (gluon_prefill_bench.py, GLUON_BENCH_S, default 300 s;
# GLUON_N=8192,... other lengths). First the configuration-free tests (bad input, schedule emulation).
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
pt=(python3 -m pytest -q -p no:cacheprovider --noconftest -o addopts="" tests/kernels/test_attention_gluon_gpu.py)
echo "=== tests without a configuration" | tee -a "$log"
DAYZERO_GLUON_CFGS=pp2 timeout 120 "${pt[@]}" -k "schedule or tile_plan or protocol or unsupported or run_configs" 2>&1 | tee -a "$log"
# every configuration's tests at once, each in its own process under its own timeout (a hang or fault
# costs only that configuration; small cases, so they share the GPU)
echo "=== tests per configuration, in parallel ($(date -u +%H:%M:%S))" | tee -a "$log"
for c in ${cfgs//,/ }; do
  ( DAYZERO_GLUON_CFGS=$c timeout -k 5 "${GLUON_TEST_S:-150}" "${pt[@]}" -k "ragged or long or emulation_bitwise" \
      > "$parts/test-$c.log" 2>&1; echo $? > "$parts/rc-$c" ) &
done
wait
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
    --configs "${passed#,}" ${GLUON_N:+--n "$GLUON_N"} 2>&1 | tee -a "$log"
  brc=${PIPESTATUS[0]}
  echo "=== bench rc=$brc" | tee -a "$log"
  [ "$brc" = 0 ] || rc=1
else
  echo "=== no configuration passed its tests: nothing timed" | tee -a "$log"
fi
tar czf "$OUT/gluon_prefill_parts.tgz" -C "$OUT" parts && rm -rf "$parts"
echo "gluon prefill: rc=$rc" | tee -a "$log"
exit "$rc"
