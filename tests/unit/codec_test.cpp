// The envelope codec: round trips for every body and every tensor encoding, and
// the rejection of everything a broken or hostile peer could send.

#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "core/prng.hpp"
#include "core/checksum.hpp"
#include "core/mesh_setup.hpp"
#include "transport/codec.hpp"
#include "transport/transport.hpp"

using namespace archipelago;
using namespace archipelago::transport;

namespace {

/// Owns the bytes of a multipart message, like received ZeroMQ frames.
struct owned_message {
  std::vector<std::vector<std::uint8_t>> frames;

  explicit owned_message(const encoded_message& m) {
    const auto* p = reinterpret_cast<const std::uint8_t*>(m.envelope.begin());
    frames.emplace_back(p, p + m.envelope.size() * sizeof(capnp::word));
    for (const auto& t : m.tensors) frames.push_back(t.copy());
  }
  std::vector<frame_view> views() const {
    std::vector<frame_view> v;
    for (const auto& f : frames) v.push_back({f.data(), f.size()});
    return v;
  }
};

const node_address learner3{role::learner, 3};

encoded_message heartbeat_message(std::uint64_t seq = 1) {
  envelope_builder b(learner3, incarnation{7}, seq, 0);
  b.body().initHeartbeat().setStepsDone(42);
  return b.finish();
}

decode_result decode(const owned_message& m) { return decode_envelope(m.views()); }

}  // namespace

TEST_CASE("every body round-trips with its header") {
  using Body = wire::Envelope::Body;
  for (int tag = 0; tag <= static_cast<int>(Body::RECONFIGURE); ++tag) {
    CAPTURE(tag);
    envelope_builder b(learner3, incarnation{9}, 100 + tag, 55, broker_epoch_of(9, 1));
    auto body = b.body();
    switch (static_cast<Body::Which>(tag)) {
      case Body::JOIN: body.initJoin().setEndpoint("tcp://127.0.0.1:7000"); break;
      case Body::WELCOME: {
        auto w = body.initWelcome();
        w.setFragments(24);
        auto shards = w.initShards(1);
        shards[0].setEndpoint("tcp://shard");
        shards[0].initFragments(2).set(1, 17);
        break;
      }
      case Body::HEARTBEAT: body.initHeartbeat().setStepsDone(5); break;
      case Body::LEAVE: body.initLeave().setReason("drain"); break;
      case Body::PROGRESS: body.initProgress().setStep(12); break;
      case Body::ROUND_OPEN: body.initRoundOpen().setFragment(3); break;
      case Body::CONTRIBUTION: body.initContribution().setTokens(2048); break;
      case Body::ROUND_CLOSE: {
        auto c = body.initRoundClose();
        c.setReason(wire::CloseReason::GRACE_EXPIRED);
        c.initMembers(2)[1].setWeight(0.5);
        break;
      }
      case Body::FRAGMENT_UPDATE: body.initFragmentUpdate().setVersion(8); break;
      case Body::FETCH_FRAGMENT: body.initFetchFragment().setFragment(6); break;
      case Body::CHAOS_COMMAND: body.initChaosCommand().initLink().setLoss(0.25); break;
      case Body::ERROR: body.initError().setMessage("nope"); break;
      case Body::ACK: body.initAck().setSequence(99); break;
      case Body::BROKER_STATE: {
        auto st = body.initBrokerState();
        st.setRoundsLeased(512);
        const kj::byte record[] = {1, 2, 3};
        st.initTape(1).set(0, kj::arrayPtr(record, 3));
        break;
      }
      case Body::RECONFIGURE: {
        auto rc = body.initReconfigure();
        auto s = rc.initSettings(1);
        s[0].setKey("mesh.quorum");
        s[0].setValue("3");
        rc.setReplyEndpoint("tcp://127.0.0.1:7001");
        break;
      }
    }
    owned_message m(b.finish());
    auto r = decode(m);
    REQUIRE_MESSAGE(r.ok(), r.message());
    const auto& env = r.value();
    CHECK(static_cast<int>(env.body()) == tag);
    CHECK(env.sender() == learner3);
    CHECK(env.header().getIncarnation() == 9);
    CHECK(env.header().getSequence() == static_cast<std::uint64_t>(100 + tag));
    CHECK(env.header().getRound() == 55);
    CHECK(env.header().getBrokerEpoch() == broker_epoch_of(9, 1));
    auto rb = env.root().getBody();
    switch (static_cast<Body::Which>(tag)) {
      case Body::JOIN: CHECK(std::string(rb.getJoin().getEndpoint().cStr()) == "tcp://127.0.0.1:7000"); break;
      case Body::WELCOME: CHECK(rb.getWelcome().getShards()[0].getFragments()[1] == 17); break;
      case Body::HEARTBEAT: CHECK(rb.getHeartbeat().getStepsDone() == 5); break;
      case Body::LEAVE: CHECK(std::string(rb.getLeave().getReason().cStr()) == "drain"); break;
      case Body::PROGRESS: CHECK(rb.getProgress().getStep() == 12); break;
      case Body::ROUND_OPEN: CHECK(rb.getRoundOpen().getFragment() == 3); break;
      case Body::CONTRIBUTION: CHECK(rb.getContribution().getTokens() == 2048); break;
      case Body::ROUND_CLOSE: CHECK(rb.getRoundClose().getMembers()[1].getWeight() == 0.5); break;
      case Body::FRAGMENT_UPDATE: CHECK(rb.getFragmentUpdate().getVersion() == 8); break;
      case Body::FETCH_FRAGMENT: CHECK(rb.getFetchFragment().getFragment() == 6); break;
      case Body::CHAOS_COMMAND: CHECK(rb.getChaosCommand().getLink().getLoss() == 0.25); break;
      case Body::ERROR: CHECK(std::string(rb.getError().getMessage().cStr()) == "nope"); break;
      case Body::ACK: CHECK(rb.getAck().getSequence() == 99); break;
      case Body::BROKER_STATE:
        CHECK(rb.getBrokerState().getRoundsLeased() == 512);
        CHECK(rb.getBrokerState().getTape()[0].size() == 3);
        break;
      case Body::RECONFIGURE:
        CHECK(std::string(rb.getReconfigure().getSettings()[0].getValue().cStr()) == "3");
        CHECK(std::string(rb.getReconfigure().getReplyEndpoint().cStr()) == "tcp://127.0.0.1:7001");
        break;
    }
  }
}

