// The snapshot store over the in-memory and the fault-injecting kv: commits and
// manifests, retention, checksums on every read, recovery after torn and failed
// writes (nothing committed lost, nothing corrupt served), the writer's queue;
// and the shard core's snapshot round trip (a restored core continues bit for bit).

#include <doctest/doctest.h>

#include <condition_variable>
#include <mutex>
#include <set>

#include "../test_log.hpp"
#include "core/checksum.hpp"
#include "core/prng.hpp"
#include "parameter_shard/shard_core.hpp"
#include "storage/snapshot_store.hpp"
#include "storage/snapshot_writer.hpp"

using namespace archipelago;
using namespace archipelago::storage;

namespace {

store_info test_info() {
  store_info info;
  info.config_toml = "[model]\nsize = \"nano\"\n";
  info.layout_fingerprint = 42;
  info.mesh_hash = 7;
  info.param_floats = 64;
  return info;
}

fragment_state state(std::uint32_t p, std::uint64_t version, std::uint64_t seed, std::size_t n = 16) {
  prng rng(seed);
  fragment_state f;
  f.fragment = p;
  f.version = version;
  f.round = version * 10 + p;
  f.time_ns = static_cast<std::int64_t>(version);
  for (std::size_t i = 0; i < n; ++i) {
    f.theta.push_back(static_cast<float>(rng.normal()));
    f.momentum.push_back(static_cast<float>(rng.normal()));
  }
  return f;
}

commit_job job_of(std::vector<fragment_state> states) {
  commit_job job;
  for (auto& f : states) job.fragments.push_back(owned_write(std::move(f)));
  return job;
}

/// The store's manifests, ascending.
std::vector<manifest> manifests_of(const snapshot_store& store) {
  std::vector<manifest> out;
  REQUIRE(store.for_each_manifest([&](const manifest& m) {
    out.push_back(m);
    return true;
  }));
  return out;
}

/// Every manifest reads back, names fragment states that exist and match its checksums.
void check_consistent(const snapshot_store& store) {
  for (const auto& m : manifests_of(store))
    for (const auto& e : m.entries) {
      auto f = store.read_fragment(e.fragment, e.version);
      REQUIRE_MESSAGE(f, "mesh version " << m.mesh_version << ": " << f.err().message);
      CHECK(checksum64(f->theta.data(), f->theta.size() * 4) == e.theta_checksum);
    }
}

}  // namespace

TEST_CASE("snapshot store: commits make manifests that name one version per fragment") {
  auto kv = std::shared_ptr<kv_store>(make_memory_kv());
  auto store = snapshot_store::create(kv, test_info());
  REQUIRE(store);
  auto& s = **store;
  REQUIRE(s.commit(job_of({state(0, 0, 1), state(1, 0, 2)})).value() == 1);

  commit_job second = job_of({state(1, 1, 3)});
  second.merges.push_back({1, 1, 11, {{4, 9, 3, 300, std::vector<float>(16, 0.5f)}}});
  second.ledger = {100, 2, 0, 1, 500};
  second.learner_steps = 12;
  REQUIRE(s.commit(second).value() == 2);

  auto head = s.latest_manifest();
  REQUIRE(head);
  REQUIRE(head->has_value());
  const manifest& m = **head;
  CHECK(m.mesh_version == 2);
  REQUIRE(m.entries.size() == 2);
  CHECK(m.find(0)->version == 0);  // not in the commit: keeps its version
  CHECK(m.find(1)->version == 1);
  CHECK(m.ledger.processed == 500);
  CHECK(m.learner_steps == 12);
  auto f = s.read_fragment(1, 1);
  REQUIRE(f);
  CHECK(f->theta == state(1, 1, 3).theta);
  CHECK(f->momentum == state(1, 1, 3).momentum);
  auto merge = s.read_merge(1, 1);
  REQUIRE(merge);
  REQUIRE(merge->contributions.size() == 1);
  CHECK(merge->contributions[0].learner == 4);
  CHECK(merge->contributions[0].delta == std::vector<float>(16, 0.5f));
  CHECK(s.read_merge(0, 0).err().code == errc::not_found);
  CHECK(s.read_manifest(9).err().code == errc::not_found);

  // Reopened, the store continues where it was.
  auto again = snapshot_store::open(kv);
  REQUIRE(again);
  CHECK((*again)->last_mesh_version() == 2);
  CHECK((*again)->info().config_toml == test_info().config_toml);
  REQUIRE((*again)->commit(job_of({state(0, 1, 4)})).value() == 3);

  // Another model or policy is refused; a kv without store info is not a store.
  store_info other = test_info();
  other.layout_fingerprint = 43;
  CHECK(snapshot_store::create(kv, other).err().code == errc::invalid_input);
  other = test_info();
  other.mesh_hash = 8;
  CHECK(snapshot_store::create(kv, other).err().code == errc::invalid_input);
  CHECK(snapshot_store::open(std::shared_ptr<kv_store>(make_memory_kv())).err().code == errc::corrupt_data);
}

