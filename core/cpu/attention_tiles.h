#pragma once
// What the two CPU attention paths share (nn_cpu.cpp's F32 tiles and
// attention_bf16.cpp's BF16 tiles): the tile size, a call's dimensions and
// the causal mask, so both visit keys in the same tiles.
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "core/tensor.h"

namespace st::cpu::attention {

/// Query and key positions per tile.
inline constexpr int64_t kTile = 64;

/// q [B, Tq, H, hd]; k, v [B, Tk, KV, hd].
struct Dims {
  int64_t batch, seq, heads, kv_heads, hd, group, tiles;
  int64_t kv_seq;  // Tk: key/value positions (== seq in a full pass and in backward)
  int64_t offset;  // Tk - Tq: the position of query 0
  float scale;     // 1 / sqrt(hd)
};

inline Dims dims_of(const Tensor& q, const Tensor& k) {
  Dims d{};
  d.batch = q.size(0);
  d.seq = q.size(1);
  d.heads = q.size(2);
  d.hd = q.size(3);
  d.kv_heads = k.size(2);
  d.group = d.heads / d.kv_heads;
  d.tiles = (d.seq + kTile - 1) / kTile;
  d.kv_seq = k.size(1);
  d.offset = d.kv_seq - d.seq;
  d.scale = 1.0f / std::sqrt(static_cast<float>(d.hd));
  return d;
}

/// Keys of a tile starting at k0 that query position `pos` may see (causal).
inline int64_t visible_keys(int64_t pos, int64_t k0, int64_t kn) { return std::clamp<int64_t>(pos - k0 + 1, 0, kn); }

}  // namespace st::cpu::attention
