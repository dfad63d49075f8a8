// Placeholder: the NCCL backend (see make_nccl_group in core/comm.h).
#include "core/comm.h"
