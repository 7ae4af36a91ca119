"""T5X integration: speculative decoding inside T5X's `infer.py`.

`SpeculativeEncoderDecoderModel` is a `t5x.models.EncoderDecoderModel` whose
`predict_batch_with_aux` runs `decoding.speculative_sample` with a draft
network (decoder prompts, T5X's `prompt_with_targets`, included), and
`SpeculativeDecoderOnlyModel` the same for `t5x.models.DecoderOnlyModel`
(prefix LMs: the prompt is prefilled, bidirectionally if the model says so),
so that a T5X inference command decodes speculatively by adding one gin file
(`configs/t5x/speculative_xxl_small.gin` and its siblings;
`configs/t5x/speculative_decoder_only.gin` for decoder-only pairs):

  python -m t5x.infer \
    --gin_search_paths=/path/to/speculative_t5x \
    --gin_file=t5x/examples/t5/t5_1_1/examples/base_wmt_infer.gin \
    --gin_file=configs/t5x/speculative_xxl_small.gin \
    --gin.CHECKPOINT_PATH=... --gin.DRAFT_CHECKPOINT_PATH=... ...

(`configs/t5x/speculative.gin` documents the whole command.)

Parameters. One tree holds both networks: the target's parameters at the top
level, in T5X's tree (a T5X checkpoint of the target restores unchanged), and
the draft's under `params['draft']`. `get_initial_variables` builds both trees
and both `params_axes`, so T5X's partitioner shards the draft by the same
logical axis rules, and the jitted inference step takes the draft's parameters
as traced arguments (not as constants folded into the program). A feature
head (`feature_head`, drafting from the target's own features) takes the
draft's place: the model's `draft_module` is its `FeatureHeadConfig`, its
parameters and logical axes live under `params['draft_head']`
(`HEAD_KEY`), and `graft_head_checkpoint` restores them
(configs/t5x/speculative_feature_head.gin). A parallel draft (PARD,
`parallel_draft.ParallelDraft`: one network call over mask tokens per
iteration) is a draft network wrapped in `ParallelDraftNetwork`, its
parameters {'network': ..., 'mask_embedding': [emb]} under `params['draft']`
(configs/t5x/speculative_parallel_draft.gin).

Restoring. T5X restores one checkpoint. `graft_draft_checkpoint(path)` makes a
`utils.RestoreCheckpointConfig.state_transformation_fns` entry that adds the
draft checkpoint's parameters to the restored state under `target/draft`;
T5X then casts and shards them with the rest (legacy and orbax T5X
checkpoints alike: both treat the grafted host arrays as values stored with
the checkpoint's structure).

Scoring and training of the speculative models see the target only:
`loss_fn`, `eval_fn` and `score_batch` all compute logits through
`_compute_logits`, which drops `params['draft']`. The draft-training models
of `t5x_models` (configs/t5x/distill*.gin) train the draft against the
target instead; `start_distillation` restores their two checkpoints.

t5x is optional. This module imports without it, and so do its functions over
arrays (`speculative_predict_batch`, `graft_draft_params`, ...), which the
model classes call and which tests and notebooks use directly. The classes
live in `t5x_models`, which imports t5x (gin files bind
`t5x_models.SpeculativeEncoderDecoderModel` and `...DecoderOnlyModel`) and
raises ImportError with installation instructions if t5x is missing.
"""

import dataclasses
import inspect
from typing import Any, Callable, Dict, Mapping, NamedTuple, Optional, Tuple, Union

from absl import logging
import flax
from flax.linen import partitioning as nn_partitioning
import gin
import jax
import jax.numpy as jnp
import numpy as np

from speculative_t5x import checkpoints
from speculative_t5x import decoding
from speculative_t5x import drafts
from speculative_t5x import feature_head
from speculative_t5x import models
from speculative_t5x import network
from speculative_t5x import parallel_draft
from speculative_t5x import settings as settings_lib

PyTree = Any
Array = jax.Array
# `(state_dict, target_state_dict, *, is_resuming=False) -> state_dict`, as
# `t5x.checkpoints.RestoreStateTransformationFn`.
RestoreStateTransformationFn = Callable[..., PyTree]

# Where the draft's parameters (and their logical axes) live in the tree: a
# draft network's, or a feature head's (`feature_head`, `drafts.FeatureDraft`).
DRAFT_KEY = 'draft'
HEAD_KEY = 'draft_head'
# A parallel draft's tree under DRAFT_KEY: `training.parallel_distill`'s checkpoint layout.
NETWORK_KEY = 'network'
MASK_KEY = 'mask_embedding'


@dataclasses.dataclass(frozen=True)
class ParallelDraftNetwork:
  """A draft network that drafts in parallel (`parallel_draft.ParallelDraft`): a model's `draft_module`.

  One network call per iteration over mask tokens proposes gamma tokens
  (PARD). Its parameters live under params['draft'] as {'network': the
  network's T5X tree, 'mask_embedding': float32 [emb]}, the layout of
  `training.parallel_distill`'s checkpoints, with logical axes (the mask's
  'embed'), so T5X's partitioner shards them by the target's rules
  (configs/t5x/speculative_parallel_draft.gin binds it).

  Attributes:
    module: the draft network, a `network.Transformer` or `network.DecoderOnly`.
  """

  module: Any

  @property
  def config(self) -> Any:
    return self.module.config


