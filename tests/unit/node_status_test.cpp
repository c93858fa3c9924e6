// A node's status: its JSON (what GET /node serves and a drill across processes
// reads) round-trips exactly; malformed JSON is refused naming what is wrong;
// the status board keeps a restarted node's earlier incarnations' counts.

#include <doctest/doctest.h>

#include "core/node_status.hpp"

using namespace archipelago;

namespace {

node_status shard_status(std::uint64_t inc, std::uint64_t published) {
  node_status s;
  s.node = {role::parameter_shard, 1};
  s.incarnation = inc;
  s.counts.published = published;
  s.counts.rejected = 3;
  s.counts.bytes_sent = 1u << 20;
  s.counts.peers_lost = inc;  // one per incarnation: summed over a restart
  s.counts.control_rtt_max_ns = 1'000'000 * inc;  // a maximum: kept, not summed
  s.published_versions = {0, published, 0, published - 1};
  s.committed_versions = {0, published - 2, 0, published - 3};
  return s;
}

}  // namespace

TEST_CASE("node status: the JSON of a broker's status reads back to the same status") {
  node_status s;
  s.node = {role::sync_broker, 0};
  s.incarnation = 1'764'000'000'123;
  s.counts.rounds_closed = 812;
  s.counts.members = 2412;
  s.counts.committed = 800;
  s.counts.step_downs = 2;
  s.broker_epoch = 1'764'000'000'123ull << 8 | 1;
  broker_report r;
  r.started_ns = 42;
  r.broker_cpu_s = 0.25;
  r.ledger = {4096, 3072, 256, 256, 256, 256, 4, 0.4, 0.3};  // processed, merged, late, overwritten, lost, rejected
  r.learners.push_back({{{2}, incarnation{7}}, {2048, 1024, 256, 256, 256, 256, 2, 0.2, 0.1}, 100, 250, -1});
  r.fragment_ledger = {{2048, 1536, 128, 128, 128, 128, 4, 0.2, 0.15}, {2048, 1536, 128, 128, 128, 128, 4, 0.2, 0.15}};
  r.fragment_availability = {1.0, 0.5};
  r.uptime = 0.975;
  r.first_join_ns = 100;
  r.xi_step_ms = 12.5;
  r.closed_grace_expired = 5;
  r.round_latency_ms = {1.5, 2.5};
  s.report = r;
  auto back = node_status_from_json(to_json(s));
  REQUIRE(back.has_value());
  CHECK(back->node == s.node);
  CHECK(back->incarnation == s.incarnation);
  CHECK(back->counts.rounds_closed == 812);
  CHECK(back->counts.members == 2412);
  CHECK(back->counts.step_downs == 2);
  CHECK(back->broker_epoch == s.broker_epoch);
  REQUIRE(back->report.has_value());
  CHECK(back->report->ledger.merged == 3072);
  CHECK(back->report->ledger.balanced());
  REQUIRE(back->report->learners.size() == 1);
  CHECK(back->report->learners[0].who == learner_ref{{2}, incarnation{7}});
  CHECK(back->report->learners[0].first_merged_ns == 250);
  CHECK(back->report->learners[0].left_ns == -1);
  CHECK(back->report->uptime == doctest::Approx(0.975));
  REQUIRE(back->report->fragment_ledger.size() == 2);
  CHECK(back->report->fragment_ledger[1].overwritten == 128);
  CHECK(back->report->availability() == doctest::Approx(0.75));
  CHECK(back->report->round_latency_ms == std::vector<double>{1.5, 2.5});
  CHECK(to_json(*back) == to_json(s));
}

