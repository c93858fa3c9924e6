// The bad-input battery: a raw ZeroMQ socket sends a live node everything a
// broken or hostile peer could. The node stays up, counts each kind, answers a
// version mismatch with an Error naming both versions, and what it accepted
// before is unaffected.

#include <doctest/doctest.h>

#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <sstream>
#include <thread>
#include <vector>
#include <zmq.hpp>

#include "../test_log.hpp"
#include "core/checksum.hpp"
#include "core/prng.hpp"
#include "transport/transport.hpp"

using namespace archipelago;
using namespace archipelago::transport;
using namespace std::chrono_literals;

namespace {

struct collected {
  std::mutex mutex;
  std::condition_variable changed;
  std::vector<std::shared_ptr<const inbound_message>> messages;

  template <class Pred>
  bool wait_for(Pred pred) {
    std::unique_lock<std::mutex> lock(mutex);
    return changed.wait_for(lock, 5s, [&] { return pred(); });
  }
};

std::vector<std::vector<std::uint8_t>> frames_of(const encoded_message& m) {
  std::vector<std::vector<std::uint8_t>> out;
  const auto* p = reinterpret_cast<const std::uint8_t*>(m.envelope.begin());
  out.emplace_back(p, p + m.envelope.size() * 8);
  for (const auto& t : m.tensors) out.push_back(t.copy());
  return out;
}

/// Re-computes the envelope frame's checksum trailer after a deliberate edit.
void reseal(std::vector<std::uint8_t>& envelope) {
  const std::size_t body = envelope.size() - 8;
  const std::uint64_t sum = checksum64(envelope.data(), body);
  std::memcpy(envelope.data() + body, &sum, 8);
}

void send_raw(zmq::socket_t& s, const std::vector<std::vector<std::uint8_t>>& frames) {
  for (std::size_t i = 0; i < frames.size(); ++i)
    s.send(zmq::buffer(frames[i]), i + 1 < frames.size() ? zmq::send_flags::sndmore : zmq::send_flags::none);
}

}  // namespace