# ------------------------------------------------------------------------------
# Parameters: the target's tree with the draft's under 'draft'.
# ------------------------------------------------------------------------------
def split_draft_params(
  params: Mapping[str, Any], key: str = DRAFT_KEY
) -> Tuple[Dict[str, Any], PyTree]:
  """(target params without the draft, the draft's params under `key`) from one tree.

  `key`: `DRAFT_KEY` (a draft network) or `HEAD_KEY` (a feature head).
  """
  if key not in params:
    graft = 'graft_head_checkpoint' if key == HEAD_KEY else 'graft_draft_checkpoint'
    gin_file = 'speculative_feature_head.gin' if key == HEAD_KEY else 'speculative.gin'
    raise ValueError(
      f"The parameters have no '{key}' subtree (top-level keys: {sorted(params)}). "
      f'Restore the draft with the state transformation of {graft} '
      f'(configs/t5x/{gin_file} adds it), or initialize with '
      'SpeculativeEncoderDecoderModel.get_initial_variables.'
    )
  return strip_draft_params(params), params[key]


def strip_draft_params(params: Mapping[str, Any]) -> Dict[str, Any]:
  """The target's parameters: `params` without its 'draft' or 'draft_head' subtree, if any."""
  return {name: subtree for name, subtree in params.items() if name not in (DRAFT_KEY, HEAD_KEY)}


def draft_key(draft_module: Any) -> str:
  """Where `draft_module`'s parameters live: `HEAD_KEY` for a feature head's config, else `DRAFT_KEY`."""
  return HEAD_KEY if isinstance(draft_module, feature_head.FeatureHeadConfig) else DRAFT_KEY


def add_draft_variables(
  variables: Mapping[str, Any], draft_variables: Mapping[str, Any], key: str = DRAFT_KEY
) -> Dict[str, Any]:
  """The target's variables with the draft's `params` and `params_axes` under `key`.

  Args:
    variables: `module.init(...)` of the target: 'params' and 'params_axes'.
    draft_variables: the same of the draft (a network, or a feature head:
      `feature_head.init_variables`).
    key: `DRAFT_KEY` or `HEAD_KEY`.

  Returns:
    An unfrozen copy of `variables` whose 'params' and 'params_axes' each
    have a `key` entry, so that T5X's `InferenceState` and partitioner see
    one consistent tree (the draft's parameters sharded by their logical
    axes, with the target's rules).
  """
  variables = flax.core.unfreeze(variables)
  for collection in ('params', 'params_axes'):
    if collection not in draft_variables or collection not in variables:
      raise ValueError(
        f"Both networks need '{collection}' (params with logical axis annotations, as "
        f'network.Transformer makes them); the target has {sorted(variables)} and the draft '
        f'{sorted(draft_variables)}.'
      )
    if key in variables[collection]:
      raise ValueError(
        f"The target network's {collection} already has a '{key}' entry; "
        'it cannot also hold a draft.'
      )
    variables[collection][key] = flax.core.unfreeze(draft_variables[collection])
  return variables


def init_network_variables(
  module: Any, rng: Array, input_shapes: Mapping[str, Tuple[int, ...]]
) -> Dict[str, Any]:
  """`module.init` on ones of T5X's input shapes (a feature head's config: its variables).

  A `network.Transformer` takes `encoder_input_tokens` and
  `decoder_input_tokens`, a `network.DecoderOnly` the decoder's alone; a
  `feature_head.FeatureHeadConfig` needs no inputs; a `ParallelDraftNetwork`
  gets its network's variables under 'network' and the mask's beside them.
  """
  if isinstance(module, feature_head.FeatureHeadConfig):
    return flax.core.unfreeze(feature_head.init_variables(module, rng))
  if isinstance(module, ParallelDraftNetwork):  # The mask starts as `Model.as_parallel_draft`'s.
    variables = init_network_variables(module.module, rng, input_shapes)
    return {
      'params': {
        NETWORK_KEY: variables['params'],
        MASK_KEY: parallel_draft.mean_token_embedding(variables['params']),
      },
      'params_axes': {
        NETWORK_KEY: variables['params_axes'],
        f'{MASK_KEY}_axes': nn_partitioning.AxisMetadata(names=('embed',)),
      },
    }
  decoder_tokens = jnp.ones(input_shapes['decoder_input_tokens'], jnp.int32)
  if isinstance(module, network.DecoderOnly):
    tokens = (decoder_tokens, decoder_tokens)
  else:
    tokens = (jnp.ones(input_shapes['encoder_input_tokens'], jnp.int32),) + (decoder_tokens,) * 2
  return flax.core.unfreeze(module.init(rng, *tokens, enable_dropout=False))


# ------------------------------------------------------------------------------
# Restoring: graft a draft checkpoint into the restored state.
# ------------------------------------------------------------------------------
def _describe_network(shapes: Mapping[Tuple[str, ...], Optional[Tuple[int, ...]]]) -> str:
  """'emb_dim 512, mlp_dim 1024, ... (T5 1.1 'small')' from a tree's shapes.

  An encoder-decoder tree (T5 1.1) is described by its layers per stack, a
  decoder-only one (everything under 'decoder/') by `num_layers`; the size of
  `network.T5_1_1_SIZES` or `network.DECODER_ONLY_SIZES` they match, if one.
  """
  decoder_only = not any(path[0] == 'encoder' for path in shapes)
  stacks = ('decoder',) if decoder_only else ('encoder', 'decoder')
  layers = {
    stack: len({path[1] for path in shapes if path[0] == stack and path[1].startswith('layers_')})
    for stack in stacks
  }
  if decoder_only:
    fields = {'num_layers': layers['decoder']}
    embedding = shapes.get(('decoder', 'token_embedder', 'embedding'))
  else:
    fields = {'num_encoder_layers': layers['encoder'], 'num_decoder_layers': layers['decoder']}
    embedding = shapes.get(('token_embedder', 'embedding'))
  mlp = next(
    (
      shapes[path]
      for name in ('wi_0', 'wi')
      if (path := (stacks[0], 'layers_0', 'mlp', name, 'kernel')) in shapes
    ),
    None,
  )
  if embedding is not None:
    fields['emb_dim'] = embedding[1]
  if mlp is not None:
    fields['mlp_dim'] = mlp[1]
  family, sizes = (
    ('decoder-only', network.DECODER_ONLY_SIZES)
    if decoder_only
    else ('T5 1.1', network.T5_1_1_SIZES)
  )
  matching = [
    size
    for size, size_fields in sizes.items()
    if all(size_fields[name] == value for name, value in fields.items())
  ]
  description = ', '.join(f'{name} {value}' for name, value in sorted(fields.items()))
  return description + (f" ({family} '{matching[0]}')" if len(matching) == 1 else '')


