#pragma once
// The contract between the layers that hold training state (fsdp, optim) and
// the checkpoint subsystem: every piece of state is addressed by (FQN, kind)
// and a flat element range of the full tensor (docs/DESIGN.md, "State entries").
#include <cstdint>
#include <string>

#include "core/tensor.h"

namespace st {

struct StateEntry {
  std::string fqn;     // Hugging Face name, e.g. "model.layers.3.mlp.up_proj.weight"
  std::string kind;    // "master", "exp_avg", "exp_avg_sq", "momentum_buffer", ...
  Shape global_shape;  // shape of the full tensor
  DType dtype = DType::F32;
  int64_t begin = 0;  // first flat element of the full tensor held here
  Tensor local;       // 1-D view of the elements held here, filled in place on load
};

}  // namespace st
