// An insider cannot break the mesh: the roles' wire layers fed well-formed but
// forged envelopes, as a peer holding one valid learner key could send them (the
// transport's admission rule aside: these reach a role the way an admitted
// envelope does). Each case is a hole the code once had: a learner quitting on
// any peer's Error, epochs taken from anyone (and indexed unchecked), a Leave or an
// arrival notice obeyed from whoever sent it, endpoints dialled and stored
// unchecked, claims weighed by cumulative counts, Progress and incarnations
// without bound, a round that merged nothing left for its timeout.

#include <doctest/doctest.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "../test_log.hpp"
#include "core/config.hpp"
#include "core/mesh_setup.hpp"
#include "learner/learner_wire.hpp"
#include "parameter_shard/shard_wire.hpp"
#include "sync_broker/broker_election.hpp"
#include "sync_broker/broker_seat.hpp"
#include "sync_broker/broker_wire.hpp"
#include "transport/codec.hpp"
#include "transport/message_port.hpp"

using namespace archipelago;
using transport::decoded_envelope;
using transport::encoded_message;
using transport::envelope_builder;

namespace {

constexpr nanos ms = 1'000'000;
const node_address broker0 = broker_at(0);
const node_address shard0{role::parameter_shard, 0}, shard1{role::parameter_shard, 1};
const node_address learner0{role::learner, 0}, learner1{role::learner, 1};

/// A mesh of `learners` learners, two shards, the primary and `standbys` standbys, on
/// a small model cut into `fragments` fragments.
mesh_setup tiny_mesh(int fragments = 2, int standbys = 1, int learners = 2) {
  mesh_setup s;
  s.cfg.mesh.learners = learners;
  s.cfg.mesh.shards = 2;
  s.cfg.mesh.fragments = fragments;
  s.policy.fragments = fragments;
  s.policy.shards = 2;
  s.shape = model_shape{256, 4, 8, 1, 2, true};
  s.layout = make_layout(s.shape);
  s.plan = *make_fragment_plan(s.layout, fragments);
  s.shard_of_fragment = round_robin_shards(fragments, 2);
  s.broker_endpoint = "inproc://broker";
  for (int b = 1; b <= standbys; ++b) s.standby_endpoints.push_back("inproc://broker-" + std::to_string(b));
  s.shard_endpoints = {"inproc://shard-0", "inproc://shard-1"};
  for (int i = 0; i < learners; ++i) s.learner_endpoints.push_back("inproc://learner-" + std::to_string(i));
  return s;
}

std::vector<transport::frame_view> frames_of(const encoded_message& m) {
  std::vector<transport::frame_view> frames{
      {reinterpret_cast<const std::uint8_t*>(m.envelope.begin()), m.envelope.size() * sizeof(capnp::word)}};
  for (const auto& t : m.tensors) frames.push_back({t.data(), t.size()});
  return frames;
}

/// An envelope as a role receives it: its bytes and their decoded view.
struct received {
  explicit received(encoded_message m) : bytes(std::make_unique<encoded_message>(std::move(m))) {
    auto r = transport::decode_envelope(frames_of(*bytes));
    REQUIRE(r);
    view = r.take();
  }
  std::unique_ptr<encoded_message> bytes;
  std::unique_ptr<decoded_envelope> view;
  const decoded_envelope& operator*() const { return *view; }
};

/// What a wire layer sends and dials, kept for the test to read.
class recording_port final : public transport::message_port {
 public:
  explicit recording_port(node_address self) : self_(self) {}
  node_address self() const override { return self_; }
  const std::string& endpoint() const override { return endpoint_; }
  status add_peer(node_address peer, const std::string& endpoint) override {
    peers.emplace_back(peer, endpoint);
    return {};
  }
  envelope_builder make_envelope(std::uint64_t round) override {
    return envelope_builder(self_, incarnation{1}, ++sequence_, round, epoch_.get());
  }
  status send(node_address peer, encoded_message&& message) override { return broadcast({peer}, std::move(message)); }
  status broadcast(const std::vector<node_address>& to, encoded_message&& message) override {
    auto shared = std::make_shared<received>(std::move(message));
    for (node_address peer : to) sent.emplace_back(peer, shared);
    return {};
  }
  status set_link(node_address, const link_profile&) override { return {}; }
  const link_profile& default_link() const override { return link_; }
  std::uint64_t broker_epoch() const override { return epoch_.get(); }
  void raise_broker_epoch(std::uint64_t epoch) override { epoch_.raise(epoch); }

