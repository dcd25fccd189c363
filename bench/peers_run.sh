#!/usr/bin/env bash
# Same-run peers on the GPU: FlashInfer's sink attention beside ours on the same tensors, then HF
# transformers at its fastest settings beside the engine (20B, logits at 2048 tokens, prefill 8192,
# decode batch 1 and 64 with both small-M linear kernels, per-op breakdown).
# Source bench/peers_install.sh first (FlashInfer from the carried .whl/); without it the FlashInfer
# part is skipped. Writes $OUT/flashinfer.json, $OUT/e2e-hf-20b.json and $OUT/peers.log.
# PEERS_FI_S / PEERS_HF_S: time caps of the two parts (default 230 / 280 s); PEERS_FI=0 skips FlashInfer
# (e.g. right after bench/final_call.sh, which ran it).
set -u
cd "$(dirname "$0")/.."
source bench/steps.sh
bench_env peers.log
fi_s=${PEERS_FI_S:-230}
hf_s=${PEERS_HF_S:-280}
if [ "${PEERS_FI:-1}" = 1 ] && python3 -c "import flashinfer" 2>/dev/null; then
  timeout "$fi_s" python3 bench/attention/flashinfer_compare.py --out "$OUT" --budget-s $(( fi_s - 20 )) --no-128k \
    2>&1 | tee -a "$log" || rc=1
else
  echo "peers: flashinfer skipped (PEERS_FI=${PEERS_FI:-1} or it does not import)" | tee -a "$log"
fi
timeout "$hf_s" python3 bench/moe/e2e_hf.py --out "$OUT" --model 20b --tokens 2048 --prefill-tokens 8192 \
  --breakdown --small-m-linear w8a16,gemv --budget-s $(( hf_s - 40 )) 2>&1 | tee -a "$log" || rc=1
echo "peers: rc=$rc" | tee -a "$log"
exit $rc