TEST_CASE("node status: a learner's and a shard's status round-trip, malformed ones are refused by name") {
  node_status l;
  l.node = {role::learner, 3};
  l.incarnation = 2;
  l.counts.steps = 17;
  l.counts.wait_ns = 123456789;
  l.left = true;
  l.refusal = "learner/3 refused: \"its model layout\" differs";
  l.schedule_step = 440;
  auto back = node_status_from_json(to_json(l));
  REQUIRE(back.has_value());
  CHECK(back->left);
  CHECK(back->refusal == l.refusal);
  CHECK(back->schedule_step == 440);
  CHECK(!back->report.has_value());
  CHECK(!back->eval.has_value());
  l.eval = global_eval{0.8125, 1.172, 400, {12, 9, 15}, 4};
  back = node_status_from_json(to_json(l));
  REQUIRE(back.has_value());
  REQUIRE(back->eval.has_value());
  CHECK(back->eval->loss == 0.8125);
  CHECK(back->eval->versions == std::vector<std::uint64_t>{12, 9, 15});
  CHECK(to_json(*back) == to_json(l));
  const node_status sh = shard_status(5, 90);
  CHECK(to_json(*node_status_from_json(to_json(sh))) == to_json(sh));

  CHECK_FALSE(node_status_from_json("[1, 2]").has_value());
  CHECK_FALSE(node_status_from_json("{\"role\":\"learner\"").has_value());
  auto unknown = node_status_from_json("{\"role\":\"oracle\",\"index\":0}");
  REQUIRE_FALSE(unknown.has_value());
  CHECK(unknown.err().message.find("oracle") != std::string::npos);
  std::string missing = to_json(sh);
  missing.replace(missing.find("\"published\""), 11, "\"publishhed\"");
  auto bad = node_status_from_json(missing);
  REQUIRE_FALSE(bad.has_value());
  CHECK(bad.err().code == errc::invalid_input);
  CHECK(bad.err().message.find("published") != std::string::npos);
}

TEST_CASE("status board: a restart keeps the earlier incarnation's counts, an older incarnation's word is ignored") {
  status_board board;
  board.update(shard_status(1, 40));
  board.update(shard_status(1, 55));  // the same incarnation, later: replaces
  board.update(shard_status(2, 10));  // restarted: 55 published before
  board.update(shard_status(1, 99));  // a late word of the dead incarnation
  auto e = board.find({role::parameter_shard, 1});
  REQUIRE(e.has_value());
  CHECK(e->now.incarnation == 2);
  CHECK(e->earlier.published == 55);
  CHECK(e->total().published == 65);
  CHECK(e->total().rejected == 6);
  CHECK(e->total().peers_lost == 3);
  CHECK(e->total().control_rtt_max_ns == 2'000'000);
  CHECK(board.total(role::parameter_shard).published == 65);
  CHECK(board.total(role::learner).steps == 0);

  node_status learner;
  learner.node = {role::learner, 0};
  learner.incarnation = 1;
  learner.counts.steps = 8;
  board.update(learner);
  CHECK(board.learners_left() == 0);
  learner.left = true;
  board.update(learner);
  CHECK(board.learners_left() == 1);
  // A status of the same incarnation taken before the current one, arriving after it
  // (two polls racing), changes nothing: the counts never go back.
  node_status earlier_poll = learner;
  earlier_poll.counts.steps = 7;
  earlier_poll.left = false;
  board.update(earlier_poll);
  CHECK(board.find({role::learner, 0})->now.counts.steps == 8);
  CHECK(board.learners_left() == 1);
  CHECK(board.total(role::learner).steps == 8);
  CHECK(board.entries().size() == 2);
  CHECK(board.entries().front().now.node.kind == role::learner);  // ordered by address
}

TEST_CASE("status board: the leading broker is the one of the newest epoch that says it leads") {
  status_board board;
  CHECK(!board.leading_broker());
  auto broker = [](std::uint32_t index, std::uint64_t epoch, bool leads) {
    node_status s;
    s.node = {role::sync_broker, index};
    s.incarnation = 1;
    s.broker_epoch = epoch;
    if (leads) s.report = broker_report{};
    return s;
  };
  board.update(broker(0, 0, false));  // the primary, listening before it leads
  board.update(broker(1, 0, false));  // a standby
  REQUIRE(board.leading_broker());
  CHECK(board.leading_broker()->now.node.index == 0);  // nobody leads yet: the primary's entry
  board.update(broker(0, 256, true));
  CHECK(board.leading_broker()->now.node.index == 0);
  board.update(broker(1, 513, true));  // took over; the primary, cut off, still believes it leads
  CHECK(board.leading_broker()->now.node.index == 1);
  board.update(broker(0, 513, false));  // it stepped down
  CHECK(board.leading_broker()->now.node.index == 1);
  CHECK(board.leading_broker()->now.broker_epoch == 513);
}