TEST_CASE("snapshot store: the broker's ledger with its step counts and the round lease survive a reopen") {
  auto kv = std::shared_ptr<kv_store>(make_memory_kv());
  {
    auto store = snapshot_store::create(kv, test_info());
    REQUIRE(store);
    auto& s = **store;
    CHECK_FALSE(s.read_round_lease().value().has_value());  // no broker wrote one yet
    REQUIRE(s.put_ledger({{2, 1700000000123, {640, 64, 0, 128, 832}, 13, 0.5, 0.25, "", {}, {}, {}, {}}}));
    REQUIRE(s.put_ledger({{2, 1700000000123, {704, 64, 0, 128, 896}, 14, 0.6, 0.3, "tcp://127.0.0.1:7001", {},
                           {64, 64}, {1000, 1200}, {0, 4, 1, 0}}}));  // rewritten, with a tail of two steps (P = 2)
    REQUIRE(s.put_round_lease({512, 77, 5}));
    REQUIRE(s.put_round_lease({256, 78, 6}));  // never lowered
  }
  auto reopened = snapshot_store::open(kv);
  REQUIRE(reopened);
  auto ledgers = (*reopened)->ledgers();
  REQUIRE(ledgers);
  REQUIRE(ledgers->size() == 1);
  const learner_ledger& l = ledgers->front();
  CHECK(l.learner == 2);
  CHECK(l.incarnation == 1700000000123);
  CHECK(l.totals.merged == 704);
  CHECK(l.totals.processed == 896);
  CHECK(l.steps == 14);
  CHECK(l.step_time_s == doctest::Approx(0.6));
  CHECK(l.merged_step_time_s == doctest::Approx(0.3));
  CHECK(l.endpoint == "tcp://127.0.0.1:7001");
  CHECK(l.tail_tokens == std::vector<std::uint32_t>{64, 64});
  CHECK(l.tail_time_us == std::vector<std::uint32_t>{1000, 1200});
  CHECK(l.tail_buckets == std::vector<std::uint8_t>{0, 4, 1, 0});
  auto lease = (*reopened)->read_round_lease();
  REQUIRE(lease);
  REQUIRE(lease->has_value());
  CHECK((*lease)->rounds_below == 512);
  CHECK((*lease)->incarnation == 77);
}

TEST_CASE("snapshot store: retention keeps the newest, every k-th and the first, unnamed states go") {
  auto kv = std::shared_ptr<kv_store>(make_memory_kv());
  auto s = *snapshot_store::create(kv, test_info(), {3, 5});
  REQUIRE(s->commit(job_of({state(0, 0, 1), state(1, 0, 2)})));
  for (std::uint64_t v = 1; v <= 20; ++v) REQUIRE(s->commit(job_of({state(v % 2, v, 100 + v)})));
  std::set<std::uint64_t> kept;
  for (const auto& m : manifests_of(*s)) kept.insert(m.mesh_version);
  CHECK(kept == std::set<std::uint64_t>{1, 5, 10, 15, 19, 20, 21});
  std::set<std::pair<std::uint32_t, std::uint64_t>> named;
  for (const auto& m : manifests_of(*s))
    for (const auto& e : m.entries) named.insert({e.fragment, e.version});
  auto stored = s->fragment_versions();
  REQUIRE(stored);
  CHECK(std::set<std::pair<std::uint32_t, std::uint64_t>>(stored->begin(), stored->end()) == named);
  check_consistent(*s);

  // The same retention after a reopen (its reference counts are rebuilt from the manifests).
  auto again = *snapshot_store::open(kv, {3, 5});
  for (std::uint64_t v = 21; v <= 30; ++v) REQUIRE(again->commit(job_of({state(v % 2, v, 100 + v)})));
  kept.clear();
  for (const auto& m : manifests_of(*again)) kept.insert(m.mesh_version);
  CHECK(kept == std::set<std::uint64_t>{1, 5, 10, 15, 20, 25, 29, 30, 31});
  check_consistent(*again);
}

