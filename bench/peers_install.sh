#!/usr/bin/env bash
# Install the same-run peers (FlashInfer 0.7.2.post1 + apache-tvm-ffi + cuda-tile) from local wheels,
# outside the repository, without their other dependencies (the lent GPU has no internet).
# SOURCE it so PYTHONPATH reaches the benchmarks:
#     source bench/peers_install.sh && bash bench/device_run.sh
# Wheels: .whl/*.whl in the repository root (git-excluded; name .whl in the device call's carry),
# or PEERS_WHEELS=DIR. Target: PEERS_SITE (default /tmp/site). Nothing to install is not an error:
# the FlashInfer comparison is then skipped by its guard in bench/attention/run.sh.
_peers_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
_peers_wheels="${PEERS_WHEELS:-$_peers_root/.whl}"
export PEERS_SITE="${PEERS_SITE:-/tmp/site}"
# FlashInfer's JIT cache (shared by the parallel builds of flashinfer_compare.py): a git-ignored folder of the
# repository, which the device tool keeps between calls on a warm machine (a later call's builds load from it)
export FLASHINFER_WORKSPACE_BASE="${FLASHINFER_WORKSPACE_BASE:-$_peers_root/.fi-ws}"
if compgen -G "$_peers_wheels/*.whl" >/dev/null || compgen -G "$_peers_wheels/*.tar.xz" >/dev/null; then
  mkdir -p "$PEERS_SITE"
  _peers_unpack() {  # a pure-Python wheel repacked as tar.xz by peers_fetch.sh (to fit the carry): unpacked as pip would
    python3 - "$PEERS_SITE" "$_peers_wheels" <<'PY' || return 1
import glob, os, sys, tarfile
for p in glob.glob(os.path.join(sys.argv[2], "*.tar.xz")):
    with tarfile.open(p) as t:
        t.extractall(sys.argv[1], filter="data")
PY
    if compgen -G "$_peers_wheels/*.whl" >/dev/null; then
      python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target "$PEERS_SITE" "$_peers_wheels"/*.whl
    fi
  }
  if _peers_unpack; then
    case ":${PYTHONPATH:-}:" in *":$PEERS_SITE:"*) ;; *) export PYTHONPATH="$PEERS_SITE${PYTHONPATH:+:$PYTHONPATH}" ;; esac
    echo "peers_install: installed $(ls "$_peers_wheels"/*.whl "$_peers_wheels"/*.tar.xz 2>/dev/null | wc -l) wheels into $PEERS_SITE"
    python3 -c "import flashinfer; print('peers_install: flashinfer', flashinfer.__version__)" \
      || echo "peers_install: flashinfer does not import (the comparison will be skipped)"
  else
    echo "peers_install: pip install failed (the FlashInfer comparison will be skipped)"
  fi
else
  echo "peers_install: no wheels in $_peers_wheels (the FlashInfer comparison will be skipped)"
fi
unset -f _peers_unpack; unset _peers_root _peers_wheels
true
