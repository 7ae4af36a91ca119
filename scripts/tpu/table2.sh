#!/usr/bin/env bash
# Table 2 on a Cloud TPU v4 VM, as the paper measured it (one chip, batch 1):
# creates the VM, installs this repository on it, runs scripts/table2.sh, and
# leaves the reports in RESULTS (a gs:// bucket the VM can write to).
#
#   PROJECT=my-project ZONE=us-central2-b CKPT_DIR=gs://my-bucket/t5x \
#   TFDS_DATA_DIR=gs://my-bucket/tfds RESULTS=gs://my-bucket/results/tpu \
#   scripts/tpu/table2.sh
#
# The benchmark runs on the VM's first chip (jax's default device), like the
# paper's single TPU-v4. DELETE_VM=1 deletes the VM at the end.
set -euo pipefail

: "${PROJECT:?set PROJECT to the Google Cloud project}"
: "${ZONE:?set ZONE to a zone with TPU v4, e.g. us-central2-b}"
: "${CKPT_DIR:?set CKPT_DIR to the bucket of the T5X checkpoints}"
: "${TFDS_DATA_DIR:?set TFDS_DATA_DIR to the bucket of the prepared TFDS data}"
: "${RESULTS:?set RESULTS to a gs:// directory for the reports}"
TPU_NAME=${TPU_NAME:-speculative-t5x-table2}
ACCELERATOR=${ACCELERATOR:-v4-8}
RUNTIME=${RUNTIME:-tpu-ubuntu2204-base}
REPO_URL=${REPO_URL:?set REPO_URL to the git URL of this repository}
REPO_REF=${REPO_REF:-main}
# Passed through to scripts/table2.sh on the VM.
PASS=(PAIRS NUM_EXAMPLES EMULATE_ALPHA XXL_CKPT SMALL_CKPT BASE_CKPT LARGE_CKPT VOCAB_URL)

gcloud compute tpus tpu-vm create "$TPU_NAME" --project="$PROJECT" --zone="$ZONE" \
  --accelerator-type="$ACCELERATOR" --version="$RUNTIME"

environment="JAX_EXTRA=tpu CKPT_DIR=$CKPT_DIR TFDS_DATA_DIR=$TFDS_DATA_DIR RESULTS=$RESULTS"
for name in "${PASS[@]}"; do
  if [[ -n ${!name:-} ]]; then environment+=" $name=${!name}"; fi
done
gcloud compute tpus tpu-vm ssh "$TPU_NAME" --project="$PROJECT" --zone="$ZONE" --command="
  set -euo pipefail
  sudo apt-get -qq update && sudo apt-get -qq install -y python3-venv git
  rm -rf speculative_t5x && git clone --quiet --branch $REPO_REF $REPO_URL speculative_t5x
  $environment speculative_t5x/scripts/table2.sh"

echo "Reports: $RESULTS/<pair>/benchmark.md"
if [[ ${DELETE_VM:-0} == 1 ]]; then
  gcloud compute tpus tpu-vm delete "$TPU_NAME" --project="$PROJECT" --zone="$ZONE" --quiet
fi