TEST_CASE("snapshot store: a damaged record is never returned, recovery falls back to a valid manifest") {
  auto kv = std::shared_ptr<kv_store>(make_memory_kv());
  auto s = *snapshot_store::create(kv, test_info());
  REQUIRE(s->commit(job_of({state(0, 0, 1), state(1, 0, 2)})));
  REQUIRE(s->commit(job_of({state(0, 1, 3)})));
  REQUIRE(s->commit(job_of({state(1, 1, 4)})));

  // Flip one bit of fragment 1 version 1's stored value.
  const std::string key = be32(1) + be64(1);
  std::string value = kv->get(column::fragments, key).value().value();
  value[value.size() / 2] ^= 0x10;
  write_batch damage;
  damage.put(column::fragments, key, value);
  REQUIRE(kv->write(damage));

  CHECK(s->read_fragment(1, 1).err().code == errc::corrupt_data);
  std::vector<std::string> skipped;
  auto valid = s->latest_valid_manifest(&skipped);
  REQUIRE(valid);
  REQUIRE(valid->has_value());
  CHECK((*valid)->mesh_version == 2);  // version 3 names the damaged state
  CHECK(skipped.size() == 1);

  // A truncated manifest (torn) is skipped too; recovery deletes both and continues from 2.
  write_batch torn;
  torn.put(column::manifests, be64(4), std::string(12, 'x'));
  REQUIRE(kv->write(torn));
  auto reopened = *snapshot_store::open(kv);
  std::vector<std::string> dropped;
  auto head = reopened->recover(&dropped);
  REQUIRE(head);
  REQUIRE(head->has_value());
  CHECK((*head)->mesh_version == 2);
  CHECK(dropped.size() >= 2);
  CHECK(reopened->read_manifest(3).err().code == errc::not_found);
  CHECK(reopened->read_fragment(1, 1).err().code == errc::not_found);  // debris removed
  REQUIRE(reopened->commit(job_of({state(1, 1, 5)})).value() == 3);
  check_consistent(*reopened);
}

TEST_CASE("snapshot store: torn and failed writes are typed errors and lose nothing committed") {
  // Small commits (one logged batch each) and large ones (pieces past the log first).
  for (const bool bulk : {false, true})
  for (std::uint64_t seed : {1, 2, 3, 4}) {
    CAPTURE(bulk);
    CAPTURE(seed);
    const write_tuning tuning{bulk ? 5u : 2u << 20, bulk ? 1u : 16u << 20, 400};
    auto inner = std::shared_ptr<kv_store>(make_memory_kv());
    auto faulty = std::make_shared<faulty_kv>(inner, fault_plan{seed, 0.15, 0.25, 0});
    auto s = *snapshot_store::create(inner, test_info(), {4, 7}, tuning);
    REQUIRE(s->commit(job_of({state(0, 0, 1), state(1, 0, 2), state(2, 0, 3)})));
    auto store = *snapshot_store::open(faulty, {4, 7}, tuning);  // it writes through the faults from here on
    prng rng(seed);
    std::uint64_t committed = 1, failures = 0;
    std::uint64_t version[3] = {0, 0, 0};
    for (int i = 0; i < 200; ++i) {
      const auto p = static_cast<std::uint32_t>(rng.below(3));
      commit_job job = job_of({state(p, version[p] + 1, 1000 + static_cast<std::uint64_t>(i))});
      auto v = store->commit(job);
      if (!v) {
        CHECK(v.err().code == errc::io_error);
        ++failures;
        // A restart now: recovery finds every commit that succeeded, and only valid data.
        auto restarted = *snapshot_store::open(inner, {4, 7}, tuning);
        auto head = restarted->recover();
        REQUIRE(head);
        REQUIRE(head->has_value());
        CHECK((*head)->mesh_version == committed);
        for (const auto& e : (*head)->entries) CHECK(e.version == version[e.fragment]);
        check_consistent(*restarted);
        store = *snapshot_store::open(faulty, {4, 7}, tuning);
        continue;
      }
      CHECK(*v == committed + 1);
      committed = *v;
      ++version[p];
    }
    CHECK(failures > 20);
    CHECK(faulty->counters().torn_writes > 5);
  }
}