  /// The messages of `body` sent to `to`.
  std::vector<const decoded_envelope*> to(node_address peer, wire::Envelope::Body::Which body) const {
    std::vector<const decoded_envelope*> out;
    for (const auto& [p, m] : sent)
      if (p == peer && (**m).body() == body) out.push_back(m->view.get());
    return out;
  }
  bool dialled(const std::string& endpoint) const {
    for (const auto& [p, e] : peers)
      if (e == endpoint) return true;
    return false;
  }

  std::vector<std::pair<node_address, std::shared_ptr<received>>> sent;
  std::vector<std::pair<node_address, std::string>> peers;

 private:
  node_address self_;
  std::string endpoint_ = "inproc://under-test";
  link_profile link_;
  std::uint64_t sequence_ = 0;
  transport::broker_epoch_cell epoch_;
};

/// An envelope from `from` (incarnation `inc`) with header epoch `epoch`; `fill` sets its body.
template <class Fill>
received from(node_address sender, std::uint64_t epoch, Fill fill, std::uint64_t round = 0, std::uint64_t inc = 1) {
  static std::uint64_t sequence = 0;
  envelope_builder b(sender, incarnation{inc}, ++sequence, round, epoch);
  fill(b);
  return received(b.finish());
}

std::uint64_t primary_epoch(std::uint64_t inc = 1) { return broker_epoch_of(inc, 0); }

learner_wire make_learner(const mesh_setup& setup, recording_port& port, std::vector<float>& params) {
  params.assign(setup.layout.total_floats, 0.f);
  return learner_wire(setup, learner_settings(setup), 0, incarnation{1}, port, test_logging::test_log(),
                      learner_model_view{params.data(), nullptr, 64, 1});
}

std::unique_ptr<broker_wire> make_broker(const mesh_setup& setup, recording_port& port, nanos now = 0) {
  return std::make_unique<broker_wire>(setup, broker_settings(setup), incarnation{1}, port, test_logging::test_log(),
                                       nullptr, broker_start{}, now);
}

received join(node_address learner, const mesh_setup& setup, const std::string& endpoint, std::uint64_t inc = 1) {
  return from(learner, 0, [&](envelope_builder& b) {
    auto j = b.body().initJoin();
    j.setLayoutFingerprint(setup.layout.fingerprint());
    j.setConfigHash(mesh_agreement_hash(setup.cfg));
    j.setEndpoint(endpoint);
  }, 0, inc);
}

received progress(node_address learner, std::uint64_t steps, std::uint64_t tokens, nanos step_ns,
                  std::uint64_t inc = 1) {
  return from(learner, 0, [&](envelope_builder& b) {
    auto p = b.body().initProgress();
    p.setStep(steps);
    p.setTokens(tokens);
    p.setStepTimeNs(static_cast<std::uint64_t>(step_ns));
  }, 0, inc);
}

/// A shard's arrival notice for `learner`'s contribution to round `round` of fragment `p`.
received notice(node_address sender, std::uint64_t round, std::uint32_t p, std::uint32_t learner, std::uint64_t steps,
                std::uint64_t tokens, std::uint64_t step, wire::Verdict verdict, std::uint64_t epoch) {
  return from(sender, epoch, [&](envelope_builder& b) {
    auto c = b.body().initContribution();
    c.setFragment(p);
    c.setSteps(steps);
    c.setTokens(tokens);
    c.setLearner(learner);
    c.setLearnerIncarnation(1);
    c.setStep(step);
    c.setVerdict(verdict);
    c.setBrokerEpoch(epoch);
  }, round);
}

}  // namespace

