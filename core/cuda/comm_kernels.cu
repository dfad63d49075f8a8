// Placeholder: kernels of the NCCL backend.
#include <cuda_runtime_api.h>