namespace {

/// Records the calls a store makes: logged and unlogged writes, memtable flushes, in order.
class call_log_kv final : public kv_store {
 public:
  explicit call_log_kv(std::shared_ptr<kv_store> inner) : inner_(std::move(inner)) {}
  status write(const write_batch& batch) override {
    calls.push_back("write");
    return inner_->write(batch);
  }
  status write_unlogged(const write_batch& batch) override {
    calls.push_back("unlogged");
    for (const auto& o : batch.ops) CHECK((o.col == column::pieces || o.col == column::contributions));  // only floats
    return inner_->write_unlogged(batch);
  }
  expected<std::optional<std::string>> get(column c, std::string_view key) const override { return inner_->get(c, key); }
  status scan(column c, std::string_view from, std::string_view to,
              const std::function<bool(std::string_view, std::string_view)>& visit) const override {
    return inner_->scan(c, from, to, visit);
  }
  expected<std::optional<std::pair<std::string, std::string>>> last(column c) const override { return inner_->last(c); }
  status flush() override { return inner_->flush(); }
  status flush_memtables() override {
    calls.push_back("flush");
    return inner_->flush_memtables();
  }
  std::vector<std::string> calls;

 private:
  std::shared_ptr<kv_store> inner_;
};

std::size_t count_keys(const kv_store& kv, column c) {
  std::size_t n = 0;
  REQUIRE(kv.scan(c, {}, {}, [&](std::string_view, std::string_view) { return ++n > 0; }));
  return n;
}

}  // namespace

TEST_CASE("snapshot store: states go in pieces, a large commit's pieces bypass the log and are flushed first") {
  auto inner = std::shared_ptr<kv_store>(make_memory_kv());
  auto logged = std::make_shared<call_log_kv>(inner);
  // 5 floats a piece; commits of 100 bytes or more bypass the log, one piece a write.
  const write_tuning tuning{5, 100, 1};
  auto s = *snapshot_store::create(logged, test_info(), {}, tuning);
  const fragment_state small = state(0, 0, 1, 4), large = state(1, 0, 2, 16);  // 32 and 128 bytes
  logged->calls.clear();
  REQUIRE(s->commit(job_of({small})));
  CHECK(logged->calls == std::vector<std::string>{"write"});  // 64 bytes: all in the one logged batch
  CHECK(count_keys(*inner, column::pieces) == 2);  // theta and momentum, one piece each
  logged->calls.clear();
  REQUIRE(s->commit(job_of({large})));
  // 8 pieces (5, 5, 5 and 1 floats of each part) written past the log, the flush, then the batch naming them.
  std::vector<std::string> expected(8, "unlogged");
  expected.push_back("flush");
  expected.push_back("write");
  CHECK(logged->calls == expected);
  CHECK(count_keys(*inner, column::pieces) == 2 + 8);
  for (const fragment_state* f : {&small, &large}) {
    auto back = s->read_fragment(f->fragment, f->version);
    REQUIRE(back);
    CHECK(back->theta == f->theta);
    CHECK(back->momentum == f->momentum);
    CHECK(back->adam_m.empty());
  }
  // A gradient-mode state: its Adam moments are pieces too, momentum empty.
  fragment_state adam = state(2, 0, 3, 7);
  adam.adam_m = adam.momentum;
  adam.adam_v = adam.theta;
  adam.momentum.clear();
  adam.adam_steps = 9;
  REQUIRE(s->commit(job_of({adam})));
  auto back = s->read_fragment(2, 0);
  REQUIRE(back);
  CHECK(back->theta == adam.theta);
  CHECK(back->momentum.empty());
  CHECK(back->adam_m == adam.adam_m);
  CHECK(back->adam_v == adam.adam_v);
  CHECK(back->adam_steps == 9);
  check_consistent(*s);
  auto head = s->latest_manifest().value().value();
  CHECK(head.find(1)->state_bytes == 128);
  CHECK(s->retained_bytes() == 32 + 128 + 84);
}