TEST_CASE("forged: a learner quits only on the leading broker's meshMismatch") {
  const mesh_setup setup = tiny_mesh();
  recording_port port(learner0);
  std::vector<float> params;
  learner_wire wire = make_learner(setup, port, params);
  wire.start();
  auto mismatch = [](envelope_builder& b) {
    auto e = b.body().initError();
    e.setCode(wire::ErrorCode::MESH_MISMATCH);
    e.setMessage("you are refused");
  };
  // A shard, another learner's key, a standby that does not lead: none of them ends it.
  CHECK_FALSE(wire.on_message(*from(shard0, 0, mismatch), 0).refused);
  CHECK_FALSE(wire.on_message(*from(learner1, 0, mismatch), 0).refused);
  CHECK_FALSE(wire.on_message(*from(broker_at(1), primary_epoch(), mismatch), 0).refused);
  CHECK(wire.status().refusal.empty());
  // The leading broker's does.
  CHECK(wire.on_message(*from(broker0, primary_epoch(), mismatch), 0).refused);
}

TEST_CASE("forged: only a broker's header moves a node's epoch, and one naming no broker of the mesh is refused") {
  const mesh_setup setup = tiny_mesh();  // brokers 0 and 1
  const std::uint64_t not_in_mesh = (std::uint64_t{1} << 40) << 8 | 7;  // broker/7 of a mesh of two
  const std::uint64_t near_top = ~std::uint64_t{0} - 0xff;                // broker/0, an incarnation out of range
  auto heartbeat = [](envelope_builder& b) { b.body().initHeartbeat(); };

  recording_port lport(learner0);
  std::vector<float> params;
  learner_wire learner = make_learner(setup, lport, params);
  learner.start();
  // A shard's or a learner's header moves nothing, whatever it says.
  CHECK_NOTHROW(learner.on_message(*from(shard0, not_in_mesh, heartbeat), 0));
  CHECK_NOTHROW(learner.on_message(*from(shard0, primary_epoch(50), heartbeat), 0));
  CHECK(lport.broker_epoch() == 0);
  // A broker's epoch that cannot exist is refused, never indexed.
  CHECK_NOTHROW(learner.on_message(*from(broker_at(1), not_in_mesh, heartbeat), 0));
  CHECK_NOTHROW(learner.on_message(*from(broker0, near_top, heartbeat), 0));
  CHECK(lport.broker_epoch() == 0);
  // A real one is followed.
  learner.on_message(*from(broker0, primary_epoch(3), heartbeat), 0);
  CHECK(lport.broker_epoch() == primary_epoch(3));

  recording_port sport(shard0);
  std::vector<float> initial(setup.layout.total_floats, 0.f);
  shard_wire shard(setup, 0, incarnation{1}, sport, test_logging::test_log(), nullptr, shard_settings(setup),
                   initial.data());
  shard.start();
  auto leave = [](envelope_builder& b) { b.body().initLeave().setReason("x"); };
  CHECK_NOTHROW(shard.on_message(*from(learner1, not_in_mesh, leave), 0));
  CHECK_NOTHROW(shard.on_message(*from(learner1, primary_epoch(50), leave), 0));
  CHECK_NOTHROW(shard.on_message(*from(broker_at(1), not_in_mesh, leave), 0));
  CHECK(sport.broker_epoch() == 0);
}

TEST_CASE("forged: a learner's or a shard's header does not depose the leading broker") {
  const mesh_setup setup = tiny_mesh(2, 0);  // no standby: the broker leads at once
  recording_port port(broker0);
  broker_seat seat(setup, broker_settings(setup), incarnation{1}, 0, port, test_logging::test_log(), nullptr,
                   [] { return broker_start{}; }, 0);
  REQUIRE(seat.leading() != nullptr);
  const std::uint64_t newer = primary_epoch(1000);  // broker/0 in a later incarnation: can exist
  seat.on_message(*join(learner0, setup, "inproc://learner-0"), 1 * ms);
  seat.on_message(*from(learner0, newer, [](envelope_builder& b) { b.body().initProgress().setStep(1); }), 2 * ms);
  seat.on_message(*from(shard0, newer, [](envelope_builder& b) { b.body().initJoin(); }), 3 * ms);
  seat.tick(4 * ms);
  CHECK(seat.leading() != nullptr);
  CHECK(port.broker_epoch() == primary_epoch(1));
}