TEST_CASE("tensors of every encoding travel as checked extra frames") {
  const std::uint64_t seed = 31;
  CAPTURE(seed);
  prng rng(seed);
  std::vector<float> values(1000);
  for (auto& v : values) v = static_cast<float>(rng.normal());
  for (auto enc : {tensor_encoding::fp32, tensor_encoding::bf16, tensor_encoding::int8,
                   tensor_encoding::int4, tensor_encoding::int2}) {
    CAPTURE(to_string(enc));
    envelope_builder b(learner3, incarnation{1}, 1, 4);
    b.body().initContribution().setFragment(2);
    REQUIRE(b.add_tensor_values("fragment/2", values.data(), values.size(), enc, 64));
    REQUIRE(b.add_tensor_values("empty", values.data(), 0, enc, 64));
    owned_message m(b.finish());
    REQUIRE(m.frames.size() == 3);
    auto r = decode(m);
    REQUIRE_MESSAGE(r.ok(), r.message());
    REQUIRE(r.value().tensor_count() == 2);
    CHECK(std::string(r.value().tensor_info(0).getName().cStr()) == "fragment/2");
    std::vector<float> out(values.size());
    REQUIRE(r.value().decode_tensor_values(0, out.data()));
    double max_err = 0;
    for (std::size_t i = 0; i < values.size(); ++i) max_err = std::max(max_err, double(std::abs(out[i] - values[i])));
    if (enc == tensor_encoding::fp32) CHECK(max_err == 0);
    else CHECK(max_err < 4.0);  // per-encoding bounds are tested in tensor_encoding_test
  }
}

TEST_CASE("an fp32 frame added with add_fp32 is the caller's buffer itself, kept alive by the message") {
  auto values = std::make_shared<std::vector<float>>(1000);
  for (std::size_t i = 0; i < values->size(); ++i) (*values)[i] = 0.25f * static_cast<float>(i);
  const std::vector<float> expected = *values;
  const auto* at = reinterpret_cast<const std::uint8_t*>(values->data());
  envelope_builder b(learner3, incarnation{1}, 1, 0);
  b.body().initFragmentUpdate().setFragment(2);
  b.add_fp32("fragment/2", std::move(values));
  const encoded_message m = b.finish();
  REQUIRE(m.tensors.size() == 1);
  CHECK(m.tensors[0].data() == at);  // no copy
  CHECK(m.tensors[0].size() == expected.size() * sizeof(float));
  const owned_message frames(m);  // outlives the decoded views
  auto r = decode(frames);
  REQUIRE(r.ok());
  std::vector<float> out(expected.size());
  REQUIRE(r.value().decode_tensor_values(0, out.data()));
  CHECK(out == expected);
}

