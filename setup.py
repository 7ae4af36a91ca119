"""speculative_t5x: exact speculative decoding for T5X's encoder-decoder and decoder-only models."""

import setuptools

setuptools.setup(
  name='speculative_t5x',
  version='0.1.0',
  description=(
    'Speculative decoding (Leviathan et al., 2023) for T5X models, T5 1.1 '
    'encoder-decoders and decoder-only language models, in JAX/Flax, as a '
    'drop-in for T5X decoding.'
  ),
  # The library, and the lab that measures it (benchmarks, the demo, reports):
  # the lab imports the library, never the reverse.
  packages=setuptools.find_packages(
    include=['speculative_t5x', 'speculative_t5x.*', 'speculative_t5x_lab', 'speculative_t5x_lab.*']
  ),
  # The CPU kernel's source, compiled on first use (speculative_t5x/kernels).
  package_data={'speculative_t5x.kernels': ['*.cc']},
  python_requires='>=3.10',
  install_requires=[
    'absl-py>=2.1,<3',
    'flax>=0.10,<0.13',
    'gin-config>=0.5,<0.6',
    # tensorflow-datasets needs it to download and prepare datasets, but
    # declares it only for Python < 3.9.
    'importlib_resources>=6,<8',
    'jax>=0.5,<0.11',
    'matplotlib>=3.8,<4',
    'numpy>=1.26,<3',
    'optax>=0.2.4,<0.3',
    'orbax-checkpoint>=0.11,<0.13',
    # Reads the gettext catalogs of the offline EnDe corpus.
    'polib>=1.2,<2',
    'rouge-score>=0.1.2,<0.2',
    'sacrebleu>=2.4,<3',
    'sentencepiece>=0.2,<0.3',
    'seqio>=0.0.19,<0.1',
    'tensorflow-datasets>=4.9,<5',
    'tensorstore>=0.1.65,<0.2',
    'tqdm>=4.66,<5',
  ],
  extras_require={
    # Hugging Face import/export parity and the peer comparison.
    'hf': ['safetensors>=0.4,<1', 'torch>=2.1', 'transformers>=5.0,<6'],
    'test': [
      'hypothesis>=6.100,<7',
      'ipykernel>=6.29',
      'nbclient>=0.10,<0.12',
      'nbformat>=5.10,<6',
      'pytest>=8,<10',
      'pytest-xdist>=3.5,<4',
      'ruff>=0.17,<0.18',
      'safetensors>=0.4,<1',
      'scipy>=1.11,<2',
      'torch>=2.1',
      'transformers>=5.0,<6',
    ],
  },
)