TEST_CASE("forged: an epoch near 2^64 cannot wrap the epoch a standby would lead in") {
  broker_election e({1, 2, 1'000'000'000, 3'000'000'000}, 5, 0);
  e.on_epoch(~std::uint64_t{0} - 0xff, 0);  // broker/0, an incarnation no broker has
  CHECK(e.epoch_to_lead() > e.epoch());
  e.on_epoch(broker_epoch_of(7, 0), 0);
  CHECK(e.epoch() == broker_epoch_of(7, 0));
  CHECK(e.epoch_to_lead() == broker_epoch_of(8, 1));
}

TEST_CASE("forged: only a learner leaves, and only as itself") {
  const mesh_setup setup = tiny_mesh();
  recording_port port(broker0);
  auto wire = make_broker(setup, port);
  wire->start(0);
  wire->on_message(*join(learner0, setup, "inproc://learner-0"), 1 * ms);
  auto leave = [](envelope_builder& b) { b.body().initLeave().setReason("forged"); };
  wire->on_message(*from(shard0, 0, leave), 2 * ms);          // shard/0's key: not learner/0
  wire->on_message(*from({role::admin, 0}, 0, leave), 3 * ms);
  CHECK_FALSE(wire->core().has_departed(learner_index{0}));
  wire->on_message(*from(learner0, 0, leave), 4 * ms);
  CHECK(wire->core().has_departed(learner_index{0}));
}

TEST_CASE("forged: an arrival notice counts only from the shard that owns its fragment") {
  const mesh_setup setup = tiny_mesh();  // fragment 0 on shard 0, fragment 1 on shard 1
  recording_port port(broker0);
  auto wire = make_broker(setup, port);
  wire->start(0);
  wire->on_message(*join(learner0, setup, "inproc://learner-0"), 1 * ms);
  wire->on_message(*progress(learner0, 5, 5 * 64, 10 * ms), 2 * ms);
  // Learner 1 books learner 0's work as rejected, or the wrong shard does.
  wire->on_message(*notice(learner1, 0, 0, 0, 5, 320, 5, wire::Verdict::REJECTED, 0), 3 * ms);
  wire->on_message(*notice(shard1, 0, 0, 0, 5, 320, 5, wire::Verdict::REJECTED, 0), 4 * ms);
  CHECK(wire->ledger().totals().rejected == 0);
  CHECK(wire->ledger().totals().processed == 5 * 64);
}

TEST_CASE("forged: a Join's endpoint is checked before it is dialled or kept") {
  const mesh_setup setup = tiny_mesh();
  recording_port port(broker0);
  auto wire = make_broker(setup, port);
  wire->start(0);
  for (const char* bad : {"x", "tcp://127.0.0.1:99999", "tcp://*:7000", "ipc:///tmp/a", ""}) {
    wire->on_message(*join(learner0, setup, bad), 1 * ms);
    CHECK_FALSE(port.dialled(bad));
  }
  CHECK(port.to(learner0, wire::Envelope::Body::WELCOME).empty());  // no member until a good one
  wire->on_message(*join(learner0, setup, "tcp://127.0.0.1:7100"), 2 * ms);
  CHECK(port.dialled("tcp://127.0.0.1:7100"));
  CHECK(port.to(learner0, wire::Envelope::Body::WELCOME).size() == 1);
}