TEST_CASE("a misaligned envelope frame is copied, not rejected") {
  owned_message m(heartbeat_message());
  std::vector<std::uint8_t> shifted(m.frames[0].size() + 1);
  std::memcpy(shifted.data() + 1, m.frames[0].data(), m.frames[0].size());
  auto r = decode_envelope({{shifted.data() + 1, m.frames[0].size()}});
  REQUIRE_MESSAGE(r.ok(), r.message());
  CHECK(r.value().root().getBody().getHeartbeat().getStepsDone() == 42);
}

TEST_CASE("malformed messages are rejected with the reason") {
  SUBCASE("no frames") { CHECK(decode_envelope({}).reason() == reject_reason::no_frames); }
  SUBCASE("empty and odd-sized envelope frames") {
    std::vector<std::uint8_t> bytes(13, 0);
    CHECK(decode_envelope({{bytes.data(), 0}}).reason() == reject_reason::bad_envelope_size);
    CHECK(decode_envelope({{bytes.data(), 13}}).reason() == reject_reason::bad_envelope_size);
    CHECK(decode_envelope({{bytes.data(), 8}}).reason() == reject_reason::bad_envelope_size);
  }
  SUBCASE("a flipped bit anywhere in the envelope frame") {
    owned_message good(heartbeat_message());
    for (std::size_t bit = 0; bit < good.frames[0].size() * 8; bit += 5) {
      owned_message m = good;
      m.frames[0][bit / 8] ^= static_cast<std::uint8_t>(1u << (bit % 8));
      CHECK(decode(m).reason() == reject_reason::envelope_checksum);
    }
  }
  SUBCASE("oversized envelope frame") {
    std::vector<std::uint8_t> big(2 << 20, 0);
    CHECK(decode_envelope({{big.data(), big.size()}}).reason() == reject_reason::bad_envelope_size);
  }
  SUBCASE("truncated envelope") {
    owned_message m(heartbeat_message());
    m.frames[0].resize(m.frames[0].size() - 8);
    auto r = decode(m);
    CHECK_FALSE(r.ok());
    CHECK(r.reason() == reject_reason::envelope_checksum);
  }
  SUBCASE("random bytes never crash and are rejected or valid") {
    const std::uint64_t seed = 77;
    CAPTURE(seed);
    prng rng(seed);
    for (int i = 0; i < 2000; ++i) {
      std::vector<std::uint8_t> junk(8 * (1 + rng.below(32)));
      for (auto& b : junk) b = static_cast<std::uint8_t>(rng.below(256));
      auto r = decode_envelope({{junk.data(), junk.size()}});
      if (!r.ok()) CHECK(!r.message().empty());
    }
  }
  SUBCASE("wrong protocol version names both versions") {
    capnp::MallocMessageBuilder mb;
    auto root = mb.initRoot<wire::Envelope>();
    root.initHeader().setProtocolVersion(wire::PROTOCOL_VERSION + 1);
    root.getBody().initHeartbeat();
    auto flat = capnp::messageToFlatArray(mb);
    std::vector<std::uint8_t> frame(reinterpret_cast<const std::uint8_t*>(flat.begin()),
                                    reinterpret_cast<const std::uint8_t*>(flat.end()));
    const std::uint64_t sum = checksum64(frame.data(), frame.size());
    frame.insert(frame.end(), reinterpret_cast<const std::uint8_t*>(&sum),
                 reinterpret_cast<const std::uint8_t*>(&sum) + 8);
    auto r = decode_envelope({{frame.data(), frame.size()}});
    REQUIRE(r.reason() == reject_reason::version_mismatch);
    CHECK(r.peer_version() == wire::PROTOCOL_VERSION + 1);
    CHECK(r.message().find(std::to_string(wire::PROTOCOL_VERSION + 1)) != std::string::npos);
    CHECK(r.message().find(std::to_string(wire::PROTOCOL_VERSION)) != std::string::npos);
  }
  SUBCASE("unknown union tag") {
    // Heartbeat and Progress bodies are both four data words and no pointers, so
    // their empty encodings differ only in the union discriminant.
    envelope_builder a(learner3, incarnation{1}, 1, 0);
    a.body().initHeartbeat();
    envelope_builder b(learner3, incarnation{1}, 1, 0);
    b.body().initProgress();
    owned_message ma(a.finish()), mb(b.finish());
    REQUIRE(ma.frames[0].size() == mb.frames[0].size());
    std::size_t diffs = 0;
    for (std::size_t i = 0; i + 8 < ma.frames[0].size(); ++i)
      if (ma.frames[0][i] != mb.frames[0][i]) {
        ma.frames[0][i] = 200;
        ++diffs;
      }
    diffs += std::memcmp(ma.frames[0].data() + ma.frames[0].size() - 8,
                         mb.frames[0].data() + mb.frames[0].size() - 8, 8) != 0;
    REQUIRE(diffs == 2);  // the discriminant and the checksum word
    // Re-seal the patched message so the decoder gets past the checksum.
    const std::size_t body = ma.frames[0].size() - 8;
    const std::uint64_t sum = checksum64(ma.frames[0].data(), body);
    std::memcpy(ma.frames[0].data() + body, &sum, 8);
    CHECK(decode(ma).reason() == reject_reason::unknown_body);
  }
  SUBCASE("tensor frames that do not match their descriptors") {
    std::vector<float> v(256, 1.5f);
    envelope_builder b(learner3, incarnation{1}, 1, 0);
    b.body().initContribution();
    REQUIRE(b.add_tensor_values("t", v.data(), v.size(), tensor_encoding::fp32));
    owned_message good(b.finish());
    REQUIRE(decode(good).ok());

    owned_message missing = good;
    missing.frames.pop_back();
    CHECK(decode(missing).reason() == reject_reason::tensor_count);

    owned_message extra = good;
    extra.frames.push_back({1, 2, 3});
    CHECK(decode(extra).reason() == reject_reason::tensor_count);

    owned_message shorter = good;
    shorter.frames[1].resize(shorter.frames[1].size() - 4);
    CHECK(decode(shorter).reason() == reject_reason::tensor_length);

    owned_message flipped = good;
    flipped.frames[1][17] ^= 0x10;
    CHECK(decode(flipped).reason() == reject_reason::tensor_checksum);
  }
  SUBCASE("element count that does not fit the frame") {
    const shared_bytes bytes(std::vector<std::uint8_t>(40, 0));
    envelope_builder b(learner3, incarnation{1}, 1, 0);
    b.body().initContribution();
    b.add_tensor("t", tensor_encoding::fp32, 11, 0, bytes);  // 11 floats are 44 bytes, not 40
    CHECK(decode(owned_message(b.finish())).reason() == reject_reason::tensor_encoding);
  }
  SUBCASE("NaN in a payload is refused when the values are read") {
    std::vector<float> v(16, 0.f);
    v[5] = std::nanf("");
    envelope_builder b(learner3, incarnation{1}, 1, 0);
    b.body().initContribution();
    CHECK_FALSE(b.add_tensor_values("t", v.data(), v.size(), tensor_encoding::int8));
    // A peer that skips our encoder: raw fp32 bytes with a NaN, valid checksum.
    const shared_bytes raw(std::vector<std::uint8_t>(reinterpret_cast<const std::uint8_t*>(v.data()),
                                                     reinterpret_cast<const std::uint8_t*>(v.data() + v.size())));
    b.add_tensor("t", tensor_encoding::fp32, v.size(), 0, raw);
    owned_message m(b.finish());
    auto r = decode(m);
    REQUIRE(r.ok());
    std::vector<float> out(v.size());
    auto values = r.value().decode_tensor_values(0, out.data());
    REQUIRE_FALSE(values);
    CHECK(values.err().code == errc::corrupt_data);
  }
}

