#!/usr/bin/env bash
# Table 2 on a single GPU machine (CUDA 12 driver), run from a checkout:
#
#   CKPT_DIR=gs://my-bucket/t5x TFDS_DATA_DIR=gs://my-bucket/tfds \
#   RESULTS=gs://my-bucket/results/gpu scripts/gpu/table2.sh
#
# Every variable of scripts/table2.sh applies (PAIRS, NUM_EXAMPLES,
# EMULATE_ALPHA, XXL_CKPT, ...). The XXL target needs 22 GB in bfloat16 plus
# caches: an 40/80 GB A100, H100 or H200.
set -euo pipefail
JAX_EXTRA=${JAX_EXTRA:-cuda12} exec "$(dirname "$0")/../table2.sh"