TEST_CASE("forged: a FetchFragment's and a Reconfigure's reply endpoints are checked before they are dialled") {
  const mesh_setup setup = tiny_mesh();
  recording_port sport(shard0);
  std::vector<float> initial(setup.layout.total_floats, 0.f);
  shard_wire shard(setup, 0, incarnation{1}, sport, test_logging::test_log(), nullptr, shard_settings(setup),
                   initial.data());
  shard.start();
  auto fetch = [](const char* endpoint) {
    return [endpoint](envelope_builder& b) {
      auto f = b.body().initFetchFragment();
      f.setFragment(0);
      f.setReplyEndpoint(endpoint);
    };
  };
  shard.on_message(*from(learner1, 0, fetch("tcp://127.0.0.1:99999")), 0);
  CHECK_FALSE(sport.dialled("tcp://127.0.0.1:99999"));
  CHECK(sport.to(learner1, wire::Envelope::Body::FRAGMENT_UPDATE).empty());
  shard.on_message(*from(learner1, 0, fetch("inproc://learner-1")), 0);
  CHECK(sport.dialled("inproc://learner-1"));

  recording_port bport(broker0);
  auto wire = make_broker(setup, bport);
  wire->start(0);
  wire->on_message(*from({role::admin, 0}, 0, [](envelope_builder& b) {
    auto r = b.body().initReconfigure();
    r.setReplyEndpoint("tcp://[::1:7000");
    auto s = r.initSettings(1);
    s[0].setKey("mesh.grace_factor");
    s[0].setValue("0.5");
  }), 1 * ms);
  CHECK_FALSE(bport.dialled("tcp://[::1:7000"));
  CHECK(wire->live_config().mesh.grace_factor == setup.cfg.mesh.grace_factor);  // not made: nobody to answer
}

TEST_CASE("forged: a claim of work merged before weighs only its new steps") {
  mesh_setup setup = tiny_mesh(1, 0, 1);  // one fragment (shard 0), one learner
  setup.policy.rounds_in_flight = 1;
  setup.cfg.mesh.rounds_in_flight = 1;
  recording_port port(broker0);
  auto wire = make_broker(setup, port);
  wire->start(0);
  const std::uint64_t tokens_per_step = static_cast<std::uint64_t>(learner_profile_of(setup.cfg, 0).batch) *
                                        static_cast<std::uint64_t>(setup.shape.context);
  const std::uint64_t epoch = primary_epoch(1);
  nanos t = 1 * ms;
  wire->on_message(*join(learner0, setup, "inproc://learner-0"), t);
  auto round_opened = [&](std::size_t n) {
    for (int i = 0; i < 100 && port.to(learner0, wire::Envelope::Body::ROUND_OPEN).size() < n; ++i)
      wire->tick(t += 10 * ms);
    const auto opens = port.to(learner0, wire::Envelope::Body::ROUND_OPEN);
    REQUIRE(opens.size() >= n);
    return opens[n - 1]->header().getRound();
  };
  // Its first contribution: 10 steps since its anchor, merged and published.
  wire->on_message(*progress(learner0, 10, 10 * tokens_per_step, 10 * ms), t);
  const std::uint64_t r0 = round_opened(1);
  wire->on_message(*notice(shard0, r0, 0, 0, 10, 10 * tokens_per_step, 10, wire::Verdict::BUFFERED, epoch), t);
  REQUIRE(port.to(shard0, wire::Envelope::Body::ROUND_CLOSE).size() == 1);
  wire->on_message(*from(shard0, epoch, [](envelope_builder& b) {
    auto u = b.body().initFragmentUpdate();
    u.setFragment(0);
    u.setVersion(1);
    u.setCommitted(true);
  }, r0), t);
  // The next claims all 20 steps since the same anchor: 10 of them were merged already.
  wire->on_message(*progress(learner0, 20, 20 * tokens_per_step, 10 * ms), t);
  const std::uint64_t r1 = round_opened(2);
  wire->on_message(*notice(shard0, r1, 0, 0, 20, 20 * tokens_per_step, 20, wire::Verdict::BUFFERED, epoch), t);
  const auto closes = port.to(shard0, wire::Envelope::Body::ROUND_CLOSE);
  REQUIRE(closes.size() == 2);
  const auto member = closes[1]->root().getBody().getRoundClose().getMembers()[0];
  const double new_work = 10.0 * static_cast<double>(tokens_per_step);
  CHECK(member.getWeight() == doctest::Approx(new_work * new_work / 10.0));  // tokens² / steps of its 10 new steps
}

