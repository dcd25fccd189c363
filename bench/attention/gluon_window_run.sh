#!/usr/bin/env bash
# Gluon sliding-window prefill (gluon_attention_window; the registered op's window-128 prefill path) on the GPU
# in one device call (issue 5): the configuration-free tests (schedule emulation, bad input), then per
# configuration of GLUON_WINDOW_CONFIGS (default: RUN_CONFIGS), each in its own process at once under its own
# timeout (GLUON_WINDOW_TEST_S, default 70 s: a configuration that hangs costs only itself), the GPU tests of
# tests/kernels/test_attention_gluon_window_gpu.py; with GLUON_WINDOW_REG_CFGS the registered op's suites next
# (below); then one timing process over the configurations that passed beside the shipped Triton window kernel
# and the registered op at 8k / 32k (gluon_window_bench.py, GLUON_WINDOW_BENCH_S, default 70 s;
# GLUON_WINDOW_N=8192,... other lengths). Fits a 150 s device call (session 6 call 2: 72 s warm).
# Writes $OUT/gluon_window.log, $OUT/gluon_window.json (rows; meta: commit, GPU, date) and
# $OUT/gluon_window_parts.tgz (per-configuration pytest logs); with GLUON_WINDOW_DIAG also
# $OUT/gluon_window_diag.json (diagnostic configurations, timed only). Copy gluon_window.json to
# bench/results/gluon-window-<date>.json afterwards.
set -u
cd "$(dirname "$0")/../.."
source bench/steps.sh
bench_env gluon_window.log
cfgs="${GLUON_WINDOW_CONFIGS:-$(python3 -c 'from dayzero.kernels.gluon_attention_window import RUN_CONFIGS as c; print(",".join(c))')}"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv | tee "$log"
parts="$OUT/parts"
mkdir -p "$parts"
# -u -v: each test's name is in its log before it runs, unbuffered (a process the timeout kills loses nothing: session
# 8's hung ring configurations left empty logs, so which test hung was not known)
pt=(python3 -u -m pytest -v -p no:cacheprovider --noconftest -o addopts="" --durations=4
    tests/kernels/test_attention_gluon_window_gpu.py)
# the configuration-free tests (CPU schedule, bad input) and every configuration's GPU tests at once, each
# in its own process under its own timeout (a hang or fault costs only that process; small cases)
# one CPU thread per test process: 6-9 processes x torch's default thread count spun against each other
# (session 5: the CPU emulation test took 42-55 s on the device, 0.06 s alone)
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
echo "=== tests, in parallel ($(date -u +%H:%M:%S))" | tee -a "$log"
( DAYZERO_GLUON_WINDOW_CFGS=w2 timeout -k 5 "${GLUON_WINDOW_TEST_S:-70}" "${pt[@]}" \
    -k "emulation_matches or emulation_extreme or check_can_fail or cta_tiles or bounds or chunks or refuses or listed or unsupported" \
    > "$parts/test-common.log" 2>&1; echo $? > "$parts/rc-common" ) &
# the diagnostic configurations (GLUON_WINDOW_DIAG, below) compiled meanwhile: their timing process then hits the cache
if [ -n "${GLUON_WINDOW_DIAG:-}" ]; then
  ( timeout -k 5 "${GLUON_WINDOW_TEST_S:-70}" python3 bench/attention/gluon_window_bench.py --warm \
      --configs "$GLUON_WINDOW_DIAG" ${GLUON_WINDOW_N:+--n "$GLUON_WINDOW_N"} > "$parts/warm-diag.log" 2>&1 ) &