TEST_CASE("transport settings come from the wire and link knobs") {
  config cfg;
  REQUIRE(set_knob(cfg, "wire.heartbeat_interval_ms", "250"));
  REQUIRE(set_knob(cfg, "link.bandwidth_mbit", "100"));
  REQUIRE(set_knob(cfg, "link.latency_ms", "20"));
  REQUIRE(set_knob(cfg, "wire.curve", "false"));
  auto t = transport_config_from(cfg, {role::learner, 2}, incarnation{3}, "tcp://127.0.0.1:0");
  REQUIRE(t);
  CHECK(t->heartbeat.interval_ns == 250'000'000);
  CHECK(t->default_link.bandwidth_bytes_per_s == doctest::Approx(12.5e6));
  CHECK(t->default_link.latency_ns == 20'000'000);
  CHECK_FALSE(t->curve.enabled);

  REQUIRE(set_knob(cfg, "wire.curve", "true"));
  auto missing = transport_config_from(cfg, {role::learner, 2}, incarnation{3}, "tcp://127.0.0.1:0");
  REQUIRE_FALSE(missing);
  CHECK(missing.err().message.find("wire.key_file") != std::string::npos);
  // inproc endpoints stay inside the process and need no keys.
  CHECK(transport_config_from(cfg, {role::learner, 2}, incarnation{3}, "inproc://x"));
  CHECK_FALSE(set_knob(cfg, "wire.encoding", "fp8"));
}