TEST_CASE("forged: Progress beyond the fastest plausible step rate is cut, and the ledger stays bounded") {
  const mesh_setup setup = tiny_mesh();  // mesh.max_step_rate: its default
  recording_port port(broker0);
  const nanos start = 100'000 * ms;  // long after the broker began to lead: a new learner gets a join's allowance
  auto wire = make_broker(setup, port, 0);
  wire->start(0);
  wire->on_message(*join(learner0, setup, "inproc://learner-0"), start);
  wire->on_message(*progress(learner0, 4'000'000, 4'000'000 * 64, 10 * ms), start + 1 * ms);
  const double bound = setup.cfg.mesh.max_step_rate * 2.001 + 1;  // 2 s of steps, and the 1 ms since
  CHECK(static_cast<double>(wire->ledger().totals().steps) <= bound);
  // Honest Progress, at the pace time allows, is counted in full (the lie's steps with it: Progress is cumulative).
  wire->on_message(*progress(learner0, 5000, 5000 * 64, 10 * ms), start + 10'000 * ms);
  CHECK(wire->ledger().totals().processed == 5000 * 64);

  // A learner that restarts without end: its incarnations' records stay bounded.
  for (std::uint64_t inc = 2; inc < 200; ++inc) {
    const nanos t = start + 10'000 * ms + static_cast<nanos>(inc) * ms;
    wire->on_message(*join(learner1, setup, "inproc://learner-1", inc), t);
    wire->on_message(*progress(learner1, 3, 3 * 64, 10 * ms, inc), t);
  }
  std::size_t incarnations = 0;
  for (const auto& [who, totals] : wire->ledger().per_learner()) incarnations += who.learner.value == 1;
  CHECK(incarnations <= 17);
  CHECK(wire->ledger().totals().processed == 5000 * 64 + 198 * 3 * 64);  // every step still counted
}

TEST_CASE("forged: a round that merges nothing is announced to the broker at once") {
  const mesh_setup setup = tiny_mesh(1, 0, 1);
  recording_port port(shard0);
  std::vector<float> initial(setup.layout.total_floats, 0.f);
  shard_wire shard(setup, 0, incarnation{1}, port, test_logging::test_log(), nullptr, shard_settings(setup),
                   initial.data());
  shard.start();
  const std::uint64_t epoch = primary_epoch(1);
  std::vector<float> delta(setup.plan.fragments[0].floats, 0.01f);
  shard.on_message(*from(learner0, 0, [&](envelope_builder& b) {
    auto c = b.body().initContribution();
    c.setFragment(0);
    c.setSteps(5);
    c.setTokens(5000);
    c.setStep(5);
    c.setBrokerEpoch(epoch);
    REQUIRE(b.add_tensor_values("delta/0", delta.data(), delta.size(), tensor_encoding::fp32));
  }, 0), 0);
  // The broker bounds its claim below what it claims: the shard rejects it, and merges nothing.
  shard.on_message(*from(broker0, epoch, [](envelope_builder& b) {
    auto c = b.body().initRoundClose();
    c.setFragment(0);
    auto m = c.initMembers(1);
    m[0].setLearner(0);
    m[0].setIncarnation(1);
    m[0].setWeight(1);
    m[0].setTokens(100);
    m[0].setSteps(5);
  }, 0), 1 * ms);
  CHECK(shard.core().version(fragment_index{0}) == 0);
  CHECK(port.to(broker0, wire::Envelope::Body::FRAGMENT_UPDATE).size() == 1);
  // The same close again (a duplicate the network let through): answered once only.
  shard.on_message(*from(broker0, epoch, [](envelope_builder& b) {
    auto c = b.body().initRoundClose();
    c.setFragment(0);
    auto m = c.initMembers(1);
    m[0].setLearner(0);
    m[0].setIncarnation(1);
    m[0].setWeight(1);
    m[0].setTokens(100);
    m[0].setSteps(5);
  }, 0), 2 * ms);
  CHECK(port.to(broker0, wire::Envelope::Body::FRAGMENT_UPDATE).size() == 1);
}
