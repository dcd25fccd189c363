#!/usr/bin/env bash
# The lead's closing device call (one call, ~400-450 s on a started machine; session 6 ran it as final_s6.sh):
# bench/final_call.sh with
# - every GPU test file except test_moe_small_gpu in parallel (pytest-xdist where named; two CPU threads a test
#   process), then the Gluon MoE and fused MoE files one by one (GPU memory: the MoE tests build 120B-sized experts);
# - test_moe_small_gpu filtered to the decode tiles default_tiles picks (read from the code) and the registered / graph-replay /
#   EP tests (the whole file is 26 variants x 6 T x 2 models) as FINAL_EXTRA, beside the FlashInfer builds
#   (cached in .fi-ws by an earlier call on the same warm machine: bench/candidates.sh attention);
# - the same-run FlashInfer / SDPA attention comparison and `dayzero bench all` for 20B and 120B.
# Needs .whl (FlashInfer wheels: bench/peers_fetch.sh) and .devmeta carried. DAYZERO_DEADLINE (default now + 490 s)
# caps the steps.
set -u
cd "$(dirname "$0")/.."
export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
export DAYZERO_DEADLINE="${DAYZERO_DEADLINE:-$(( $(date +%s) + 490 ))}"
FINAL_TESTS="$(ls tests/kernels/test_*_gpu.py | grep -v test_moe_small_gpu | tr '\n' ' ')"
export FINAL_TESTS
export FINAL_SERIAL="test_moe_gluon_gpu test_moe_gpu"
export FINAL_XDIST="test_attention_gpu=3,test_attention_gluon_window_gpu=2,test_moe_gluon_gpu=4"
export FINAL_TEST_S="${FINAL_TEST_S:-170}" FINAL_FI_BUILD_S="${FINAL_FI_BUILD_S:-250}" FINAL_FI_S="${FINAL_FI_S:-100}"
export FINAL_EXTRA_S="${FINAL_EXTRA_S:-90}"
# the decode-MoE tiles that default_tiles picks at the tested T (1, 2, 4, 7, 8 and 16: 4-64 pairs) for 32 and 128 experts
shipped=$(PYTHONPATH=shared python3 -c "
from dayzero.kernels.triton_moe_small_split import VARIANTS, default_tiles
names = {id(v): n for n, v in VARIANTS.items()}
print(' or '.join(sorted({names[id(default_tiles(p, e))] for p in (4, 8, 16, 28, 32, 64) for e in (32, 128)})))" \
  2>/dev/null || echo "wg_d64_s2_qt or wg2_d64_s2_qtp_st3 or wg8_d64_qtp or wg8_d64_qtp_st2 or wgs8_d64_qt or bn64_x16")
small_k="(split_vs_reference and ($shipped)) or registered or graph_replay"
small_k="$small_k or no_local or gemv_t1 or per_pair or expert_parallel or repeated or override"
export FINAL_EXTRA="DAYZERO_MOE_SMALL_TEST_TS=1,2,4,7,8,16 python3 -m pytest -q -n 2 -p no:cacheprovider --noconftest \
-o addopts='' --junitxml=\"\$OUT/test_moe_small_gpu.xml\" tests/kernels/test_moe_small_gpu.py -k '$small_k' \
>\"\$OUT/test_moe_small_gpu.log\" 2>&1; tail -n 3 \"\$OUT/test_moe_small_gpu.log\""
exec bash bench/final_call.sh