fi
# at most GLUON_WINDOW_PAR (default 5) configuration processes at once: each long test's torch reference holds
# ~21.6 GB of GPU memory (session 6: 8 at once ran the GPU out of memory, twice)
cpids=()
for c in ${cfgs//,/ }; do
  if [ "${#cpids[@]}" -ge "${GLUON_WINDOW_PAR:-5}" ]; then wait "${cpids[0]}"; cpids=("${cpids[@]:1}"); fi
  ( DAYZERO_GLUON_WINDOW_CFGS=$c timeout -k 5 "${GLUON_WINDOW_TEST_S:-70}" "${pt[@]}" \
      -k "ragged or narrow or long or matches_emulation" > "$parts/test-$c.log" 2>&1; echo $? > "$parts/rc-$c" ) &
  cpids+=($!)
done
wait
# GLUON_WINDOW_REG_CFGS=a,b (candidates for the registered op's default, DAYZERO_WINDOW_GLUON): then the registered
# op's window suites, in parallel with each other (not with the tests above: together they ran the GPU out of
# memory in session 6's call 2): the dispatch tests under each candidate, test_attention_gpu.py's Gluon-path case
# (window-128 ragged prefill) under each, and under the shipped default test_attention_gpu.py -k window and
# test_attention_prefill_gpu.py whole (GLUON_WINDOW_REG_S, default 90 s each)
reg="${GLUON_WINDOW_REG_CFGS:-}"
regs=()
if [ -n "$reg" ]; then
  rt=(timeout -k 5 "${GLUON_WINDOW_REG_S:-90}" python3 -u -m pytest -q -p no:cacheprovider --noconftest -o addopts=""
      --durations=3)
  ( DAYZERO_WINDOW_REG_CFGS=$reg "${rt[@]}" tests/kernels/test_attention_gluon_window_gpu.py \
      -k registered_window > "$parts/test-reg-dispatch.log" 2>&1; echo $? > "$parts/rc-reg-dispatch" ) &
  regs+=(reg-dispatch)
  for c in ${reg//,/ }; do
    ( DAYZERO_WINDOW_GLUON=$c "${rt[@]}" tests/kernels/test_attention_gpu.py -k "prefill_ragged and 128" \
        > "$parts/test-reg-op-$c.log" 2>&1; echo $? > "$parts/rc-reg-op-$c" ) &
    regs+=("reg-op-$c")
  done
  ( "${rt[@]}" tests/kernels/test_attention_gpu.py -k window > "$parts/test-reg-window.log" 2>&1
    echo $? > "$parts/rc-reg-window" ) &
  ( "${rt[@]}" tests/kernels/test_attention_prefill_gpu.py > "$parts/test-reg-prefill.log" 2>&1
    echo $? > "$parts/rc-reg-prefill" ) &
  regs+=(reg-window reg-prefill)
fi
wait
for r in "${regs[@]}"; do
  echo "=== $r: tests" | tee -a "$log"
  tail -n 6 "$parts/test-$r.log" | tee -a "$log"
  echo "=== $r: tests rc=$(cat "$parts/rc-$r")" | tee -a "$log"
  [ "$(cat "$parts/rc-$r")" = 0 ] || rc=1
done
echo "=== configuration-free tests" | tee -a "$log"
tail -n 8 "$parts/test-common.log" | tee -a "$log"
echo "=== configuration-free tests rc=$(cat "$parts/rc-common")" | tee -a "$log"
[ "$(cat "$parts/rc-common")" = 0 ] || rc=1
passed=""
for c in ${cfgs//,/ }; do
  trc=$(cat "$parts/rc-$c")
  echo "=== $c: tests" | tee -a "$log"
  tail -n 12 "$parts/test-$c.log" | tee -a "$log"
  echo "=== $c: tests rc=$trc" | tee -a "$log"
  if [ "$trc" = 0 ]; then passed="$passed,$c"; else rc=1; fi
done
if [ -n "$passed" ]; then
  echo "=== bench ${passed#,} ($(date -u +%H:%M:%S))" | tee -a "$log"
  timeout -k 5 "${GLUON_WINDOW_BENCH_S:-70}" python3 bench/attention/gluon_window_bench.py --out "$OUT" \
    --configs "${passed#,}" ${GLUON_WINDOW_N:+--n "$GLUON_WINDOW_N"} 2>&1 | tee -a "$log"
  brc=${PIPESTATUS[0]}
  echo "=== bench rc=$brc" | tee -a "$log"
  [ "$brc" = 0 ] || rc=1
else
  echo "=== no configuration passed its tests: nothing timed" | tee -a "$log"
fi
# GLUON_WINDOW_DIAG=a,b: diagnostic configurations (DIAG_CONFIGS; wrong output, never tested), timed in a process of
# their own after the others (a hang costs only them): $OUT/gluon_window_diag.json
if [ -n "${GLUON_WINDOW_DIAG:-}" ]; then
  echo "=== diagnostics ${GLUON_WINDOW_DIAG} ($(date -u +%H:%M:%S))" | tee -a "$log"
  timeout -k 5 "${GLUON_WINDOW_DIAG_S:-60}" python3 bench/attention/gluon_window_bench.py --out "$OUT" --diag \
    --json-name gluon_window_diag.json --configs "$GLUON_WINDOW_DIAG" ${GLUON_WINDOW_N:+--n "$GLUON_WINDOW_N"} \
    2>&1 | tee -a "$log"
  echo "=== diagnostics rc=${PIPESTATUS[0]}" | tee -a "$log"
fi
# machine paths out of the saved logs
sed -i -E "s#$(pwd)/#<repo>/#g"'; s#(/[A-Za-z0-9._-]+)+/(site-packages|dist-packages)/#<site>/#g; s#/(root|tmp)/[^ :]*#<path>#g' \
  "$log" "$parts"/*.log "$OUT"/gluon_window*.json 2>/dev/null
tar czf "$OUT/gluon_window_parts.tgz" -C "$OUT" parts && rm -rf "$parts"
echo "gluon window: rc=$rc" | tee -a "$log"
exit "$rc"