TEST_CASE("bad-input battery against a live node") {
  steady_clock_source clock;
  collected got;
  transport_config cfg;
  cfg.self = {role::parameter_shard, 0};
  cfg.limits.max_tensor_bytes = 8 << 20;
  auto node = node_transport::start(cfg, clock, archipelago::test_logging::test_log(), [&](std::shared_ptr<const inbound_message> m) {
    std::lock_guard<std::mutex> lock(got.mutex);
    got.messages.push_back(std::move(m));
    got.changed.notify_all();
  });
  REQUIRE(node);
  const std::string endpoint = (*node)->endpoint();

  // A raw socket speaking for learner 4.
  zmq::context_t ctx(1);
  zmq::socket_t raw(ctx, zmq::socket_type::dealer);
  raw.set(zmq::sockopt::linger, 0);
  raw.set(zmq::sockopt::routing_id, "learner/4");
  raw.set(zmq::sockopt::rcvtimeo, 3000);
  raw.connect(endpoint);

  const node_address me{role::learner, 4};
  std::uint64_t seq = 0;
  auto contribution = [&](const std::vector<float>& values) {
    envelope_builder b(me, incarnation{1}, ++seq, 3);
    b.body().initContribution().setTokens(1000);
    const transport::shared_bytes bytes(std::vector<std::uint8_t>(
        reinterpret_cast<const std::uint8_t*>(values.data()),
        reinterpret_cast<const std::uint8_t*>(values.data() + values.size())));
    b.add_tensor("fragment/0", tensor_encoding::fp32, values.size(), 0, bytes);
    return frames_of(b.finish());
  };

  // 1. A good message first: accepted and kept.
  std::vector<float> good_values(1000);
  for (std::size_t i = 0; i < good_values.size(); ++i) good_values[i] = static_cast<float>(i);
  send_raw(raw, contribution(good_values));
  REQUIRE(got.wait_for([&] { return got.messages.size() == 1; }));
  const auto first = got.messages[0];

  // 2. The battery.
  const std::uint64_t seed = 4242;
  CAPTURE(seed);
  prng rng(seed);
  int sent_bad = 0;
  auto bad = [&](const std::vector<std::vector<std::uint8_t>>& frames) {
    send_raw(raw, frames);
    ++sent_bad;
  };
  {  // truncated envelope frame
    auto f = contribution(good_values);
    f[0].resize(f[0].size() / 2);
    bad(f);
  }
  for (int i = 0; i < 20; ++i) {  // random bytes of random lengths
    std::vector<std::uint8_t> junk(1 + rng.below(300));
    for (auto& b : junk) b = static_cast<std::uint8_t>(rng.below(256));
    bad({junk});
  }
  {  // tensor frame shorter than its descriptor
    auto f = contribution(good_values);
    f[1].resize(f[1].size() - 4);
    bad(f);
  }
  {  // a missing tensor frame
    auto f = contribution(good_values);
    f.pop_back();
    bad(f);
  }
  {  // bit flip in a tensor
    auto f = contribution(good_values);
    f[1][100] ^= 1;
    bad(f);
  }
  {  // unknown union tag: patch the discriminant of a Heartbeat (laid out as a Progress: four data
     // words, no pointers) and re-seal
    envelope_builder a(me, incarnation{1}, ++seq, 0);
    a.body().initHeartbeat();
    envelope_builder b(me, incarnation{1}, seq, 0);
    b.body().initProgress();
    auto fa = frames_of(a.finish()), fb = frames_of(b.finish());
    REQUIRE(fa[0].size() == fb[0].size());
    for (std::size_t i = 0; i + 8 < fa[0].size(); ++i)
      if (fa[0][i] != fb[0][i]) fa[0][i] = 200;
    reseal(fa[0]);
    bad(fa);
  }
  // 3. Wrong protocol version: the node answers with an Error naming both versions.
  {
    capnp::MallocMessageBuilder mb;
    auto root = mb.initRoot<wire::Envelope>();
    auto h = root.initHeader();
    h.setProtocolVersion(wire::PROTOCOL_VERSION + 7);
    set_address(h.initSender(), me);
    root.getBody().initHeartbeat();
    auto flat = capnp::messageToFlatArray(mb);
    std::vector<std::uint8_t> env(reinterpret_cast<const std::uint8_t*>(flat.begin()),
                                  reinterpret_cast<const std::uint8_t*>(flat.end()));
    env.resize(env.size() + 8);
    reseal(env);
    bad({env});
    zmq::message_t reply;
    REQUIRE(raw.recv(reply));
    auto r = decode_envelope({{static_cast<const std::uint8_t*>(reply.data()), reply.size()}});
    REQUIRE_MESSAGE(r.ok(), r.message());
    REQUIRE(r.value().body() == wire::Envelope::Body::ERROR);
    const std::string text = r.value().root().getBody().getError().getMessage().cStr();
    CHECK(text.find(std::to_string(wire::PROTOCOL_VERSION + 7)) != std::string::npos);
    CHECK(text.find(std::to_string(wire::PROTOCOL_VERSION)) != std::string::npos);
    CHECK(r.value().root().getBody().getError().getCode() == wire::ErrorCode::VERSION_MISMATCH);
  }
  // 4. A NaN payload is structurally valid: delivered, and refused when read.
  std::vector<float> nan_values(good_values);
  nan_values[17] = std::nanf("");
  send_raw(raw, contribution(nan_values));
  REQUIRE(got.wait_for([&] { return got.messages.size() == 2; }));
  std::vector<float> decoded(nan_values.size());
  auto nan_read = got.messages[1]->envelope->decode_tensor_values(0, decoded.data());
  REQUIRE_FALSE(nan_read);
  CHECK(nan_read.err().code == errc::corrupt_data);

  // 5. An oversized frame: ZeroMQ drops the connection (maxmsgsize), the node stays up.
  {
    zmq::socket_t big(ctx, zmq::socket_type::dealer);
    big.set(zmq::sockopt::linger, 0);
    big.connect(endpoint);
    std::vector<std::uint8_t> huge(16 << 20, 0);
    big.send(zmq::buffer(huge), zmq::send_flags::none);
    std::this_thread::sleep_for(200ms);
  }

  // 6. Everything bad was counted by reason; nothing bad was delivered.
  REQUIRE(got.wait_for([&] { return (*node)->counters().rejected_total() >= static_cast<std::uint64_t>(sent_bad); }));
  const auto c = (*node)->counters();
  auto rejected = [&](reject_reason r) { return c.rejected[static_cast<int>(r)]; };
  CHECK(rejected(reject_reason::tensor_length) >= 1);
  CHECK(rejected(reject_reason::tensor_count) >= 1);
  CHECK(rejected(reject_reason::tensor_checksum) >= 1);
  CHECK(rejected(reject_reason::unknown_body) >= 1);
  CHECK(rejected(reject_reason::version_mismatch) == 1);
  CHECK(rejected(reject_reason::envelope_checksum) + rejected(reject_reason::bad_envelope_size) >= 20);
  CHECK(c.rejected_total() == static_cast<std::uint64_t>(sent_bad));
  CHECK(got.messages.size() == 2);

  // 7. The node still works, and the first message is intact.
  std::vector<float> again(good_values.size());
  REQUIRE(first->envelope->decode_tensor_values(0, again.data()));
  CHECK(again == good_values);
  send_raw(raw, contribution(good_values));
  REQUIRE(got.wait_for([&] { return got.messages.size() == 3; }));
}

