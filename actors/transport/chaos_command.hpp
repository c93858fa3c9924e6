#pragma once
// ChaosCommand on the wire (schemas/envelope.capnp): what the chaos monkey asks
// a node to do to itself — shape its links, slow its steps, fail its snapshot
// writes, heal — and the receiving side every role shares (it lives below the
// roles, so that none of them includes the chaos monkey). A node obeys only
// with wire.accept_chaos on (drills); otherwise the command is counted and dropped.
// Process faults (crash, pause) do not travel here: the launcher that owns the
// processes (or, in one process, the actors) carries them out.

#include <cstdint>
#include <optional>
#include <set>

#include "core/clock.hpp"
#include "core/error.hpp"
#include "core/ids.hpp"
#include "core/log.hpp"
#include "transport/codec.hpp"
#include "transport/link_shaper.hpp"
#include "transport/message_port.hpp"

namespace archipelago {

/// A learner's attack on its own contributions (the chaos monkey's attacker kinds).
enum class contribution_attack : std::uint8_t { none, scaled, sign_flip, random, stale, sideways };
const char* to_string(contribution_attack a);

struct chaos_order {
  /// impersonate, lie_tokens: attacker drills — a learner that forges
  /// envelopes claiming to be `peer` with its own key, or claims factor × its tokens;
  /// attack: a learner that poisons its contributions (`attack`, `factor`).
  enum class what : std::uint8_t { shape_link, slow_down, storage_fault, heal, impersonate, lie_tokens, attack };
  what kind = what::heal;
  node_address peer;          // shape_link: the link from the receiver to this peer; impersonate: whom to claim to be
  link_profile link;          // shape_link
  double factor = 1;          // slow_down: step time × factor (1: normal); lie_tokens: claims × factor (1: honest);
                              // attack scaled: delta × factor; sideways: cosine with the honest delta
  contribution_attack attack = contribution_attack::none;  // attack
  nanos duration_ns = 0;      // storage_fault: writes fail this long; impersonate: > 0 on, 0 off
};

/// Encodes `order` for `target` into a ChaosCommand envelope.
void encode_chaos_order(transport::envelope_builder& b, node_address target, const chaos_order& order);
/// Reads a ChaosCommand; an unknown kind, a bad link profile or a factor below 1 is invalid_input.
expected<chaos_order> decode_chaos_order(const transport::decoded_envelope& env);

/// What a node's chaos faults left it with; the role reads slowdown and storage_failing_until.
struct chaos_receiver {
  bool accept = false;                 // wire.accept_chaos
  double slowdown = 1;                 // step time × this (learners)
  contribution_attack attack = contribution_attack::none;  // learners: how they poison their contributions
  double attack_factor = 1;            // attack scaled: delta × this; sideways: cosine with the honest delta
  nanos storage_failing_until = 0;     // snapshot writes fail before this time (shards)
  std::set<node_address> shaped;       // links shaped by the chaos monkey, reset by heal
  std::uint64_t obeyed = 0, refused = 0;
  std::uint64_t refused_sender = 0;    // of refused: not sent by the chaos monkey (its key binds role chaos)
  std::optional<node_address> impersonate;  // attacker drill (learners): forge envelopes claiming to be this node
  double token_lie = 1;                // attacker drill (learners): contributions claim tokens × this

  /// Handles a ChaosCommand envelope: shapes links through `port` (heal restores
  /// the node's default link), updates the fields above. Returns the order
  /// obeyed, or nullopt when refused (accept off, malformed: logged, rate-limited by the logger).
  std::optional<chaos_order> on_command(const transport::decoded_envelope& env, transport::message_port& port,
                                        logger& log, nanos now);
};

}  // namespace archipelago
