#!/usr/bin/env bash
# Table 2 on one accelerator (scripts/gpu/ and scripts/tpu/ call this): T5 1.1 XXL target with a small, base and large draft, WMT
# EnDe test split (newstest2014), batch 1, greedy and temperature 1, with real
# T5X checkpoints and the prepared TFDS dataset. Run on the accelerator
# machine from a checkout of this repository:
#
#   JAX_EXTRA=cuda12 CKPT_DIR=gs://my-bucket/t5x TFDS_DATA_DIR=gs://my-bucket/tfds \
#   RESULTS=gs://my-bucket/results/$(date +%F) scripts/table2.sh
#
# CKPT_DIR holds one T5X checkpoint directory per size, named below (override
# with XXL_CKPT=..., SMALL_CKPT=..., etc.): a checkpoint_<step> directory or
# its model directory (the latest step is read). RESULTS may be a bucket or a
# local directory. Without checkpoints, EMULATE_ALPHA=0.75 times random
# weights at that acceptance rate instead (labelled as an emulation).
set -euo pipefail

: "${CKPT_DIR:?set CKPT_DIR to the directory (or bucket) of the T5X checkpoints}"
: "${TFDS_DATA_DIR:?set TFDS_DATA_DIR to the prepared TFDS data (wmt_t2t_translate)}"
: "${RESULTS:?set RESULTS to a local directory or gs:// bucket for the reports}"
XXL_CKPT=${XXL_CKPT:-$CKPT_DIR/t5_1_1_xxl_wmt_ende}
SMALL_CKPT=${SMALL_CKPT:-$CKPT_DIR/t5_1_1_small_wmt_ende}
BASE_CKPT=${BASE_CKPT:-$CKPT_DIR/t5_1_1_base_wmt_ende}
LARGE_CKPT=${LARGE_CKPT:-$CKPT_DIR/t5_1_1_large_wmt_ende}
VOCAB_URL=${VOCAB_URL:-gs://t5-data/vocabs/cc_all.32000/sentencepiece.model}
PAIRS=${PAIRS:-"xxl_small xxl_base xxl_large"}
NUM_EXAMPLES=${NUM_EXAMPLES:-64}
EMULATE_ALPHA=${EMULATE_ALPHA:-None}
WORK=${WORK:-/tmp/speculative_t5x_table2}
JAX_EXTRA=${JAX_EXTRA:?set JAX_EXTRA to cuda12 (GPU) or tpu}  # jax[...] for the device

cd "$(dirname "$0")/.."
python3 -m venv "$WORK/venv"
"$WORK/venv/bin/pip" install --quiet --upgrade pip
# The package first, then JAX's build for the accelerator (same JAX version).
"$WORK/venv/bin/pip" install --quiet -e .
"$WORK/venv/bin/pip" install --quiet "jax[$JAX_EXTRA]==$("$WORK/venv/bin/python" -c 'import jax; print(jax.__version__)')"
"$WORK/venv/bin/python" -c 'import jax; print(jax.devices())'

# BLEU and the n-gram drafts read the vocabulary as a local file.
mkdir -p "$WORK/results"
"$WORK/venv/bin/python" -c "import tensorflow as tf, sys; tf.io.gfile.copy(sys.argv[1], sys.argv[2], overwrite=True)" \
  "$VOCAB_URL" "$WORK/spm.model"

for pair in $PAIRS; do
  draft_size=${pair#xxl_}
  draft_ckpt_var=${draft_size^^}_CKPT
  if [[ $EMULATE_ALPHA == None ]]; then
    models=(--gin.CHECKPOINT_PATH="'$XXL_CKPT'" --gin.DRAFT_CHECKPOINT_PATH="'${!draft_ckpt_var}'"
            --gin_file=configs/tasks/wmt_ende.gin)
  else
    models=(--gin.CHECKPOINT_PATH=None --gin.TASK=None --gin.EMULATE_ALPHA="$EMULATE_ALPHA"
            --gin.TARGET=@target/models.random_model\(\) --gin.DRAFT=@draft/models.random_model\(\))
  fi
  TFDS_DATA_DIR=$TFDS_DATA_DIR "$WORK/venv/bin/python" -m speculative_t5x_lab.benchmark \
    --gin_file="configs/pairs/$pair.gin" \
    "${models[@]}" \
    --gin_file=configs/runs/benchmark.gin \
    --gin.VOCABULARY="'$WORK/spm.model'" \
    --gin.NUM_EXAMPLES="$NUM_EXAMPLES" \
    --gin.MAX_DECODE_LEN=128 \
    --gin.benchmark_pair.pair_name="'T5-XXL / T5-${draft_size}'" \
    --gin.benchmark_pair.task_name="'WMT EnDe newstest2014'" \
    --gin.BENCHMARK_OUTPUT_DIR="'$WORK/results/$pair'"
done

"$WORK/venv/bin/python" -c "import tensorflow as tf, sys, os
for root, _, files in tf.io.gfile.walk(sys.argv[1]):
  for name in files:
    target = os.path.join(sys.argv[2], os.path.relpath(os.path.join(root, name), sys.argv[1]))
    tf.io.gfile.makedirs(os.path.dirname(target))
    tf.io.gfile.copy(os.path.join(root, name), target, overwrite=True)" "$WORK/results" "$RESULTS"
echo "Reports: $RESULTS/<pair>/benchmark.md"
