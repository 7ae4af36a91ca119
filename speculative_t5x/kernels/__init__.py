"""Kernels of our own for CPU decoding (see `cpu_matmul`)."""

from speculative_t5x.kernels.cpu_matmul import available
from speculative_t5x.kernels.cpu_matmul import cpu_kernel_enabled
from speculative_t5x.kernels.cpu_matmul import is_packed
from speculative_t5x.kernels.cpu_matmul import matmul
from speculative_t5x.kernels.cpu_matmul import pack
from speculative_t5x.kernels.cpu_matmul import unpack