def is_parallel_draft(params: Mapping[str, Any]) -> bool:
  """Whether a draft's parameter tree is a parallel draft's ({'network', 'mask_embedding'})."""
  return MASK_KEY in params


def check_draft_kind(found_tree: Mapping[str, Any], *, parallel: bool, decoder_only: bool) -> None:
  """Raises ValueError, naming the gin file to use, unless the draft's tree is of the model's kind.

  A chain draft's tree is a network's; a parallel draft's (`is_parallel_draft`)
  holds the network under 'network' and its mask vector.

  Args:
    found_tree: the draft's parameters (e.g. read from DRAFT_CHECKPOINT_PATH).
    parallel: whether the model's draft is a parallel draft (`ParallelDraftNetwork`).
    decoder_only: whether the pair is decoder-only (which gin files the advice names).
  """
  found_parallel = is_parallel_draft(found_tree)
  if found_parallel == parallel:
    return
  parallel_file = (
    f'configs/t5x/speculative{"_decoder_only" if decoder_only else ""}_parallel_draft.gin'
  )
  if found_parallel:
    raise ValueError(
      'The draft checkpoint (DRAFT_CHECKPOINT_PATH) holds a parallel draft (its network under '
      f"'{NETWORK_KEY}' and a '{MASK_KEY}': training.parallel_distill's or "
      "configs/t5x/distill_parallel_draft.gin's), but the model's draft is a chain draft network. "
      f"Decode with it through {parallel_file} (after T5X's files, in place of the pair file)."
    )
  chain_file = (
    'configs/t5x/speculative_decoder_only.gin'
    if decoder_only
    else 'a pair file such as configs/t5x/speculative_xxl_small.gin'
  )
  raise ValueError(
    'The draft checkpoint (DRAFT_CHECKPOINT_PATH) holds a chain draft network (no '
    f"'{MASK_KEY}'), but the model's draft is a parallel draft ({parallel_file}). Decode "
    f'with it through {chain_file}, or adapt it to mask tokens first: '
    't5x.train with configs/t5x/distill_parallel_draft.gin, or '
    'speculative_t5x.training.parallel_distill.'
  )


def check_checkpoint_matches(
  found_tree: Mapping[str, Any], expected_tree: Mapping[str, Any], *, role: str
) -> None:
  """Raises ValueError, naming the gin setting to change, unless the trees match.

  The advice follows the architecture of `expected_tree`: T5 1.1 sizes and
  `t5_1_1_config` for an encoder-decoder (configs/t5x/speculative.gin),
  decoder-only sizes and `decoder_only_config` for a decoder-only network
  (configs/t5x/speculative_decoder_only.gin). A draft of the other kind (a
  chain draft where a parallel one is configured, or the reverse) is named
  as such (`check_draft_kind`); a parallel draft's network is checked as a
  chain draft's.

  Args:
    found_tree: the parameters read from a checkpoint (arrays, tensorstore
      spec dicts or orbax metadata as leaves; leaves without a shape are
      compared by path only).
    expected_tree: the configured network's parameters (leaves with `.shape`).
    role: 'target' (TARGET_SIZE, CHECKPOINT_PATH) or 'draft' (DRAFT_SIZE,
      DRAFT_CHECKPOINT_PATH).
  """
  if role == 'draft' and (is_parallel_draft(found_tree) or is_parallel_draft(expected_tree)):
    parallel = is_parallel_draft(expected_tree)
    network_tree = expected_tree[NETWORK_KEY] if parallel else expected_tree
    check_draft_kind(found_tree, parallel=parallel, decoder_only='encoder' not in network_tree)
    check_checkpoint_matches(found_tree[NETWORK_KEY], expected_tree[NETWORK_KEY], role=role)
    differences = checkpoints.compare_shapes(found_tree, expected_tree)  # The mask, extra keys.
    if differences:
      raise ValueError(
        'The draft checkpoint (DRAFT_CHECKPOINT_PATH) does not match the configured parallel '
        f'draft: {differences.summary("the parallel draft")}.'
      )
    return
  differences = checkpoints.compare_shapes(found_tree, expected_tree)
  if not differences:
    return
  found, expected = checkpoints.flat_shapes(found_tree), checkpoints.flat_shapes(expected_tree)
  size_macro, path_macro = {
    'target': ('TARGET_SIZE', 'CHECKPOINT_PATH'),
    'draft': ('DRAFT_SIZE', 'DRAFT_CHECKPOINT_PATH'),
  }[role]
  decoder_only = 'encoder' not in expected_tree
  if decoder_only:
    embedding = ('decoder', 'token_embedder', 'embedding')
    config_fn, config_class, family, sizes = (
      'decoder_only_config',
      'DecoderOnlyConfig',
      'decoder-only',
      network.DECODER_ONLY_SIZES,
    )
  else:
    embedding = ('token_embedder', 'embedding')
    config_fn, config_class, family, sizes = (
      't5_1_1_config',
      'T5Config',
      'T5 1.1',
      network.T5_1_1_SIZES,
    )
  found_vocab, expected_vocab = (
    shape[0] if shape else None for shape in (found.get(embedding), expected.get(embedding))
  )
  if found_vocab is not None and expected_vocab is not None and found_vocab != expected_vocab:
    if role == 'draft':
      fix = (
        "Speculative decoding needs a draft trained on the target's vocabulary: use such a "
        'draft checkpoint.'
      )
    elif decoder_only:
      fix = (
        f"Set the vocabulary of both networks to the checkpoint's: --gin.VOCAB_SIZE={found_vocab} "
        '(the draft must share the vocabulary).'
      )
    else:
      fix = (
        "Set vocab_size of both networks to the checkpoint's: "
        f'--gin.target/speculative_network.t5_1_1_config.vocab_size={found_vocab} and the same '
        'for draft/ (the draft must share the vocabulary).'
      )
    raise ValueError(
      f'The {role} checkpoint ({path_macro}) has a vocabulary of {found_vocab} entries '
      f"({'/'.join(embedding)} {found[embedding]}) but the configured {role} network's has "
      f'{expected_vocab} ({differences.counts()}). {fix}'
    )
  example = 'gpt_like_draft' if decoder_only else 'small'
  raise ValueError(
    f'The {role} checkpoint ({path_macro}) does not match the configured {role} network: '
    f'{differences.summary(f"the {role} network")}. The checkpoint has '
    f'{_describe_network(found)}; the network is configured with '
    f"{_describe_network(expected)}. Set {size_macro} to the checkpoint's {family} size "
    f'(--gin.{size_macro}="\'{example}\'"; one of {", ".join(sizes)}), or give a custom size '
    f'field by field (--gin.{role}/speculative_network.{config_fn}.<field>=..., fields of '
    f'network.{config_class}).'
  )


