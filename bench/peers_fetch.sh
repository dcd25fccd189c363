#!/usr/bin/env bash
# Fetch the same-run peers' wheels into .whl/ (git-ignored) on this machine, for the device calls that
# carry .whl (bench/peers_install.sh installs them there): FlashInfer 0.7.2.post1, apache-tvm-ffi 0.1.11,
# cuda-tile, built for the lent GPU's Python 3.12 on x86_64 manylinux, without their other dependencies
# (63 MiB as downloaded: with the tracked tree that is over a call's 64 MiB carry, so the pure-Python
# FlashInfer wheel is repacked as a tar.xz of its contents, ~17 MiB; peers_install.sh unpacks it).
set -eu
cd "$(dirname "$0")/.."
mkdir -p .whl
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d .whl flashinfer-python==0.7.2.post1 apache-tvm-ffi==0.1.11 cuda-tile
# a py3-none-any wheel installs by unpacking, so its contents as tar.xz install the same way
for w in .whl/flashinfer_python-*-py3-none-any.whl; do
  [ -e "$w" ] || continue
  python3 - "$w" <<'PY'
import sys, tarfile, tempfile, zipfile
whl = sys.argv[1]
with tempfile.TemporaryDirectory() as d:
    zipfile.ZipFile(whl).extractall(d)
    with tarfile.open(whl[: -len(".whl")] + ".tar.xz", "w:xz", preset=6) as t:
        t.add(d, arcname=".")
PY
  rm -f "$w"
done
ls -l .whl
