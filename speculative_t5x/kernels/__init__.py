"""Kernels of our own for CPU decoding (see `cpu_matmul`)."""

from speculative_t5x.kernels.cpu_matmul import available as available
from speculative_t5x.kernels.cpu_matmul import cpu_kernel_enabled as cpu_kernel_enabled
from speculative_t5x.kernels.cpu_matmul import is_packed as is_packed
from speculative_t5x.kernels.cpu_matmul import matmul as matmul
from speculative_t5x.kernels.cpu_matmul import pack as pack
from speculative_t5x.kernels.cpu_matmul import unpack as unpack
from speculative_t5x.kernels.params import COLLECTION as COLLECTION
from speculative_t5x.kernels.params import PackedParams as PackedParams
from speculative_t5x.kernels.params import pack_params as pack_params
from speculative_t5x.kernels.params import plain_params as plain_params
from speculative_t5x.kernels.params import variables as variables