def graft_draft_params(
  state_dict: Mapping[str, Any], draft_params: PyTree, target_state_dict: Mapping[str, Any]
) -> Dict[str, Any]:
  """`state_dict` with `draft_params` at `state_dict['target']['draft']`.

  For either speculative T5X model (`SpeculativeEncoderDecoderModel` or
  `SpeculativeDecoderOnlyModel`): the model being restored holds a draft.

  Args:
    state_dict: a T5X optimizer state dict read from a checkpoint
      (`{'target': params, 'state': ...}`; leaves are arrays, tensorstore
      specs or orbax metadata, left as they are).
    draft_params: the draft's parameter tree of host arrays.
    target_state_dict: the state of the model being restored (leaves with
      `.shape`); its `target/draft` subtree fixes the tree and shapes that
      `draft_params` must have.

  Returns:
    A new state dict; `state_dict` is not modified.
  """
  expected = target_state_dict.get('target', {}).get(DRAFT_KEY)
  if expected is None:
    raise ValueError(
      f"The model being restored has no '{DRAFT_KEY}' parameters: grafting a draft checkpoint "
      'needs MODEL = @t5x_models.SpeculativeEncoderDecoderModel() (configs/t5x/speculative.gin) '
      'or MODEL = @t5x_models.SpeculativeDecoderOnlyModel() '
      '(configs/t5x/speculative_decoder_only.gin). If a pair file is given, a gin file after it '
      "(one including T5X's base.gin) rebinds MODEL: give the pair file last."
    )
  check_checkpoint_matches(draft_params, expected, role='draft')
  return {**state_dict, 'target': {**state_dict['target'], DRAFT_KEY: draft_params}}


def graft_draft_checkpoint(
  draft_checkpoint_path: str, dtype: Optional[str] = None
) -> RestoreStateTransformationFn:
  """A `RestoreCheckpointConfig.state_transformation_fns` entry adding a draft.

  In gin (configs/t5x/speculative.gin does this):

    utils.RestoreCheckpointConfig.state_transformation_fns = [
        @t5x_adapter.graft_draft_checkpoint()]
    t5x_adapter.graft_draft_checkpoint.draft_checkpoint_path = %DRAFT_CHECKPOINT_PATH

  The returned function reads the draft checkpoint each time T5X restores a
  target checkpoint (`checkpoints.load_params`: a T5X checkpoint, legacy or
  orbax, a model directory meaning its latest step; also this project's
  orbax checkpoints and Hugging Face directories) and grafts its parameters
  under `target/draft` (`graft_draft_params`); from a checkpoint that holds
  a draft under `draft` itself (one written by T5X's train.py with
  configs/t5x/distill.gin), that draft (`read_draft_checkpoint`). A parallel
  draft (`ParallelDraftNetwork`, configs/t5x/speculative_parallel_draft.gin)
  is read the same way, from `training.parallel_distill`'s model directory
  or a T5X checkpoint holding one; a draft of the other kind than the
  model's is refused, naming the gin file for it (`check_draft_kind`). Both checkpoints are first
  checked against the configured networks, so that a size mismatch names
  TARGET_SIZE or DRAFT_SIZE (`check_checkpoint_matches`) rather than
  surfacing as T5X's key-mismatch error. When T5X resumes from a
  checkpoint that already holds a draft (`is_resuming=True`), that draft is
  kept.

  Args:
    draft_checkpoint_path: where the draft's checkpoint is (local or gs://).
    dtype: cast the draft's parameters on reading (e.g. 'bfloat16'); None
      keeps the stored dtypes. T5X casts all restored parameters to
      `RestoreCheckpointConfig.dtype` afterwards in any case.

  Returns:
    `graft(state_dict, target_state_dict, *, is_resuming=False) -> state_dict`.
  """
  if not draft_checkpoint_path or not isinstance(draft_checkpoint_path, str):
    raise ValueError(
      'graft_draft_checkpoint needs the draft checkpoint path; set '
      f'DRAFT_CHECKPOINT_PATH (got {draft_checkpoint_path!r}).'
    )

  def graft(state_dict, target_state_dict, *, is_resuming=False):
    if is_resuming and DRAFT_KEY in state_dict.get('target', {}):
      return state_dict
    check_checkpoint_matches(
      strip_draft_params(state_dict['target']),
      strip_draft_params(target_state_dict.get('target', {})),
      role='target',
    )
    draft_params = read_draft_checkpoint(draft_checkpoint_path, dtype)
    return graft_draft_params(state_dict, draft_params, target_state_dict)

  return graft


