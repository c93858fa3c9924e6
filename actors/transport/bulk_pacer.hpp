#pragma once
// The bulk lane's pacing on one link. A message that carries tensor frames (a
// fragment, a contribution: megabytes) enters the link's shaper a piece at a
// time, and only while the link's backlog is at most one piece; a control
// message (heartbeat, Join/Welcome, RoundOpen/Close) handed to the link
// meanwhile therefore waits behind about two pieces, never behind whole
// fragments: on a 3 Mbit/s link one 4 MiB fragment takes 11 s, a 64 KiB piece
// 0.17 s. A pure state core: the transport's I/O thread passes the time in.

#include <cstddef>
#include <cstdint>
#include <deque>
#include <vector>

#include "core/clock.hpp"
#include "transport/link_shaper.hpp"

namespace archipelago {

class bulk_pacer {
 public:
  static constexpr std::size_t default_piece_bytes = 64 * 1024;

  /// A message whose last piece entered the link, and what became of it.
  struct sent {
    std::uint64_t id = 0;
    deliveries arrivals;
  };

  /// piece_bytes >= 1: the link's unit of interleaving; capacity >= 1: messages
  /// that may wait (one is being sent).
  bulk_pacer(std::size_t piece_bytes = default_piece_bytes, std::size_t capacity = 256);

  /// Queues message `id` of `bytes` behind the others; false when `capacity`
  /// messages wait already (the caller drops it and counts the drop).
  bool queue(std::uint64_t id, std::size_t bytes);

  /// Feeds `shaper` while its backlog at `now` is at most one piece (an
  /// unlimited link takes whole messages at once) and returns the messages
  /// whose last piece went in, in order, with their fates.
  std::vector<sent> pump(nanos now, link_shaper& shaper);

  /// When pump() can next feed the link: now or later; -1 when nothing waits.
  nanos next_pump_ns(nanos now, const link_shaper& shaper) const;

  std::size_t waiting() const { return queue_.size(); }
  /// Forgets every waiting message (the link's peer died; its socket is dropped).
  void clear() { queue_.clear(); }

 private:
  struct message {
    std::uint64_t id;
    std::size_t bytes, left;
  };
  nanos piece_ns(const link_shaper& shaper) const;

  std::size_t piece_bytes_, capacity_;
  std::deque<message> queue_;
};

}  // namespace archipelago