TEST_CASE("snapshot store: a missing, misplaced or damaged piece, or a head larger than the model, is corrupt_data") {
  auto kv = std::shared_ptr<kv_store>(make_memory_kv());
  auto s = *snapshot_store::create(kv, test_info(), {}, write_tuning{4, 1 << 20, 1 << 20});
  REQUIRE(s->commit(job_of({state(0, 0, 1, 10)})));  // pieces 0-2 theta (4, 4, 2 floats), 3-5 momentum
  REQUIRE(s->read_fragment(0, 0));
  const std::string key = be32(0) + be64(0);
  std::vector<std::pair<std::string, std::string>> saved;
  REQUIRE(kv->scan(column::pieces, {}, {}, [&](std::string_view k, std::string_view v) {
    saved.emplace_back(k, v);
    return true;
  }));
  REQUIRE(saved.size() == 6);
  auto damaged = [&](const std::function<void(write_batch&)>& damage, const std::string& expected) {
    CAPTURE(expected);
    write_batch b;
    damage(b);
    REQUIRE(kv->write(b));
    auto f = s->read_fragment(0, 0);
    REQUIRE_FALSE(f);
    CHECK(f.err().code == errc::corrupt_data);
    CHECK(f.err().message.find(expected) != std::string::npos);
    write_batch repair;
    for (const auto& [k, v] : saved) repair.put(column::pieces, k, v);
    REQUIRE(kv->write(repair));
    REQUIRE(s->read_fragment(0, 0));
  };
  damaged([&](write_batch& b) { b.del(column::pieces, key + be32(1)); }, "not the piece its head describes");
  damaged([&](write_batch& b) { b.del(column::pieces, key + be32(5)); }, "piece 5 is missing");
  damaged([&](write_batch& b) {
    std::vector<float> four(4, 1.f);
    b.put(column::pieces, key + be32(1), encode_piece_record(0, 0, 2, 0, 4, four));  // piece 2's header at index 1
  }, "not the piece its head describes");
  damaged([&](write_batch& b) {
    std::string v = kv->get(column::pieces, key + be32(1)).value().value();
    v[v.size() / 2] ^= 1;
    b.put(column::pieces, key + be32(1), v);
  }, "checksum mismatch");

  // A head claiming more floats than the model has is refused before anything is allocated.
  auto kv2 = std::shared_ptr<kv_store>(make_memory_kv());
  store_info tiny = test_info();
  tiny.param_floats = 8;
  auto t = *snapshot_store::create(kv2, tiny, {}, write_tuning{4, 1 << 20, 1 << 20});
  REQUIRE(t->commit(job_of({state(0, 0, 1, 10)})));
  auto f = t->read_fragment(0, 0);
  REQUIRE_FALSE(f);
  CHECK(f.err().message.find("the model has 8") != std::string::npos);
}

TEST_CASE("snapshot store: recovery removes the pieces of commits that never completed") {
  auto kv = std::shared_ptr<kv_store>(make_memory_kv());
  const write_tuning tuning{4, 64, 1 << 20};
  auto s = *snapshot_store::create(kv, test_info(), {}, tuning);
  REQUIRE(s->commit(job_of({state(0, 0, 1, 8), state(1, 0, 2, 8)})));
  REQUIRE(s->commit(job_of({state(0, 1, 3, 8)})));
  const std::size_t committed = count_keys(*kv, column::pieces);
  CHECK(committed == 3 * 4);
  // A crash after a commit's pieces were written and before its batch: version 1 of
  // fragment 1 has pieces and no head; and pieces of a fragment this store never held.
  write_batch debris;
  for (std::uint32_t i = 0; i < 4; ++i)
    debris.put(column::pieces, be32(1) + be64(1) + be32(i),
               encode_piece_record(1, 1, i, static_cast<std::uint8_t>(i / 2), (i % 2) * 4, std::vector<float>(4, 2.f)));
  debris.put(column::pieces, be32(7) + be64(0) + be32(0), "x");
  REQUIRE(kv->write_unlogged(debris));
  auto restarted = *snapshot_store::open(kv, {}, tuning);
  auto head = restarted->recover();
  REQUIRE(head);
  CHECK((*head)->mesh_version == 2);
  CHECK(count_keys(*kv, column::pieces) == committed);
  check_consistent(*restarted);
  REQUIRE(restarted->commit(job_of({state(1, 1, 4, 8)})).value() == 3);
  check_consistent(*restarted);
}

