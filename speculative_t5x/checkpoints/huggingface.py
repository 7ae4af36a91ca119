"""Hugging Face T5 checkpoints: import and export for `network.Transformer`.

A transformers `T5ForConditionalGeneration` directory (`config.json` plus
`model.safetensors`, or the shards `model.safetensors.index.json` lists)
records its architecture. `t5_config(model_dir)` returns it as a
`network.T5Config`, `load_t5(model_dir)` reads it into T5X's parameter tree
(`token_embedder/embedding`, `encoder/layers_0/attention/query/kernel`, ...)
of float32 host numpy arrays, and `save_t5(config, params, output_dir)` writes
one that transformers loads. Encoder-decoders only: decoder-only parameters
load from T5X or orbax checkpoints.

`checkpoints.load_params` and `checkpoints.checkpoint_format` recognize these
directories too (by `CONFIG_FILE`) and read them through `load_t5`. Errors
follow `checkpoints`' conventions: FileNotFoundError for a missing file,
`common.CorruptCheckpointError` for one that does not parse, ValueError
for an unsupported variant or mismatched tensors. The safetensors package
(`pip install "speculative_t5x[hf]"`) is imported on first use.
"""

import contextlib
import dataclasses
import json
import os
from typing import Any, Callable, Dict, Iterator, Optional, Set, Tuple

from flax import traverse_util

# Importing ml_dtypes registers numpy's 'bfloat16', which safetensors needs to
# read BF16 tensors through its numpy API.
import ml_dtypes  # noqa: F401  pylint: disable=unused-import
import numpy as np

from speculative_t5x.checkpoints import common
from speculative_t5x import network

Params = Dict[str, Any]


def require_t5_config(config: network.NetworkConfig, subject: str) -> None:
  """Raises ValueError unless `config` is a T5Config: the importer is T5-only."""
  if network.is_decoder_only(config):
    raise ValueError(
      f'{subject} handles T5 encoder-decoders (transformers '
      f'T5ForConditionalGeneration) only, not a {type(config).__name__}. '
      'Decoder-only parameters load from T5X or orbax checkpoints.'
    )


CONFIG_FILE = 'config.json'
WEIGHTS_FILE = 'model.safetensors'
WEIGHTS_INDEX_FILE = 'model.safetensors.index.json'

# Hugging Face `feed_forward_proj` <-> T5X `mlp_activations`. HF's gated-gelu
# uses the tanh approximation ("gelu_new"), which is flax's `nn.gelu` default.
_FEED_FORWARD = {'gated-gelu': ('gelu', 'linear'), 'relu': ('relu',)}
# Checkpoint entries that duplicate `shared.weight` (tied by transformers).
_TIED_COPIES = ('encoder.embed_tokens.weight', 'decoder.embed_tokens.weight')


def _tensor_names(config: network.T5Config) -> Iterator[Tuple[Tuple[str, ...], str, bool]]:
  """(T5X parameter path, HF tensor name, transposed) for all but the logits.

  torch's Linear stores [out, in], T5X kernels [in, out]; HF's relative
  attention tables are [buckets, heads], T5X's [heads, buckets]. Both order
  attention features head-major, so kernels only need a transpose.
  """
  yield ('token_embedder', 'embedding'), 'shared.weight', False
  num_wi = len(config.mlp_activations)
  wi = ('wi',) if num_wi == 1 else tuple(f'wi_{i}' for i in range(num_wi))
  mlp = tuple((name, name) for name in wi + ('wo',))  # Same names in both.
  attention = (('query', 'q'), ('key', 'k'), ('value', 'v'), ('out', 'o'))
  stacks = (
    (
      'encoder',
      config.num_encoder_layers,
      (
        ('pre_attention_layer_norm', 'attention', 'SelfAttention'),
        ('pre_mlp_layer_norm', 'mlp', 'DenseReluDense'),
      ),
    ),
    (
      'decoder',
      config.num_decoder_layers,
      (
        ('pre_self_attention_layer_norm', 'self_attention', 'SelfAttention'),
        ('pre_cross_attention_layer_norm', 'encoder_decoder_attention', 'EncDecAttention'),
        ('pre_mlp_layer_norm', 'mlp', 'DenseReluDense'),
      ),
    ),
  )
  for stack, num_layers, sublayers in stacks:
    yield (
      (stack, 'relpos_bias', 'rel_embedding'),
      f'{stack}.block.0.layer.0.SelfAttention.relative_attention_bias.weight',
      True,
    )
    for i in range(num_layers):
      for j, (norm, block, hf_block) in enumerate(sublayers):
        prefix = f'{stack}.block.{i}.layer.{j}'
        yield (stack, f'layers_{i}', norm, 'scale'), f'{prefix}.layer_norm.weight', False
        for ours, theirs in mlp if block == 'mlp' else attention:
          yield (
            (stack, f'layers_{i}', block, ours, 'kernel'),
            f'{prefix}.{hf_block}.{theirs}.weight',
            True,
          )
    yield ((stack, f'{stack}_norm', 'scale'), f'{stack}.final_layer_norm.weight', False)


