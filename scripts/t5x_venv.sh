#!/usr/bin/env bash
# The side venv of `make test-t5x`: the real T5X (google-research/t5x, Apache 2.0; not on PyPI),
# this project with its test extras, and the import stubs of speculative_t5x/t5x_stubs, installed by the
# recipe of docs/t5x.md ("Install") line for line. Nothing of T5X enters the repository: its source
# is unpacked into the venv folder (git-ignored).
#
#   scripts/t5x_venv.sh [VENV]                 (default .venv-t5x; run from anywhere)
#
# T5X's source: T5X_SOURCE=<a T5X source tree> (a clone of google-research/t5x), else the snapshot
# T5X_SNAPSHOT (default ../shared/vendor/t5x-cc342d4.tar.gz beside the checkout: T5X at commit
# cc342d41, what CI installs, offline). The venv is reused while setup.py, this script and the T5X
# source are unchanged (the key in VENV/.installed); otherwise it is rebuilt from scratch. Any
# failure, including a T5X that does not import, stops with a non-zero status.
set -euo pipefail
SCRIPT=$(cd "$(dirname "$0")" && pwd)/$(basename "$0")
ROOT=$(dirname "$(dirname "$SCRIPT")")
cd "$ROOT"
VENV=${1:-.venv-t5x}
case $VENV in /*) ;; *) VENV=$ROOT/$VENV ;; esac
STAMP=$VENV/.installed

if [ -n "${T5X_SOURCE:-}" ]; then
  T5X_SOURCE=$(cd "$T5X_SOURCE" && pwd)
  if [ ! -f "$T5X_SOURCE/t5x/infer.py" ]; then
    echo "T5X_SOURCE=$T5X_SOURCE is not a T5X source tree (no t5x/infer.py)." >&2
    exit 1
  fi
  SOURCE_KEY="source $T5X_SOURCE"
else
  T5X_SNAPSHOT=${T5X_SNAPSHOT:-$ROOT/../shared/vendor/t5x-cc342d4.tar.gz}
  if [ ! -f "$T5X_SNAPSHOT" ]; then
    echo "No T5X snapshot at $T5X_SNAPSHOT: set T5X_SOURCE to a T5X source tree" \
      "(git clone https://github.com/google-research/t5x) or T5X_SNAPSHOT to a tarball of one." >&2
    exit 1
  fi
  SOURCE_KEY="snapshot $(sha256sum < "$T5X_SNAPSHOT" | cut -d' ' -f1)"
fi
KEY="$(cat setup.py "$SCRIPT" | sha256sum | cut -d' ' -f1) $SOURCE_KEY"
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$KEY" ]; then
  echo "Reusing $VENV (T5X: $SOURCE_KEY)."
  exit 0
fi

echo "Building $VENV (T5X: $SOURCE_KEY) ..."
rm -rf "$VENV"
python3 -m venv "$VENV"
# shellcheck disable=SC1091
source "$VENV/bin/activate"
export PIP_QUIET=1
pip install --upgrade pip
# The recipe of docs/t5x.md, from the checkout's root ...
pip install -e .                                   # this package, with jax, flax, seqio, orbax
echo "$PWD/speculative_t5x/t5x_stubs" > "$(python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/t5x_stubs.pth"
# ... and for the tests, as the Makefile's .venv: CPU PyTorch first (no CUDA build), the extras.
pip install torch==2.13.0
pip install -e '.[test]'
# The recipe's `git clone https://github.com/google-research/t5x`: the snapshot (or T5X_SOURCE) as
# ./t5x, in the venv's folder rather than the checkout.
cd "$VENV"
if [ -n "${T5X_SOURCE:-}" ]; then
  ln -s "$T5X_SOURCE" t5x
else
  mkdir t5x
  tar -xzf "$T5X_SNAPSHOT" -C t5x --strip-components=1
fi
pip install --no-deps -e ./t5x                     # its git+https dependencies are already here
pip install cached-property chex fiddle jaxtyping tensorboard
pip install --no-deps t5 babel scikit-learn threadpoolctl narwhals   # `t5`, for base_wmt_infer.gin's task
cd "$ROOT"

# The check: T5X, its infer main, the `t5` package's tasks and our T5X model classes import.
JAX_PLATFORMS=cpu python -c '
import t5x, t5x.infer, t5.data
from speculative_t5x import t5x_models
print("t5x", t5x.__file__, t5x_models.SpeculativeEncoderDecoderModel.__mro__[1])'
echo "$KEY" > "$STAMP"