TEST_CASE("snapshot store: retention in bytes drops the oldest kept snapshots, whatever kept them") {
  auto kv = std::shared_ptr<kv_store>(make_memory_kv());
  // Each state is 2 × 16 floats = 128 bytes; at most 5 of them.
  store_info info = test_info();
  info.param_floats = 400;  // the last state below has 400 floats
  auto s = *snapshot_store::create(kv, info, {100, 2, 5 * 128}, write_tuning{8, 1 << 20, 1 << 20});
  REQUIRE(s->commit(job_of({state(0, 0, 1), state(1, 0, 2)})));
  for (std::uint64_t v = 1; v <= 12; ++v) {
    REQUIRE(s->commit(job_of({state(v % 2, v, 100 + v)})));
    CHECK(s->retained_bytes() <= 5 * 128);
  }
  std::set<std::uint64_t> kept;
  for (const auto& m : manifests_of(*s)) kept.insert(m.mesh_version);
  // Manifests 10..13 name five states: (0, 8), (1, 9), (0, 10), (1, 11), (0, 12); version 1
  // and the even ones keep_every pinned are gone.
  CHECK(kept == std::set<std::uint64_t>{10, 11, 12, 13});
  std::set<std::pair<std::uint32_t, std::uint64_t>> named;
  for (const auto& m : manifests_of(*s))
    for (const auto& e : m.entries) named.insert({e.fragment, e.version});
  auto stored = s->fragment_versions();
  REQUIRE(stored);
  CHECK(std::set<std::pair<std::uint32_t, std::uint64_t>>(stored->begin(), stored->end()) == named);
  CHECK(count_keys(*kv, column::pieces) == 4 * named.size());  // two of 8 floats per part
  check_consistent(*s);
  // One state larger than the bound: the newest manifest stays all the same.
  REQUIRE(s->commit(job_of({state(0, 13, 7, 400)})));
  kept.clear();
  for (const auto& m : manifests_of(*s)) kept.insert(m.mesh_version);
  CHECK(kept == std::set<std::uint64_t>{14});
  check_consistent(*s);
}

TEST_CASE("snapshot store: a format 1 store is read as it is and raised to format 2 by its first commit") {
  auto kv = std::shared_ptr<kv_store>(make_memory_kv());
  store_info old = test_info();
  old.format = 1;
  const fragment_state a = state(0, 0, 1), b = state(1, 0, 2);
  manifest m;
  m.mesh_version = 1;
  m.mesh_hash = old.mesh_hash;
  for (const fragment_state* f : {&a, &b})
    m.entries.push_back({f->fragment, f->version, f->round, checksum64(f->theta.data(), f->theta.size() * 4), 0});
  write_batch v1;  // as a format 1 build wrote it: floats inline
  v1.put(column::meta, "store", encode_record(old));
  v1.put(column::fragments, be32(0) + be64(0), encode_record(a));
  v1.put(column::fragments, be32(1) + be64(0), encode_record(b));
  v1.put(column::manifests, be64(1), encode_record(m));
  REQUIRE(kv->write(v1));

  auto s = snapshot_store::open(kv);
  REQUIRE(s);
  CHECK((*s)->info().format == 1);
  auto back = (*s)->read_fragment(1, 0);
  REQUIRE(back);
  CHECK(back->theta == b.theta);
  REQUIRE((*s)->commit(job_of({state(0, 1, 3)})).value() == 2);
  CHECK((*s)->info().format == 2);
  CHECK(snapshot_store::open(kv).value()->info().format == 2);
  check_consistent(**s);

  // A format this build does not know is refused, naming it.
  store_info future = test_info();
  future.format = 3;
  write_batch b3;
  b3.put(column::meta, "store", encode_record(future));
  auto kv3 = std::shared_ptr<kv_store>(make_memory_kv());
  REQUIRE(kv3->write(b3));
  auto refused = snapshot_store::open(kv3);
  REQUIRE_FALSE(refused);
  CHECK(refused.err().code == errc::unsupported);
  CHECK(refused.err().message.find("store format version 3 (written by a newer build); this build reads versions 1 to 2") !=
        std::string::npos);
}