def read_draft_checkpoint(draft_checkpoint_path: str, dtype: Optional[str] = None) -> PyTree:
  """The draft's parameters (host arrays) from its checkpoint (`checkpoints.load_params`).

  From a checkpoint that holds both networks (a speculative or draft-training
  model's, written by T5X), its draft under 'draft'.
  """
  logging.info(
    'Grafting the draft checkpoint %s under target/%s.', draft_checkpoint_path, DRAFT_KEY
  )
  draft_params = checkpoints.load_params(draft_checkpoint_path, dtype=dtype)
  return draft_params.get(DRAFT_KEY, draft_params)


def start_parallel_draft(draft_params: PyTree, expected_tree: Mapping[str, Any]) -> PyTree:
  """A chain draft's parameters made the parallel draft `expected_tree` is; others as they are.

  The network is checked against the configured draft network, and the mask
  starts at the mean of its token embeddings, as `Model.as_parallel_draft`
  starts it: where draft training (configs/t5x/distill_parallel_draft.gin)
  adapts a chain draft to mask tokens.

  Args:
    draft_params: a draft's parameters of host arrays (a chain or parallel draft's).
    expected_tree: the configured draft's parameters (leaves with `.shape`).
  """
  if not is_parallel_draft(expected_tree) or is_parallel_draft(draft_params):
    return draft_params
  check_checkpoint_matches(draft_params, expected_tree[NETWORK_KEY], role='draft')
  mask = np.asarray(parallel_draft.mean_token_embedding(draft_params))
  return {NETWORK_KEY: draft_params, MASK_KEY: mask}


def graft_head_checkpoint(
  head_checkpoint_path: str, dtype: Optional[str] = None
) -> RestoreStateTransformationFn:
  """A `RestoreCheckpointConfig.state_transformation_fns` entry adding a feature head.

  As `graft_draft_checkpoint`, for a model whose draft is a feature head
  (configs/t5x/speculative_feature_head.gin): the head's checkpoint
  (`training.train_feature_head`'s model directory, or a T5X checkpoint
  holding it under 'draft_head') is grafted under `target/draft_head`,
  checked against the configured head's shapes (HEAD_* settings) and the
  target's checkpoint against TARGET_SIZE.

  Args:
    head_checkpoint_path: where the head's checkpoint is.
    dtype: cast the head's parameters on reading; None keeps them.

  Returns:
    `graft(state_dict, target_state_dict, *, is_resuming=False) -> state_dict`.
  """
  if not head_checkpoint_path or not isinstance(head_checkpoint_path, str):
    raise ValueError(
      'graft_head_checkpoint needs the feature head checkpoint path; set '
      f'HEAD_CHECKPOINT_PATH (got {head_checkpoint_path!r}).'
    )

  def graft(state_dict, target_state_dict, *, is_resuming=False):
    if is_resuming and HEAD_KEY in state_dict.get('target', {}):
      return state_dict
    expected = target_state_dict.get('target', {}).get(HEAD_KEY)
    if expected is None:
      raise ValueError(
        f"The model being restored has no '{HEAD_KEY}' parameters: a feature head needs "
        't5x_models.SpeculativeEncoderDecoderModel.draft_module = @feature_head.config_for() '
        '(configs/t5x/speculative_feature_head.gin); give that file last.'
      )
    check_checkpoint_matches(
      strip_draft_params(state_dict['target']),
      strip_draft_params(target_state_dict['target']),
      role='target',
    )
    logging.info('Grafting the feature head %s under target/%s.', head_checkpoint_path, HEAD_KEY)
    head_params = checkpoints.load_params(head_checkpoint_path, dtype=dtype)
    head_params = head_params.get(HEAD_KEY, head_params)
    differences = checkpoints.compare_shapes(head_params, expected)
    if differences:
      raise ValueError(
        f'The feature head checkpoint (HEAD_CHECKPOINT_PATH) does not match the configured '
        f'head: {differences.summary("the head")}. Set the head fields to those it was '
        'trained with (HEAD_EMB_DIM, HEAD_NUM_LAYERS, HEAD_OUTPUT, HEAD_FEATURE_LAYERS, ...; '
        'feature_head.FeatureHeadConfig).'
      )
    return {**state_dict, 'target': {**state_dict['target'], HEAD_KEY: head_params}}

  return graft


