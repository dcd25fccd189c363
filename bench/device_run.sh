#!/usr/bin/env bash
# The one script for the lent GPU: every area's GPU tests and benchmarks, results under $OUT.
# Each area adds one line below (its own run.sh). Keep NVLink multicast off.
set -u
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 OUT="${OUT:-out}"
rc=0
bash bench/attention/run.sh || rc=1
if [ -f bench/moe/run.sh ]; then bash bench/moe/run.sh || rc=1; fi
exit $rc