namespace {

/// Holds every write until released: the writer's queue fills behind it.
class gated_kv final : public kv_store {
 public:
  explicit gated_kv(std::shared_ptr<kv_store> inner) : inner_(std::move(inner)) {}
  status write(const write_batch& batch) override { return hold([&] { return inner_->write(batch); }); }
  status write_unlogged(const write_batch& batch) override {
    return hold([&] { return inner_->write_unlogged(batch); });
  }
  template <class Fn>
  status hold(Fn&& write) {
    std::unique_lock lock(mutex_);
    ++waiting_;
    changed_.notify_all();
    changed_.wait(lock, [&] { return open_; });
    --waiting_;
    lock.unlock();
    return write();
  }
  expected<std::optional<std::string>> get(column c, std::string_view key) const override { return inner_->get(c, key); }
  status scan(column c, std::string_view from, std::string_view to,
              const std::function<bool(std::string_view, std::string_view)>& visit) const override {
    return inner_->scan(c, from, to, visit);
  }
  expected<std::optional<std::pair<std::string, std::string>>> last(column c) const override { return inner_->last(c); }
  status flush() override { return inner_->flush(); }
  status flush_memtables() override { return inner_->flush_memtables(); }
  void wait_for_writer() {
    std::unique_lock lock(mutex_);
    changed_.wait(lock, [&] { return waiting_ > 0; });
  }
  void open() {
    std::lock_guard lock(mutex_);
    open_ = true;
    changed_.notify_all();
  }

 private:
  std::shared_ptr<kv_store> inner_;
  std::mutex mutex_;
  std::condition_variable changed_;
  int waiting_ = 0;
  bool open_ = false;
};

}  // namespace

TEST_CASE("snapshot writer: never blocks the caller, a full queue refuses, jobs queued together share a manifest") {
  auto inner = std::shared_ptr<kv_store>(make_memory_kv());
  REQUIRE(snapshot_store::create(inner, test_info()));
  auto gate = std::make_shared<gated_kv>(inner);
  auto store = *snapshot_store::open(gate);
  const std::size_t job_bytes = 256 + 2 * 16 * 4;
  snapshot_writer writer(store, archipelago::test_logging::test_log(), writer_options{3 * job_bytes + 10});
  std::vector<std::uint64_t> versions;
  std::mutex versions_mutex;
  auto done = [&](const expected<std::uint64_t>& v) {
    std::lock_guard lock(versions_mutex);
    versions.push_back(v ? *v : 0);
  };
  REQUIRE(writer.submit(job_of({state(0, 0, 1)}), done));
  gate->wait_for_writer();  // the first job is being written, held at the gate
  REQUIRE(writer.submit(job_of({state(0, 1, 2)}), done));
  REQUIRE(writer.submit(job_of({state(0, 2, 3)}), done));
  const status refused = writer.submit(job_of({state(0, 3, 4)}), done);
  REQUIRE(!refused);
  CHECK(refused.err().code == errc::overloaded);
  gate->open();
  REQUIRE(writer.drain(std::chrono::seconds(10)));
  CHECK(writer.stats().refused == 1);
  CHECK(writer.stats().commits == 2);
  CHECK(versions == std::vector<std::uint64_t>{1, 2, 2});  // the two queued jobs became one batch
  auto head = store->latest_manifest();
  REQUIRE(head);
  CHECK((*head)->find(0)->version == 2);
  check_consistent(*store);
}