// A flood of malformed messages at a live node: every one is counted by reason,
// the log holds a bounded number of lines, and the node keeps serving. The
// node's logger runs on a manual clock, so the bound is exact: within one
// interval the kind "transport.rejected" writes its first `burst` lines (10),
// and once the interval is over one summary line counts the rest — 11 lines
// for 10,000 messages (burst + 1 per interval, whatever the traffic).
TEST_CASE("10,000 malformed messages at a live node: 11 log lines, and the node keeps serving") {
  steady_clock_source clock;
  manual_clock log_clock;
  std::ostringstream lines;
  log_options lo;
  lo.burst = 10;
  lo.interval_ns = 10'000'000'000;
  logger log(lo, log_clock, &lines);
  collected got;
  transport_config cfg;
  cfg.self = {role::parameter_shard, 0};
  auto node = node_transport::start(cfg, clock, log, [&](std::shared_ptr<const inbound_message> m) {
    std::lock_guard<std::mutex> lock(got.mutex);
    got.messages.push_back(std::move(m));
    got.changed.notify_all();
  });
  REQUIRE(node);
  zmq::context_t ctx(1);
  zmq::socket_t raw(ctx, zmq::socket_type::dealer);
  raw.set(zmq::sockopt::linger, 0);
  raw.set(zmq::sockopt::routing_id, "learner/4");
  raw.connect((*node)->endpoint());

  const std::uint64_t seed = 10000;
  CAPTURE(seed);
  prng rng(seed);
  constexpr int flood = 10000;
  for (int i = 0; i < flood; ++i) {  // random bytes: bad sizes and checksums, never a valid envelope
    std::vector<std::uint8_t> junk(8 + rng.below(200));
    for (auto& b : junk) b = static_cast<std::uint8_t>(rng.below(256));
    send_raw(raw, {junk});
  }
  const bool all_counted = [&] {
    for (int i = 0; i < 300; ++i) {  // at most 30 s
      if ((*node)->counters().rejected_total() >= static_cast<std::uint64_t>(flood)) return true;
      std::this_thread::sleep_for(100ms);
    }
    return false;
  }();
  REQUIRE(all_counted);
  CHECK((*node)->counters().rejected_total() == static_cast<std::uint64_t>(flood));
  CHECK(log.lines_written() == 10);
  CHECK(log.lines_suppressed() == static_cast<std::uint64_t>(flood - 10));
  log_clock.advance(lo.interval_ns);
  log.flush();
  CHECK(log.lines_written() == 11);

  // Still serving: a valid message from the same peer is delivered.
  std::vector<float> values(100, 0.5f);
  envelope_builder b({role::learner, 4}, incarnation{1}, 1, 3);
  b.body().initContribution().setTokens(1000);
  (void)b.add_tensor_values("fragment/0", values.data(), values.size(), tensor_encoding::fp32);
  send_raw(raw, frames_of(b.finish()));
  CHECK(got.wait_for([&] { return !got.messages.empty(); }));

  std::istringstream in(lines.str());
  std::vector<std::string> written;
  for (std::string line; std::getline(in, line);) written.push_back(line);
  REQUIRE(written.size() == 11);
  for (int i = 0; i < 10; ++i) CHECK(written[i].find("[transport.rejected] archipelago transport") != std::string::npos);
  CHECK(written[10].find("[transport.rejected] 9990 more line(s)") != std::string::npos);
}