def start_distillation(
  draft_checkpoint_path: Optional[str] = None, dtype: Optional[str] = None
) -> RestoreStateTransformationFn:
  """The `RestoreCheckpointConfig.state_transformation_fns` entry of draft training.

  T5X's `train.py` with a draft-training model
  (`t5x_models.DraftDistillationEncoderDecoderModel`, configs/t5x/distill.gin)
  restores the target's T5X checkpoint (`RestoreCheckpointConfig.path`)
  unchanged. This function, applied to what T5X read:
    * checks the target's parameters against the configured target network
      (a checkpoint of another size stops with an error naming TARGET_SIZE);
    * drops the checkpoint's optimizer state and step: they belong to the
      target's own training, and draft training starts at step 0 with a
      fresh optimizer state for the draft alone;
    * grafts the draft's checkpoint under `target/draft` if
      `draft_checkpoint_path` is given (`graft_draft_checkpoint`: checked
      against the configured draft network, whose vocabulary must be the
      target's; for a feature head, `graft_head_checkpoint` under
      `target/draft_head`; for a parallel draft, configs/t5x/distill_parallel_draft.gin,
      a parallel draft's checkpoint continues, a chain draft's starts it with
      the mask at its mean token embedding, `start_parallel_draft`); without
      one, a draft already in the checkpoint (one written by a draft-training
      run, checked) is kept, and otherwise the draft starts from scratch.
  What the transformed state lacks (the step, the draft's optimizer state, a
  draft from scratch) T5X fills in from a fresh initialization:
  `RestoreCheckpointConfig.fallback_to_scratch = True`, which the
  distillation gin files set. A resumed run (T5X restoring `model_dir`'s
  latest checkpoint, `is_resuming=True`) continues from that combined
  checkpoint as saved: parameters, the draft's optimizer state and the step.

  Args:
    draft_checkpoint_path: the draft's checkpoint (anything
      `checkpoints.load_params` reads), or None.
    dtype: cast the draft's parameters on reading; None keeps them.

  Returns:
    `transform(state_dict, target_state_dict, *, is_resuming=False) -> state_dict`.
  """
  if draft_checkpoint_path is not None and not isinstance(draft_checkpoint_path, str):
    raise ValueError(
      f'draft_checkpoint_path must be a path or None, got {draft_checkpoint_path!r}.'
    )

  def transform(state_dict, target_state_dict, *, is_resuming=False):
    if is_resuming:
      return state_dict
    keys = [key for key in (DRAFT_KEY, HEAD_KEY) if key in target_state_dict.get('target', {})]
    if not keys:
      raise ValueError(
        f"The model being trained has no '{DRAFT_KEY}' parameters: draft training needs "
        'MODEL = @t5x_models.DraftDistillationEncoderDecoderModel() (configs/t5x/distill.gin) '
        'or @t5x_models.DraftDistillationDecoderOnlyModel() '
        '(configs/t5x/distill_decoder_only.gin); a gin file given after it (one including '
        "T5X's base.gin) rebinds MODEL: give the distillation file last."
      )
    check_checkpoint_matches(
      strip_draft_params(state_dict['target']),
      strip_draft_params(target_state_dict['target']),
      role='target',
    )
    params_only = {'target': state_dict['target']}
    key = keys[0]
    if draft_checkpoint_path is None:
      in_checkpoint = state_dict['target'].get(key)
      if in_checkpoint is not None and key == DRAFT_KEY:
        expected = target_state_dict['target'][DRAFT_KEY]
        if is_parallel_draft(expected) and not is_parallel_draft(in_checkpoint):
          raise ValueError(
            'The initial checkpoint (INITIAL_CHECKPOINT_PATH) holds a chain draft under '
            "params['draft'], but a parallel draft is trained: set DRAFT_CHECKPOINT_PATH to "
            'that checkpoint too, and the parallel draft starts from its draft (the mask '
            'embedding from the mean of its token embeddings).'
          )
        check_checkpoint_matches(in_checkpoint, expected, role='draft')
      logging.info(
        'Draft training: the target from its checkpoint, the draft %s.',
        'from that checkpoint' if in_checkpoint is not None else 'from scratch',
      )
      return params_only
    # A feature head (configs/t5x/distill_feature_head.gin) or a draft network.
    if key == HEAD_KEY:
      return graft_head_checkpoint(draft_checkpoint_path, dtype)(params_only, target_state_dict)
    draft_params = start_parallel_draft(
      read_draft_checkpoint(draft_checkpoint_path, dtype), target_state_dict['target'][DRAFT_KEY]
    )
    return graft_draft_params(params_only, draft_params, target_state_dict)

  return transform


# ------------------------------------------------------------------------------
# Prediction: both encoders, both caches, the block scorer, speculative_sample.
# ------------------------------------------------------------------------------
def check_networks(
  module: Any, draft_module: Any, network_class: type = network.Transformer
) -> None:
  """Raises ValueError unless both are `network_class` modules with one vocabulary.

  `network_class`: `network.Transformer` (T5X's T5 1.1 encoder-decoder) or
  `network.DecoderOnly` (T5X's decoder-only network). `draft_module` may
  instead be a `feature_head.FeatureHeadConfig`, a feature head built for
  this target (`feature_head.check_target`), or a `ParallelDraftNetwork`
  of such a network.
  """
  if isinstance(draft_module, feature_head.FeatureHeadConfig):
    check_networks(module, module, network_class)
    feature_head.check_target(draft_module, module.config)
    return
  if isinstance(draft_module, ParallelDraftNetwork):
    draft_module = draft_module.module
  for name, value in (('module', module), ('draft_module', draft_module)):
    if not isinstance(value, network_class):
      raise ValueError(
        f"{name} must be a speculative_t5x.network.{network_class.__name__} (T5X's parameter "
        'tree plus the block-cached decoding that speculative decoding needs); got '
        f'{type(value).__module__}.{type(value).__qualname__}. In gin: '
        f'{name} = @speculative_network.{network_class.__name__}().'
      )
  drafts.check_shared_vocabulary(draft_module.config.vocab_size, module.config.vocab_size)