TEST_CASE("shard core: a core restored from its outer state continues bit for bit") {
  const param_layout layout = make_layout({256, 4, 8, 1, 2, true});
  const fragment_plan plan = *make_fragment_plan(layout, 4);
  std::vector<float> init(layout.total_floats);
  prng rng(5);
  for (auto& x : init) x = static_cast<float>(rng.normal());
  for (bool gradient : {false, true}) {
    CAPTURE(gradient);
    shard_config sc;
    sc.gradient_mode = gradient;
    sc.schedule_steps = 100;
    const fragment_index p{1};
    shard_core original(layout, plan, {p}, sc, init.data());
    auto contribute = [&](shard_core& core, std::uint64_t r) {
      prng d(100 + r);
      std::vector<float> delta(plan.fragments[1].floats);
      for (auto& x : delta) x = 0.01f * static_cast<float>(d.normal());
      REQUIRE(core.on_contribution(round_number{r}, p, {{1}, {1}}, 3, 300, delta) == contribution_verdict::buffered);
      REQUIRE(core.on_round_close(round_number{r}, p, {{{1}, {1}}}).value().has_value());
    };
    for (std::uint64_t r = 1; r <= 4; ++r) contribute(original, r);
    // A merge makes the next Θ in a buffer of its own: one handed out (to learners, to
    // a snapshot being written) stays as it was.
    const auto held = original.shared_value(p);
    const std::vector<float> was = *held;
    contribute(original, 5);
    CHECK(*held == was);
    CHECK(original.shared_value(p) != held);

    shard_core restored(layout, plan, {p}, sc, std::vector<float>(layout.total_floats, 0.f).data());
    REQUIRE(restored.restore(p, original.outer_state(p)));
    CHECK(restored.version(p) == 5);
    // Rounds up to the snapshot's count as closed.
    CHECK(restored.on_contribution(round_number{5}, p, {{2}, {1}}, 1, 10, std::vector<float>(plan.fragments[1].floats))
          == contribution_verdict::late);
    for (std::uint64_t r = 6; r <= 9; ++r) {
      contribute(original, r);
      contribute(restored, r);
    }
    CHECK(restored.value(p) == original.value(p));
    const auto a = original.outer_state(p), b = restored.outer_state(p);
    CHECK(*a.momentum == *b.momentum);
    CHECK(a.adam_m == b.adam_m);
    CHECK(a.adam_v == b.adam_v);
    CHECK(a.adam_steps == b.adam_steps);

    fragment_outer_state wrong = original.outer_state(p);
    std::vector<float> short_theta = *wrong.theta;
    short_theta.pop_back();
    wrong.theta = shared_floats(std::move(short_theta));
    CHECK(restored.restore(p, wrong).err().code == errc::invalid_input);
    // The core's values are shared, not copied; the restored core's buffer is its own.
    CHECK(original.outer_state(p).theta == original.shared_value(p));
    if (!gradient) CHECK(restored.outer_state(p).momentum != original.outer_state(p).momentum);
  }
}

TEST_CASE("shard core: beyond max_open_rounds the oldest buffered round is dropped, not the new one") {
  const param_layout layout = make_layout({256, 4, 8, 1, 2, true});
  const fragment_plan plan = *make_fragment_plan(layout, 4);
  const std::vector<float> init(layout.total_floats, 0.f);
  shard_config sc;
  sc.max_open_rounds = 3;
  shard_core core(layout, plan, {{0}}, sc, init.data());
  const std::vector<float> delta(plan.fragments[0].floats, 0.001f);
  for (std::uint64_t r = 10; r < 14; ++r)
    CHECK(core.on_contribution(round_number{r}, {0}, {{1}, {1}}, 1, 100, delta) == contribution_verdict::buffered);
  CHECK(core.ledger().unmerged == 1);
  CHECK(core.ledger().unmerged_tokens == 100);
  // Round 10 was dropped: its close merges nothing; round 13 merges.
  CHECK(!core.on_round_close(round_number{10}, {0}, {{{1}, {1}}}).value().has_value());
  CHECK(core.on_round_close(round_number{13}, {0}, {{{1}, {1}}}).value().has_value());
}
