#!/usr/bin/env bash
# Fetch the same-run peers' wheels into .whl/ (git-ignored) on this machine, for the device calls that
# carry .whl (bench/peers_install.sh installs them there): FlashInfer 0.7.2.post1, apache-tvm-ffi 0.1.11,
# cuda-tile, built for the lent GPU's Python 3.12 on x86_64 manylinux, without their other dependencies
# (~63 MiB together: nearly all of a call's 64 MiB carry).
set -eu
cd "$(dirname "$0")/.."
mkdir -p .whl
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d .whl flashinfer-python==0.7.2.post1 apache-tvm-ffi==0.1.11 cuda-tile
ls -l .whl