def _safetensors():
  try:
    import safetensors.numpy  # pylint: disable=g-import-not-at-top
  except ImportError as error:
    raise ImportError(
      'Hugging Face checkpoints need the safetensors package: '
      'pip install "speculative_t5x[hf]" (or safetensors).'
    ) from error
  return safetensors


def _read_json(path: str, what: str) -> Dict[str, Any]:
  """The JSON object in `path`, which should hold `what` (for the messages)."""
  if not os.path.isfile(path):
    raise FileNotFoundError(f'No {os.path.basename(path)} at {path}: expected {what}.')
  with open(path, 'rb') as f, common.parsing(path, f'{what} (JSON)', common.JSON_ERRORS):
    contents = json.loads(f.read())
  if not isinstance(contents, dict):
    raise common.CorruptCheckpointError(
      path, f'{what} (a JSON object)', f'it holds a JSON {type(contents).__name__}'
    )
  return contents


def _safe_open(path: str):
  """safetensors' `safe_open(path)`, its errors for a damaged file naming it."""
  safetensors = _safetensors()
  with common.parsing(path, 'safetensors weights', (safetensors.SafetensorError,)):
    return safetensors.safe_open(path, framework='np')


def _tensor_files(model_dir: str) -> Dict[str, str]:
  """Maps each tensor name to the safetensors file that holds it."""
  single = os.path.join(model_dir, WEIGHTS_FILE)
  index = os.path.join(model_dir, WEIGHTS_INDEX_FILE)
  if os.path.isfile(single):
    with _safe_open(single) as f:
      return {name: single for name in f.keys()}
  if os.path.isfile(index):
    weight_map = _read_json(index, 'a sharded safetensors index')['weight_map']
    files = {name: os.path.join(model_dir, file) for name, file in weight_map.items()}
    for path in set(files.values()):
      if not os.path.isfile(path):
        raise FileNotFoundError(f'{index} lists {path}, which does not exist.')
    return files
  found = sorted(os.listdir(model_dir))
  hint = (
    ' Only safetensors weights are read; convert PyTorch .bin weights by loading '
    'the model with transformers and calling save_pretrained().'
    if any(name.endswith('.bin') for name in found)
    else ''
  )
  raise FileNotFoundError(
    f'No {WEIGHTS_FILE} or {WEIGHTS_INDEX_FILE} in {model_dir} (found {found}).{hint}'
  )


def _t5_config_from_json(hf: Dict[str, Any], logits_via_embedding: bool) -> network.T5Config:
  """Checks that a transformers config.json describes a model this network computes."""
  if hf.get('model_type') not in ('t5', 'mt5') or not hf.get('is_encoder_decoder', True):
    raise ValueError(
      f'Expected a T5 encoder-decoder (model_type "t5" or "mt5"), got '
      f'model_type={hf.get("model_type")!r}; UMT5, LongT5 and decoder-only '
      'models have other architectures.'
    )
  feed_forward = hf.get('feed_forward_proj', 'relu')
  if feed_forward not in _FEED_FORWARD:
    raise ValueError(
      f'Unsupported feed_forward_proj {feed_forward!r}: supported are '
      f'{sorted(_FEED_FORWARD)} (T5 1.1 / Flan-T5 / mT5, and T5 1.0).'
    )
  fixed = {
    'relative_attention_num_buckets': network.NUM_BUCKETS,
    'relative_attention_max_distance': network.MAX_DISTANCE,
    'layer_norm_epsilon': 1e-6,
  }
  for key, value in fixed.items():
    if hf.get(key, value) != value:
      raise ValueError(f'Unsupported {key}={hf[key]}: this network (like T5X) uses {value}.')
  missing = [
    key
    for key in ('vocab_size', 'd_model', 'num_heads', 'd_kv', 'd_ff', 'num_layers')
    if key not in hf
  ]
  if missing:
    raise ValueError(f'config.json lacks {missing}; it is not a transformers T5 config.')
  num_layers = hf['num_layers']
  num_decoder_layers = hf.get('num_decoder_layers')
  return network.T5Config(
    vocab_size=hf['vocab_size'],
    emb_dim=hf['d_model'],
    num_heads=hf['num_heads'],
    num_encoder_layers=num_layers,
    num_decoder_layers=num_layers if num_decoder_layers is None else num_decoder_layers,
    head_dim=hf['d_kv'],
    mlp_dim=hf['d_ff'],
    mlp_activations=_FEED_FORWARD[feed_forward],
    dropout_rate=hf.get('dropout_rate', 0.1),
    logits_via_embedding=logits_via_embedding,
  )


