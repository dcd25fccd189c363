# Sourced by the areas' run.sh (from the repository root). `bench_env LOGNAME` sets what every script
# needs: the project on PYTHONPATH, unbuffered output, NVLink multicast off, DAYZERO_COMMIT (from the
# carried .devmeta/commit), $OUT (created), $log = $OUT/LOGNAME and rc=0.
bench_env() {
  export PYTHONPATH="shared${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
  export DAYZERO_COMMIT="${DAYZERO_COMMIT:-$(cat .devmeta/commit 2>/dev/null || echo unknown)}"
  OUT="${OUT:-out}"
  mkdir -p "$OUT"
  log="$OUT/$1"
  rc=0
}

# Also sourced: `step NAME TIMEOUT_S CMD...` runs CMD if NAME is in $steps
# (",a,b,"), capped at TIMEOUT_S and at $DAYZERO_DEADLINE (epoch seconds) when set, appending its
# output to $log; a failure or a skip sets rc=1.
step() {
  local name=$1 t=$2; shift 2
  case "$steps" in *",$name,"*) ;; *) return 0 ;; esac
  if [ -n "${DAYZERO_DEADLINE:-}" ]; then
    local left=$(( DAYZERO_DEADLINE - $(date +%s) ))
    [ "$left" -lt "$t" ] && t=$left
    if [ "$t" -le 5 ]; then echo "=== $name skipped (deadline)" | tee -a "$log"; rc=1; return 0; fi
  fi
  echo "=== $name ($(date -u +%H:%M:%S), cap ${t}s)" | tee -a "$log"
  timeout "$t" "$@" 2>&1 | tee -a "$log"
  local r=${PIPESTATUS[0]}
  echo "=== $name rc=$r" | tee -a "$log"
  [ "$r" = 0 ] || rc=1
}
