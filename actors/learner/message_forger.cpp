#include "learner/message_forger.hpp"

#include <string>
#include <vector>

namespace archipelago {
namespace {

/// Endpoints a node must refuse (transport/endpoint.hpp), each for a reason of its own.
const std::vector<std::string>& bad_endpoints() {
  static const std::vector<std::string> all = {
      "x", "", "tcp://127.0.0.1:99999", "tcp://127.0.0.1:0", "tcp://*:7000", "tcp://" + std::string(300, 'a') + ":1",
      "ipc:///tmp/archipelago", "tcp://a;b:1", "inproc://", "tcp://[::1:7000", "tcp://host name:1", "udp://1.2.3.4:5"};
  return all;
}

}  // namespace

void message_forger::send(transport::message_port& port, node_address to, transport::encoded_message&& m) {
  ++sent_;
  (void)port.send(to, std::move(m));
}

void message_forger::forge(forgery kind, const mesh_setup& setup, node_address self, incarnation inc,
                           std::uint64_t epoch, std::uint64_t steps, std::uint64_t tokens,
                           transport::message_port& port) {
  const std::uint64_t turn = turn_++;
  const node_address leader = epoch == 0 ? broker_address : broker_at(leader_of_epoch(epoch));
  const fragment_index p{0};
  const node_address owner{role::parameter_shard, setup.shard_of_fragment[p.value]};
  const node_address other{role::learner, static_cast<std::uint32_t>((self.index + 1) % std::max(1, setup.cfg.mesh.learners))};
  switch (kind) {
    case forgery::none: return;
    case forgery::epoch: {
      const std::uint64_t forged[] = {0,
                                      epoch >= 256 ? epoch - 256 : 0,
                                      epoch,
                                      (epoch & ~std::uint64_t{0xff}) | (setup.brokers() & 0xff),
                                      ~std::uint64_t{0} - 0xff,
                                      ((epoch >> 8) + 1) << 8};
      const std::uint64_t e = forged[turn % std::size(forged)];
      auto b = port.make_envelope();
      b.header().setBrokerEpoch(e);
      auto progress = b.body().initProgress();  // its honest figures: only the epoch is forged
      progress.setStep(steps);
      progress.setTokens(tokens);
      progress.setStepTimeNs(~std::uint64_t{0});  // no step time: the broker's pace is not touched
      send(port, leader, b.finish());
      for (std::uint32_t s = 0; s < setup.shard_endpoints.size(); ++s) {
        auto h = port.make_envelope();
        h.header().setBrokerEpoch(e);
        h.body().initHeartbeat();
        send(port, {role::parameter_shard, s}, h.finish());
      }
      return;
    }
    case forgery::sender: {
      auto as = [&](node_address claimed) {
        return transport::envelope_builder(claimed, inc, ++sequence_, 0, epoch);
      };
      {
        auto b = as(leader);
        auto c = b.body().initRoundClose();
        c.setFragment(p.value);
        auto m = c.initMembers(1);
        m[0].setLearner(self.index);
        m[0].setIncarnation(inc.value);
        m[0].setWeight(1e9);
        send(port, owner, b.finish());
      }
      {
        auto b = as(leader);
        b.body().initWelcome().setFragments(static_cast<std::uint32_t>(setup.fragments()));
        send(port, owner, b.finish());
      }
      {
        auto b = as(owner);
        auto u = b.body().initFragmentUpdate();
        u.setFragment(p.value);
        u.setVersion(1'000'000);
        u.setCommitted(true);
        send(port, leader, b.finish());
      }
      {
        auto b = as(owner);
        auto n = b.body().initContribution();
        n.setFragment(p.value);
        n.setSteps(1);
        n.setTokens(1'000'000'000);
        n.setLearner(self.index);
        n.setLearnerIncarnation(inc.value);
        n.setStep(steps);
        send(port, leader, b.finish());
      }
      {
        auto b = as(other);
        auto progress = b.body().initProgress();
        progress.setStep(1'000'000'000);
        progress.setTokens(1'000'000'000'000);
        send(port, leader, b.finish());
      }
      {
        auto b = as(other);
        b.body().initLeave().setReason("forged sender (attacker drill)");
        send(port, leader, b.finish());
      }
      {
        auto b = as({role::chaos_monkey, 0});
        auto c = b.body().initChaosCommand();
        c.setKind(wire::ChaosKind::SLOW_DOWN);
        c.setFactor(1000);
        transport::set_address(c.initTarget(), leader);
        send(port, leader, b.finish());
      }
      {
        auto b = as({role::admin, 0});
        auto s = b.body().initReconfigure().initSettings(1);
        s[0].setKey("mesh.quorum");
        s[0].setValue("1");
        send(port, leader, b.finish());
      }
      return;
    }
    case forgery::notice:
      for (const node_address named : {other, self}) {
        for (const wire::Verdict verdict : {wire::Verdict::BUFFERED, wire::Verdict::REJECTED}) {
          auto b = port.make_envelope(turn);
          auto n = b.body().initContribution();
          n.setFragment(p.value);
          n.setSteps(steps + 1);
          n.setTokens(1'000'000'000);
          n.setLearner(named.index);
          n.setLearnerIncarnation(named == self ? inc.value : 1);
          n.setStep(steps);
          n.setVerdict(verdict);
          send(port, leader, b.finish());
        }
      }
      return;
    case forgery::endpoint: {
      const std::string& endpoint = bad_endpoints()[turn % bad_endpoints().size()];
      auto b = port.make_envelope();
      auto j = b.body().initJoin();
      j.setLayoutFingerprint(setup.layout.fingerprint());
      j.setConfigHash(mesh_agreement_hash(setup.cfg));
      j.setEndpoint(endpoint);
      send(port, leader, b.finish());
      for (std::uint32_t s = 0; s < setup.shard_endpoints.size(); ++s) {
        const std::vector<fragment_index> owned = setup.fragments_of(s);
        if (owned.empty()) continue;
        auto f = port.make_envelope();
        auto fetch = f.body().initFetchFragment();
        fetch.setFragment(owned.front().value);
        fetch.setReplyEndpoint(endpoint);
        send(port, {role::parameter_shard, s}, f.finish());
      }
      return;
    }
  }
}

}  // namespace archipelago