@contextlib.contextmanager
def _open(model_dir: str):
  """Yields (config.json contents, tensor names, read(name) -> float32 array)."""
  model_dir = os.fspath(common.checkpoint_directory(model_dir))
  hf = _read_json(
    os.path.join(model_dir, CONFIG_FILE), 'the config.json of a transformers T5 model'
  )
  files = _tensor_files(model_dir)
  with contextlib.ExitStack() as stack:
    handles = {path: stack.enter_context(_safe_open(path)) for path in set(files.values())}

    def read(name):
      if name not in files:
        raise ValueError(f'{model_dir} lacks tensor {name}, which its config.json implies.')
      return np.asarray(handles[files[name]].get_tensor(name), np.float32)

    yield hf, set(files), read


def _head(
  hf: Dict[str, Any], names: Set[str], read: Callable[[str], np.ndarray]
) -> Tuple[network.T5Config, np.ndarray, np.ndarray, bool]:
  """(config, shared embedding, output embedding, whether outputs are scaled)."""
  tie = hf.get('tie_word_embeddings', True)
  scale = bool(hf.get('scale_decoder_outputs', tie))
  shared = read('shared.weight')
  head = read('lm_head.weight') if 'lm_head.weight' in names else shared
  config = _t5_config_from_json(hf, logits_via_embedding=scale and np.array_equal(head, shared))
  return config, shared, head, scale


# Settings of how the network computes, not of what the parameters mean.
_COMPUTE_FIELDS = ('dtype', 'dropout_rate', 'float32_attention_logits')


def _check_same_architecture(config: network.T5Config, stored: network.T5Config, path: str) -> None:
  """Raises ValueError unless `config` and `stored` differ in compute settings alone."""
  for field in dataclasses.fields(network.T5Config):
    if field.name in _COMPUTE_FIELDS:
      continue
    given, recorded = getattr(config, field.name), getattr(stored, field.name)
    if given != recorded:
      raise ValueError(
        f'The config has {field.name}={given!r}, but the checkpoint at {path} '
        f'has {field.name}={recorded!r}; use huggingface.t5_config(path) '
        '(with dataclasses.replace for the compute dtype).'
      )


def t5_config(model_dir: str) -> network.T5Config:
  """The T5Config that `load_t5` returns for a transformers T5 directory.

  Reads config.json and, to tell a tied output layer from an untied one, the
  embedding tensors.
  """
  with _open(model_dir) as (hf, names, read):
    return _head(hf, names, read)[0]


def load_t5(
  model_dir: str, config: Optional[network.NetworkConfig] = None
) -> Tuple[network.T5Config, Params]:
  """Reads a transformers T5 directory into a T5Config and a T5X parameter tree.

  Reads `config.json` and `model.safetensors` (or the shards listed in
  `model.safetensors.index.json`) of a `T5ForConditionalGeneration`: T5 1.1,
  Flan-T5 and mT5 (gated GELU) and T5 1.0 (ReLU, `mlp/wi`).

  The output layer follows what transformers computes: `lm_head.weight` if the
  checkpoint has one, else the shared embedding; decoder outputs are scaled by
  d_model**-0.5 if config.json says `scale_decoder_outputs` (transformers 5)
  or, lacking that key, `tie_word_embeddings` (transformers 4; default true).
  A tied, scaled head becomes `logits_via_embedding=True` (T5X's
  attend(y) / sqrt(emb_dim)); an untied scaled head has the scale folded into
  `logits_dense`.

  Args:
    model_dir: the directory `save_pretrained` wrote.
    config: if given, the config the caller expects: it must be a T5Config
      and agree with the directory's in every field but the compute settings
      (dtype, dropout, float32 attention logits).

  Returns:
    (config, params): config with the default compute dtype (bfloat16; use
    `dataclasses.replace(config, dtype=...)`), params a nested dict of float32
    numpy arrays in the T5X tree.

  Raises:
    FileNotFoundError: config or weights missing.
    ValueError: an unsupported variant, tensors that do not match the config,
      or a `config` that does not match the directory's.
  """
  expected_config = config
  if expected_config is not None:
    require_t5_config(expected_config, f'{model_dir} is a Hugging Face directory; the importer')
  with _open(model_dir) as (hf, names, read):
    config, shared, head, scale = _head(hf, names, read)
    if expected_config is not None:
      _check_same_architecture(expected_config, config, model_dir)
    used = {name for _, name, _ in _tensor_names(config)} | {'lm_head.weight', *_TIED_COPIES}
    unused = sorted(names - used)
    if unused:
      raise ValueError(
        f'{model_dir} has tensors this T5 architecture does not use: '
        f'{unused[:5]}{"..." if len(unused) > 5 else ""}.'
      )
    flat = {}
    for path, name, transposed in _tensor_names(config):
      value = shared if name == 'shared.weight' else read(name)
      flat[path] = value.T if transposed else value
  if not config.logits_via_embedding:
    # An untied head that transformers scales (never the case for T5 1.1) has
    # the scale folded in.
    flat[('decoder', 'logits_dense', 'kernel')] = (
      head * np.float32(config.emb_dim**-0.5) if scale else head
    ).T
  differences = common.compare_shapes(
    traverse_util.unflatten_dict(flat), common.expected_params(config)
  )
  if differences:
    raise ValueError(
      f'The tensors of {model_dir} do not match its config.json: '
      f'{differences.summary("the network of its config.json")}.'
    )
  return config, traverse_util.unflatten_dict(
    {path: np.ascontiguousarray(value) for path, value in flat.items()}
  )


