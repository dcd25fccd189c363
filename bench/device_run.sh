#!/usr/bin/env bash
# The one script for the lent GPU: every area's GPU tests and benchmarks, results under $OUT.
# Each area adds one line below (its own run.sh), in priority order. Keep NVLink multicast off.
# Optional:
#   DEVICE_BUDGET_S=N  the whole script ends within N seconds: each area (and each step of the
#                      engine area) is cut off by `timeout` at the deadline; later areas get the rest.
#   DEVICE_PACK=1      areas write to a scratch folder, packed after every area into $OUT/results.tgz
#                      (the device call returns at most 8 files; a cut-off run keeps what finished).
#   MOE_STEPS / MOE_KERNEL_ARGS / ENGINE_STEPS / ATTENTION_ARGS / LINEAR_ARGS: passed to the areas' scripts.
#   DEVICE_AREAS=a,b   run only these areas (engine, moe, attention, linear, peers), in the order above;
#                      default: all but peers (FlashInfer + HF beside ours: bench/peers_run.sh).
set -u
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0
final="${OUT:-out}"
mkdir -p "$final"
if [ "${DEVICE_PACK:-0}" = 1 ]; then export OUT="$(mktemp -d)"; else export OUT="$final"; fi
[ -n "${DEVICE_BUDGET_S:-}" ] && export DAYZERO_DEADLINE=$(( $(date +%s) + DEVICE_BUDGET_S ))
rc=0
area() {  # area NAME CMD...
  local name=$1; shift
  case ",${DEVICE_AREAS:-engine,moe,attention,linear}," in *",$name,"*) ;; *) return 0 ;; esac
  local t=86400
  [ -n "${DAYZERO_DEADLINE:-}" ] && t=$(( DAYZERO_DEADLINE - $(date +%s) ))
  if [ "$t" -le 10 ]; then echo "device_run: $name skipped (budget spent)"; rc=1; return 0; fi
  echo "device_run: $name ($(date -u +%H:%M:%S), ${t}s left)"
  timeout "$t" "$@" || { echo "device_run: $name failed or cut off"; rc=1; }
  [ "$OUT" != "$final" ] && tar czf "$final/results.tgz" -C "$OUT" .
  return 0
}
area engine bash bench/engine/run.sh
[ -f bench/moe/run.sh ] && area moe bash bench/moe/run.sh
area attention bash bench/attention/run.sh ${ATTENTION_ARGS:-}
area linear bash bench/linear/run.sh ${LINEAR_ARGS:-}
area peers bash bench/peers_run.sh
exit $rc
