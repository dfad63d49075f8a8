// Placeholder: filled by the CUDA kernels work (see core/cuda/ops_cuda.h).
#include "core/cuda/ops_cuda.h"