def speculative_predict_batch(
  module: network.Transformer,
  draft_module: network.Transformer,
  params: Mapping[str, Any],
  batch: Mapping[str, Array],
  *,
  eos_id: int,
  settings: settings_lib.SpeculativeSettings,
  decode_fn: Callable[..., Tuple[Array, Array, decoding.SpeculativeStats]] = (
    decoding.speculative_sample
  ),
  rng: Optional[Array] = None,
  decoder_params: Optional[Mapping[str, Any]] = None,
  num_decodes: int = 1,
  return_all_decodes: bool = False,
  decoder_prompt: Optional[Array] = None,
  inputs_bidirectional_attention: bool = False,
) -> Tuple[Array, Dict[str, Array]]:
  """Decodes a T5X batch speculatively: the computation of `predict_batch_with_aux`.

  Runs `models.speculative_decode` with the draft that `make_draft` splits
  off `params` (the baseline's `_baseline_predict` if gamma='auto' chose it).

  Args:
    module: the target network (`network.Transformer` or `network.DecoderOnly`).
    draft_module: the draft network (same kind, same vocabulary), or a
      `feature_head.FeatureHeadConfig` built for the target (a feature head).
    params: the target's parameters with the draft's under 'draft' (a
      feature head's under 'draft_head').
    batch: T5X's features: `decoder_input_tokens` int32 [B, L] (its width L
      is the output length; its values are read only as `decoder_prompt`),
      and for an encoder-decoder `encoder_input_tokens` int32 [B, Lin].
    eos_id: end-of-sequence id.
    settings: the speculative settings (gamma, lenience, verification,
      draft_threshold); `decoder_params` may override single fields.
    decode_fn: a speculative decode function with the signature of
      `decoding.speculative_sample` (sampling settings bound in gin).
    rng: PRNG key for sampling, passed as `decode_rng`.
    decoder_params: more keyword arguments of `decode_fn`, as T5X's
      predict_batch passes them (e.g. `temperature`, `max_decode_steps`,
      `max_decode_steps_hard_limit`, `rescale_log_probs`,
      `logit_callback_fn`); the fields of `settings` here ('gamma',
      'lenience', ...) override its own.
    num_decodes: samples per input.
    return_all_decodes: return every sample, not only the most likely one.
    decoder_prompt: optional int32 [B, L] decoder prompts in T5X's layout
      (shifted right: BOS slot, prompt tokens, zeros), which a decoder-only
      target needs (T5X's `decoder_input_tokens * decoder_causal_attention`).
    inputs_bidirectional_attention: a decoder-only prefix LM: the prompt is
      prefilled with bidirectional attention in both networks.

  Returns:
    `(decodes, aux)`. decodes: int32 [B, L] (the prompts included, in their
    slots), or [B, num_decodes, L] with `return_all_decodes` (ascending log
    probability). aux: arrays whose leading axis is the batch, as T5X's
    `predict_with_aux` output needs (`prediction_aux` says what each is).
  """
  check_networks(
    module,
    draft_module,
    network.DecoderOnly if isinstance(module, network.DecoderOnly) else network.Transformer,
  )
  batch_size, length = batch['decoder_input_tokens'].shape
  settings, sampling, decoder_params = _batch_settings(
    settings, decoder_params, decode_fn, batch_size, rng, eos_id
  )
  target_params, draft = make_draft(module, draft_module, params, inputs_bidirectional_attention)
  input_tokens = _input_tokens(module, batch, decoder_prompt)
  inputs = (module.config, target_params, input_tokens, length)
  common = dict(
    decoder_prompt=decoder_prompt,
    inputs_bidirectional_attention=inputs_bidirectional_attention,
    num_decodes=num_decodes,
    return_all_decodes=return_all_decodes,
  )
  if settings is None:  # gamma='auto' chose no speculation for this batch size.
    return _baseline_predict(*inputs, sampling=sampling, **common, **decoder_params)
  return _speculative_predict(
    *inputs, draft=draft, settings=settings, decode_fn=decode_fn, **common, **decoder_params
  )


def _speculative_predict(
  config, params, input_tokens, length, *, draft, settings, decode_fn, return_all_decodes, **args
):
  """`speculative_predict_batch`'s results from `models.speculative_decode`."""
  decodes, scores, stats = models.speculative_decode(
    config,
    params,
    draft,
    input_tokens,
    length,
    decode_fn=decode_fn,
    best_only=not return_all_decodes,
    **args,
    **settings.decode_kwargs(),
  )
  return decodes, prediction_aux(scores, stats, settings.gamma)


def _input_tokens(module: Any, batch: Mapping[str, Array], decoder_prompt: Optional[Array]):
  """int32 [B, Lin]: the encoder inputs, or a decoder-only target's prompts (its draft's
  `init_cache` takes only their batch); ValueError if a decoder-only target has none."""
  if not network.is_decoder_only(module.config):
    return batch['encoder_input_tokens']
  if decoder_prompt is None:
    raise ValueError('A decoder-only target needs decoder_prompt (its prompts, T5X layout).')
  return decoder_prompt


def _batch_settings(
  settings: settings_lib.SpeculativeSettings,
  decoder_params: Optional[Mapping[str, Any]],
  decode_fn: Callable[..., Any],
  batch_size: int,
  rng: Optional[Array],
  eos_id: int,
) -> Tuple[Optional[settings_lib.SpeculativeSettings], Dict[str, Any], Dict[str, Any]]:
  """(settings, sampling, decode_fn's other keywords) of one `speculative_predict_batch`.

  `decoder_params`' speculative fields override `settings`', which then
  resolve for the batch size (None: gamma='auto' chose the baseline);
  sampling is `decode_fn_sampling`'s; the remaining keywords get `rng` as
  `decode_rng` and `eos_id` unless they set it.
  """
  decoder_params = dict(decoder_params or {})
  # Before gamma='auto' may choose the baseline for this batch size, so that a
  # state callback fails alike at every batch size.
  decoding.check_no_state_callback(decoder_params.get('state_callback_fn'))
  settings = settings.overridden(decoder_params)  # Validated again, if overridden.
  sampling = decode_fn_sampling(decode_fn, decoder_params)
  settings = settings.for_batch(batch_size, **sampling)
  for name in settings_lib.SpeculativeSettings.field_names():
    decoder_params.pop(name, None)
  if rng is not None:
    if decoder_params.get('decode_rng') is not None:
      raise ValueError(
        "Pass the sampling key either as `rng` or as decoder_params['decode_rng'], not both."
      )
    decoder_params['decode_rng'] = rng
  decoder_params.setdefault('eos_id', eos_id)
  return settings, sampling, decoder_params


class _BaselineStats(NamedTuple):
  """The statistics a baseline decode has, as the `decoding.SpeculativeStats` fields
  `prediction_aux` reads: one target call per token, no draft tokens."""

  iterations: Array
  accepted: Array
  emitted: Array
  drafted: Array
  target_calls: Array
  mean_beta: float = 0.0


