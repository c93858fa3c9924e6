#include "transport/bulk_pacer.hpp"

#include <algorithm>

#include "core/invariant.hpp"

namespace archipelago {

bulk_pacer::bulk_pacer(std::size_t piece_bytes, std::size_t capacity)
    : piece_bytes_(piece_bytes), capacity_(capacity) {
  ARCHIPELAGO_INVARIANT(piece_bytes_ >= 1 && capacity_ >= 1, "bulk pacer: pieces and capacity of at least 1");
}

bool bulk_pacer::queue(std::uint64_t id, std::size_t bytes) {
  if (queue_.size() >= capacity_) return false;
  queue_.push_back({id, bytes, bytes});
  return true;
}

nanos bulk_pacer::piece_ns(const link_shaper& shaper) const {
  return static_cast<nanos>(static_cast<double>(piece_bytes_) * 1e9 / shaper.profile().bandwidth_bytes_per_s);
}

std::vector<bulk_pacer::sent> bulk_pacer::pump(nanos now, link_shaper& shaper) {
  std::vector<sent> out;
  const bool unlimited = shaper.profile().bandwidth_bytes_per_s <= 0;
  while (!queue_.empty() && (unlimited || shaper.busy_until_ns() - now <= piece_ns(shaper))) {
    message& m = queue_.front();
    const std::size_t piece = unlimited ? m.left : std::min(m.left, piece_bytes_);
    if (piece < m.left) {
      shaper.submit_piece(now, piece);
      m.left -= piece;
      continue;
    }
    out.push_back({m.id, shaper.submit(now, piece, m.bytes)});
    queue_.pop_front();
  }
  return out;
}

nanos bulk_pacer::next_pump_ns(nanos now, const link_shaper& shaper) const {
  if (queue_.empty()) return -1;
  if (shaper.profile().bandwidth_bytes_per_s <= 0) return now;
  return std::max(now, shaper.busy_until_ns() - piece_ns(shaper));
}

}  // namespace archipelago
