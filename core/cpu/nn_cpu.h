#pragma once
// CPU backend of the model ops in core/ops.h (forward/backward pairs and the
// losses). Arguments are already checked by the dispatcher in core/ops_nn.cpp,
// except what depends on tensor contents (token and target ranges), which is
// checked here before anything is written.
#include "core/ops.h"

namespace st::cpu {

void embedding_forward(const Tensor& tokens, const Tensor& weight, const Tensor& out);
void embedding_backward(const Tensor& tokens, const Tensor& dout, const Tensor& dweight);

void rmsnorm_forward(const Tensor& x, const Tensor& weight, float eps, const Tensor& out, const Tensor& rstd);
void rmsnorm_backward(const Tensor& dout, const Tensor& x, const Tensor& weight, const Tensor& rstd, const Tensor& dx,
                      const Tensor& dweight);
void add_rmsnorm_forward(const Tensor& x, const Tensor& delta, const Tensor& weight, float eps, const Tensor& h,
                         const Tensor& out, const Tensor& rstd);
void rmsnorm_backward_add(const Tensor& dout, const Tensor& x, const Tensor& weight, const Tensor& rstd,
                          const Tensor& residual, const Tensor& dx, const Tensor& dweight);

void rope_tables(int64_t seq_len, int64_t head_dim, double theta, const Tensor& cos, const Tensor& sin);
void rope_forward(const Tensor& x, const Tensor& cos, const Tensor& sin);
void rope_backward(const Tensor& dx, const Tensor& cos, const Tensor& sin);

void attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse);
void attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                        const Tensor& lse, const Tensor& dq, const Tensor& dk, const Tensor& dv);

void swiglu_forward(const Tensor& gate, const Tensor& up, const Tensor& out);
void swiglu_backward(const Tensor& dout, const Tensor& gate, const Tensor& up, const Tensor& dgate, const Tensor& dup);

void relu_forward(const Tensor& x, const Tensor& out);
void relu_backward(const Tensor& dout, const Tensor& x, const Tensor& dx);

ops::LossSum cross_entropy(const Tensor& logits, const Tensor& targets, int64_t ignore_index, float grad_scale,
                           const Tensor& dlogits);
ops::LossSum mse(const Tensor& pred, const Tensor& target, float grad_scale, const Tensor& dpred);

}  // namespace st::cpu
