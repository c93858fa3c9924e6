// archipelago set: change knobs of a running mesh (mesh.quorum, mesh.grace_factor,
// mesh.robust*) over the authenticated wire: a Reconfigure envelope from an admin
// key to the broker's tcp:// endpoint, answered with the first round under the new
// values (Ack) or why not (Error). The broker checks the change like a config file.

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "cli_common.hpp"
#include "commands.hpp"
#include "core/json_line.hpp"
#include "core/live_settings.hpp"
#include "transport/settings_wire.hpp"
#include "transport/transport.hpp"

namespace archipelago::cli {
namespace {

struct set_cli {
  config_flags flags;  // wire.curve, wire.allow (the broker's public key), ...
  std::string broker = "tcp://127.0.0.1:5555";
  std::string key_file;  // the admin's keypair (keygen --name admin)
  std::string reply = "tcp://127.0.0.1:0";
  std::vector<std::string> assignments;
  double timeout_s = 10;
  bool json = false;
};

struct answer {
  bool accepted = false;
  std::uint64_t first_round = 0;
  std::string message;
};

int run_set(const set_cli& o, logger& log) {
  std::vector<live_setting> changes;
  for (const std::string& a : o.assignments) {
    auto s = parse_live_assignment(a);
    if (!s) return report(s.err());
    changes.push_back(std::move(*s));
  }
  if (changes.empty()) return report(make_error(errc::invalid_input, "nothing to set: give KEY=VALUE (K=3 grace=1.5)"));
  // The change is checked here first, against the given config (the broker checks it again, against the values in force).
  auto cfg = o.flags.resolve();
  if (!cfg) return report(cfg.err());
  if (auto ok = apply_live_settings(*cfg, changes); !ok && ok.err().message.find("cannot change live") != std::string::npos)
    return report(ok.err());
  if (!o.key_file.empty()) cfg->wire.key_file = o.key_file;
  if (!o.broker.starts_with("tcp://") && !o.broker.starts_with("ipc://"))
    return report(make_error(errc::invalid_input, "--broker " + o.broker + ": expected tcp://HOST:PORT (the broker's endpoint)"));
  const node_address self{role::admin, 0};
  auto tc = transport::transport_config_from(*cfg, self, incarnation{static_cast<std::uint64_t>(wall_clock_ns())}, o.reply);
  if (!tc) return report(tc.err());
  std::mutex mu;
  std::condition_variable cv;
  std::optional<answer> got;
  steady_clock_source clock;
  auto t = transport::node_transport::start(*tc, clock, log, [&](std::shared_ptr<const transport::inbound_message> m) {
    const transport::decoded_envelope& env = *m->envelope;
    if (env.sender().kind != role::sync_broker) return;
    answer a;
    if (env.body() == wire::Envelope::Body::ACK) {
      a = {true, env.root().getBody().getAck().getSequence(), ""};
    } else if (env.body() == wire::Envelope::Body::ERROR) {
      a = {false, 0, env.root().getBody().getError().getMessage().cStr()};
    } else {
      return;
    }
    std::lock_guard<std::mutex> lock(mu);
    got = a;
    cv.notify_all();
  });
  if (!t) return report(t.err());
  const node_address broker{role::sync_broker, 0};
  if (auto ok = (*t)->add_peer(broker, o.broker); !ok) return report(ok.err());
  auto b = (*t)->make_envelope();
  auto rc = b.body().initReconfigure();
  transport::set_settings(rc.initSettings(static_cast<unsigned>(changes.size())), changes);
  rc.setReplyEndpoint((*t)->endpoint());
  if (auto ok = (*t)->send(broker, b.finish()); !ok) return report(ok.err());
  std::unique_lock<std::mutex> lock(mu);
  cv.wait_for(lock, std::chrono::duration<double>(o.timeout_s), [&] { return got.has_value(); });
  const std::string what = describe(changes);
  if (!got) {
    lock.unlock();
    return report(make_error(errc::timeout, "no answer from " + o.broker + " within " + std::to_string(o.timeout_s) +
                                                " s: is it the leading broker, and is this key (" +
                                                cfg->wire.key_file + ") on its wire.allow as admin?"));
  }
  const answer a = *got;
  lock.unlock();
  if (a.accepted) std::printf("set %s: from round %llu on\n", what.c_str(), static_cast<unsigned long long>(a.first_round));
  else std::printf("refused %s: %s\n", what.c_str(), a.message.c_str());
  if (o.json) {
    json_line j;
    j.add("command", "set").add("accepted", a.accepted).add("settings", what);
    if (a.accepted) j.add("first_round", a.first_round);
    else j.add("reason", a.message);
    std::printf("%s\n", j.str().c_str());
  }
  return a.accepted ? exit_ok : exit_failure;
}

}  // namespace

runner add_set_command(CLI::App& app) {
  auto o = std::make_shared<set_cli>();
  CLI::App* cmd = app.add_subcommand(
      "set", "Change knobs of a running mesh over the wire (mesh.quorum, mesh.grace_factor, mesh.robust*): K=3 grace=1.5");
  cmd->add_option("settings", o->assignments, "KEY=VALUE: K (mesh.quorum), grace (mesh.grace_factor), mesh.robust*")
      ->required();
  cmd->add_option("--broker", o->broker, "The leading broker's endpoint (as in the nodes' --broker list, or run --admin's), tcp://HOST:PORT")
      ->capture_default_str();
  cmd->add_option("--key", o->key_file, "The admin's keypair (archipelago keygen --name admin); its public key must be "
                                        "on the broker's wire.allow as admin");
  cmd->add_option("--reply", o->reply, "Where the broker answers: an endpoint of the host set runs on that the broker can reach "
                                    "(port 0: any)")
      ->capture_default_str();
  cmd->add_option("--timeout", o->timeout_s, "Seconds to wait for the broker's answer")->capture_default_str()
      ->check(CLI::Range(0.1, 3600.0));
  o->flags.add_to(*cmd);
  cmd->add_flag("--json", o->json, "Print a one-line JSON summary last");
  return [o](logger& log) { return run_set(*o, log); };
}

}  // namespace archipelago::cli
