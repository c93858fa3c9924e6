#pragma once
// An attacker drill's forging learner (the chaos monkey's forge_epoch,
// forge_sender, forge_notice and bad_endpoint kinds; wire.accept_chaos): each
// step, with its own key, it sends well-formed envelopes that no node may obey.
// The drill passes when every one is refused or ignored and counted, and the
// mesh goes on as if none had been sent. What each kind sends:
//   forge_epoch   its own Progress (to the broker) and Heartbeats (to the
//                 shards) with the broker epochs 0, one older than known, the
//                 known one, one of a broker the mesh does not have, one near
//                 2^64, and a newer one of the primary: only a broker's header
//                 moves an epoch (refused: bad_epoch, or ignored)
//   forge_sender  headers claiming the leading broker (RoundClose, Welcome to a
//                 shard), a shard (FragmentUpdate, an arrival notice to the
//                 broker), another learner (Progress, Leave, a Contribution), the
//                 chaos monkey (ChaosCommand) and an admin (Reconfigure): each
//                 refused (impersonation)
//   forge_notice  arrival notices (Contribution) to the broker naming another
//                 learner, buffered and rejected (refused: notice_not_owner)
//   bad_endpoint  a Join and a FetchFragment per shard with endpoints that are none
//                 (refused: bad_endpoint; the learner stays a member at its own)
// Pure: it builds envelopes and hands them to the port.

#include <cstdint>

#include "core/ids.hpp"
#include "core/mesh_setup.hpp"
#include "transport/chaos_command.hpp"
#include "transport/message_port.hpp"

namespace archipelago {

class message_forger {
 public:
  /// Sends one step's forgeries of `kind` as learner `self` (incarnation `inc`), whose
  /// known broker epoch is `epoch` and who has done `steps` steps of `tokens` tokens.
  void forge(forgery kind, const mesh_setup& setup, node_address self, incarnation inc, std::uint64_t epoch,
             std::uint64_t steps, std::uint64_t tokens, transport::message_port& port);
  /// Envelopes forged so far (each one must be refused or ignored somewhere).
  std::uint64_t sent() const { return sent_; }

 private:
  void send(transport::message_port& port, node_address to, transport::encoded_message&& m);
  std::uint64_t sent_ = 0;
  std::uint64_t turn_ = 0;  // cycles the values each step forges
  std::uint64_t sequence_ = 0;  // forged senders' own (their dedup window is theirs, not this learner's)
};

}  // namespace archipelago
