#pragma once
// What the sync broker keeps durable, as its wire layer sees it: the round
// lease, the event tape and the token ledger. The actor shell writes them to
// the run's (or its own) snapshot store; the simulation keeps them in memory,
// so that a restarted broker in either recovers through the same code.

#include <cstdint>
#include <string>
#include <vector>

#include "core/clock.hpp"
#include "core/error.hpp"
#include "core/ids.hpp"
#include "storage/snapshot_store.hpp"

namespace archipelago {

class broker_store {
 public:
  virtual ~broker_store() = default;
  /// Round numbers below `rounds_below` may be announced: durable before this
  /// returns, so a restarted broker numbers its rounds after them.
  virtual status lease_rounds(std::uint64_t rounds_below, incarnation inc) = 0;
  /// A round whose fragment version its shard made durable; the store stamps
  /// the time of the commit. May be queued.
  virtual void append_tape(storage::tape_record record) = 0;
  /// The ledger as it stands: one record per learner incarnation, with where
  /// it listens. May be queued; a full queue skips one write (the next catches up).
  virtual void write_ledger(std::vector<storage::learner_ledger> ledgers) = 0;
};

/// Where a broker starts: the first round it numbers, and what a restarted
/// node broker reads back from its own store.
struct broker_start {
  /// After every round a resumed snapshot or the store's tape has seen (0: a new mesh).
  std::uint64_t first_round = 0;
  /// A node broker on its own store (`node --role broker --db`): it leases round
  /// numbers ahead and restores the ledger its predecessor stored. Off in `run`,
  /// whose store also serves resumed runs with new learners.
  bool recovery = false;
  std::uint64_t rounds_leased = 0;               // recovery: the stored lease covers rounds below this
  std::vector<storage::learner_ledger> ledgers;  // recovery: the stored ledger
  /// With standbys: the stored tape (its newest tape_log::capacity records), which the
  /// leader copies to a standby that misses some, and a standby's rounds held already.
  std::vector<storage::tape_record> tape;
  /// Recovery: the live changes the stored tape records (TapeRecord.settings), oldest
  /// first. The broker leads with them in force, not the configuration's values.
  std::vector<std::string> settings;
  /// The ledger goes to the store this often (a few records; what a restarted broker restores),
  /// and to the standbys (BrokerState) with the tape written since.
  nanos ledger_write_interval_ns = 1'000'000'000;
  /// The epoch it leads in (mesh_setup.hpp); 0: its incarnation's, as broker 0 (a mesh without standbys).
  std::uint64_t epoch = 0;
};

}  // namespace archipelago
