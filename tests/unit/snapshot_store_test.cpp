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
  job.fragments = std::move(states);
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
  for (std::uint64_t seed : {1, 2, 3, 4}) {
    CAPTURE(seed);
    auto inner = std::shared_ptr<kv_store>(make_memory_kv());
    auto faulty = std::make_shared<faulty_kv>(inner, fault_plan{seed, 0.15, 0.25, 0});
    auto s = *snapshot_store::create(inner, test_info(), {4, 7});
    REQUIRE(s->commit(job_of({state(0, 0, 1), state(1, 0, 2), state(2, 0, 3)})));
    auto store = *snapshot_store::open(faulty, {4, 7});  // it writes through the faults from here on
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
        auto restarted = *snapshot_store::open(inner, {4, 7});
        auto head = restarted->recover();
        REQUIRE(head);
        REQUIRE(head->has_value());
        CHECK((*head)->mesh_version == committed);
        for (const auto& e : (*head)->entries) CHECK(e.version == version[e.fragment]);
        check_consistent(*restarted);
        store = *snapshot_store::open(faulty, {4, 7});
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

/// Holds every write until released: the writer's queue fills behind it.
class gated_kv final : public kv_store {
 public:
  explicit gated_kv(std::shared_ptr<kv_store> inner) : inner_(std::move(inner)) {}
  status write(const write_batch& batch) override {
    std::unique_lock lock(mutex_);
    ++waiting_;
    changed_.notify_all();
    changed_.wait(lock, [&] { return open_; });
    --waiting_;
    lock.unlock();
    return inner_->write(batch);
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
    for (std::uint64_t r = 1; r <= 5; ++r) contribute(original, r);

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
    CHECK(a.momentum == b.momentum);
    CHECK(a.adam_m == b.adam_m);
    CHECK(a.adam_v == b.adam_v);
    CHECK(a.adam_steps == b.adam_steps);

    fragment_outer_state wrong = original.outer_state(p);
    wrong.theta.pop_back();
    CHECK(restored.restore(p, wrong).err().code == errc::invalid_input);
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