def prediction_aux(
  scores: Array, stats: Union[decoding.SpeculativeStats, _BaselineStats], gamma: int
) -> Dict[str, Array]:
  """`speculative_predict_batch`'s aux: arrays whose leading axis is the batch B.

  Per decode, [B] (or [B, num_decodes] with all decodes):
    scores: float32 log probability under the target's standardized
      distribution (0 for greedy decoding), or with `rescale_log_probs=False`
      under its logits alone (T5X's);
    iterations, accepted, emitted, drafted: int32 loop iterations in which
      the row was active, draft tokens accepted, tokens written, draft tokens
      proposed;
  and per batch, repeated for each input [B]:
    batch_target_calls: int32 target block calls (loop iterations);
    batch_mean_beta: float32 mean acceptance probability beta over the
      batch's judged draft positions (alpha measured on the fly);
    batch_gamma: int32 the gamma the batch ran with (gamma='auto' chooses it
      by batch size from its profile; 0: the baseline, whose statistics are
      one target call per token and no draft tokens).
  scores float32 [B] or [B, num_decodes] and `stats` (per-row fields shaped
  as scores) are the decode's; gamma is the batch's.
  """
  batch_size = scores.shape[0]
  return {
    'scores': scores,
    'iterations': stats.iterations,
    'accepted': stats.accepted,
    'emitted': stats.emitted,
    'drafted': stats.drafted,
    'batch_target_calls': jnp.full((batch_size,), stats.target_calls),
    'batch_mean_beta': jnp.full((batch_size,), stats.mean_beta, jnp.float32),
    'batch_gamma': jnp.full((batch_size,), gamma, jnp.int32),
  }


def make_draft(
  module: Any, draft_module: Any, params: Mapping[str, Any], inputs_bidirectional_attention: bool
) -> Tuple[Dict[str, Any], drafts.Draft]:
  """(the target's parameters, the draft) from a speculative model's parameter tree.

  A draft network (`drafts.ModelDraft` of `params['draft']`); for a
  `ParallelDraftNetwork`, the `parallel_draft.ParallelDraft` of
  `params['draft']`'s network and mask; for a
  `feature_head.FeatureHeadConfig`, the feature head of
  `params['draft_head']` reading the target (`drafts.FeatureDraft`).
  """
  target_params, draft_params = split_draft_params(params, draft_key(draft_module))
  if isinstance(draft_module, feature_head.FeatureHeadConfig):
    return target_params, drafts.FeatureDraft(
      draft_params, target_params, draft_module, module.config
    )
  parallel = isinstance(draft_module, ParallelDraftNetwork)
  check_draft_kind(
    draft_params, parallel=parallel, decoder_only=network.is_decoder_only(module.config)
  )
  if parallel:
    return target_params, parallel_draft.ParallelDraft.of(
      draft_module.config,
      draft_params[NETWORK_KEY],
      draft_params[MASK_KEY],
      inputs_bidirectional_attention=inputs_bidirectional_attention,
    )
  draft = drafts.ModelDraft(
    params=draft_params,
    config=draft_module.config,
    inputs_bidirectional_attention=inputs_bidirectional_attention,
  )
  return target_params, draft


def decode_fn_sampling(decode_fn: Callable[..., Any], decoder_params: Mapping[str, Any]):
  """{temperature, topk, topp} that `decode_fn` will sample with.

  `decoding.speculative_sample`'s defaults (T5X's convention: topk=1,
  greedy), then those of `decode_fn`'s own signature, then what gin binds on
  it (T5X binds sampling settings on the decode function), then
  `decoder_params`. gamma='auto' checks them against its profile's mode.
  """
  names = ('temperature', 'topk', 'topp')
  sampling = {}
  for fn in (decoding.speculative_sample, decode_fn):
    defaults = inspect.signature(fn).parameters
    sampling.update({name: defaults[name].default for name in names if name in defaults})
  try:
    bound = gin.get_bindings(decode_fn)
  except (ValueError, TypeError, KeyError):  # Not a gin configurable.
    bound = {}
  sampling.update({name: bound[name] for name in names if name in bound})
  sampling.update({name: decoder_params[name] for name in names if name in decoder_params})
  return sampling


def _baseline_predict(
  config,
  params,
  input_tokens,
  length,
  *,
  sampling,
  return_all_decodes,
  eos_id,
  num_decodes,
  decoder_prompt=None,
  **decode_args,
):
  """`speculative_predict_batch`'s results from a baseline decode (gamma='auto' chose 0)."""
  for name in ('temperature', 'topk', 'topp'):
    decode_args.pop(name, None)
  decodes, scores = models.baseline_decode(
    config,
    params,
    input_tokens,
    length,
    eos_id=eos_id,
    num_decodes=num_decodes,
    decoder_prompt=decoder_prompt,
    **sampling,
    **decode_args,
  )
  if not return_all_decodes:
    decodes, scores = decodes[:, -1], scores[:, -1]
  # One target call per token, no draft: the statistics a baseline has. A
  # decode is its prompt, its tokens and EOS, then zeros.
  emitted = jnp.sum(decodes != 0, axis=-1)
  if decoder_prompt is not None:
    prompt_lengths = decoding.prompt_lengths(decoder_prompt)
    emitted -= prompt_lengths.reshape(prompt_lengths.shape + (1,) * (emitted.ndim - 1))
  zeros = jnp.zeros_like(emitted)
  stats = _BaselineStats(
    iterations=emitted,
    accepted=zeros,
    emitted=emitted,
    drafted=zeros,
    target_calls=jnp.max(emitted, initial=0),
  )
  return decodes, prediction_aux(scores, stats, gamma=0)