def save_t5(config: network.T5Config, params: Params, output_dir: str) -> None:
  """Writes config.json and model.safetensors that transformers loads.

  `T5ForConditionalGeneration.from_pretrained(output_dir)` reproduces the
  network's logits (transformers 4 and 5), and `load_t5` reads the
  directory back into the same parameters.

  A tied head (`logits_via_embedding=True`) is written as transformers' tied,
  scaled T5: `shared.weight` only, `tie_word_embeddings` and
  `scale_decoder_outputs` true. An untied head (T5 1.1) is written the way
  transformers 4 saved T5 1.1 and Flan-T5: a separate `lm_head.weight` and
  `"tie_word_embeddings": false`. transformers 5 forces tying in its T5Config
  but, when a checkpoint holds both tensors with different values, keeps them
  untied (it logs a warning saying it will not tie them) and does not scale,
  which is exactly this model; checked with transformers 5.24.

  Args:
    config: the network's config.
    params: the T5X parameter tree (arrays of any float dtype).
    output_dir: created if missing; existing files of the same names are
      overwritten.
  """
  require_t5_config(config, 'huggingface.save_t5')
  inverse = {activations: name for name, activations in _FEED_FORWARD.items()}
  if config.mlp_activations not in inverse:
    raise ValueError(
      f'transformers T5 has no MLP with activations {config.mlp_activations}; '
      f'exportable are {sorted(inverse)}.'
    )
  flat = traverse_util.flatten_dict(params)
  tensors = {}
  for path, name, transposed in _tensor_names(config):
    value = np.asarray(flat[path], np.float32)
    tensors[name] = np.ascontiguousarray(value.T if transposed else value)
  if not config.logits_via_embedding:
    tensors['lm_head.weight'] = np.ascontiguousarray(
      np.asarray(flat[('decoder', 'logits_dense', 'kernel')], np.float32).T
    )
  hf = {
    'architectures': ['T5ForConditionalGeneration'],
    'model_type': 't5',
    'is_encoder_decoder': True,
    'vocab_size': config.vocab_size,
    'd_model': config.emb_dim,
    'd_kv': config.head_dim,
    'd_ff': config.mlp_dim,
    'num_heads': config.num_heads,
    'num_layers': config.num_encoder_layers,
    'num_decoder_layers': config.num_decoder_layers,
    'feed_forward_proj': inverse[config.mlp_activations],
    'relative_attention_num_buckets': network.NUM_BUCKETS,
    'relative_attention_max_distance': network.MAX_DISTANCE,
    'layer_norm_epsilon': 1e-6,
    'dropout_rate': config.dropout_rate,
    'pad_token_id': 0,
    'eos_token_id': 1,
    'decoder_start_token_id': 0,
    'tie_word_embeddings': config.logits_via_embedding,
    'scale_decoder_outputs': config.logits_via_embedding,
    'dtype': 'float32',
  }
  os.makedirs(output_dir, exist_ok=True)
  with open(os.path.join(output_dir, CONFIG_FILE), 'w') as f:
    json.dump(hf, f, indent=2, sort_keys=True)
  _safetensors().numpy.save_file(
    tensors, os.path.join(output_dir, WEIGHTS_FILE), metadata={'format': 'pt'}
  )
