#include "node/process_roles.hpp"

#include "learner/learner_actor.hpp"
#include "parameter_shard/shard_actor.hpp"
#include "sync_broker/broker_actor.hpp"

namespace archipelago {

caf::actor process_roles::learner(std::uint32_t index, incarnation inc, std::int64_t start_step) const {
  learner_actor_args a;
  a.setup = &setup;
  a.index = index;
  a.data = data;
  a.io = io;
  a.clock = &clock;
  a.logs = &log;
  a.inc = inc;
  a.start_step = start_step;
  a.board = &board;
  return spawn_learner(sys, std::move(a));
}

caf::actor process_roles::shard(std::uint32_t index, incarnation inc, std::optional<storage::manifest> resume_from) const {
  shard_actor_args a;
  a.setup = &setup;
  a.index = index;
  a.initial = initial;
  a.initial_used = initial_used;
  a.io = io;
  a.clock = &clock;
  a.logs = &log;
  a.inc = inc;
  a.writer = writer;
  a.record_contributions = record_contributions;
  a.restore_store = restore_store;
  a.resume_from = std::move(resume_from);
  a.restored = restored;
  a.learner_steps = learner_steps;
  a.tokens = tokens;
  a.set_storage_failing = set_storage_failing;
  a.board = &board;
  return spawn_shard(sys, std::move(a));
}

caf::actor process_roles::broker(incarnation inc, std::optional<storage::manifest> resume_from, bool recovery,
                                 std::uint32_t index) const {
  broker_actor_args a;
  a.index = index;
  a.setup = &setup;
  a.io = io;
  a.clock = &clock;
  a.logs = &log;
  a.inc = inc;
  a.writer = index < broker_writers.size() ? broker_writers[index] : writer;
  a.resume_from = std::move(resume_from);
  a.recovery = recovery;
  a.board = &board;
  return spawn_broker(sys, std::move(a));
}

}  // namespace archipelago
