// archipelago config: print the effective configuration, or every knob with its
// default, bound and meaning.

#include <cstdio>
#include <memory>

#include "cli_common.hpp"
#include "commands.hpp"

namespace archipelago::cli {
namespace {

struct config_cli {
  config_flags flags;
  bool knob_table = false;
  bool json = false;
};

const char* type_name(knob_type t) {
  switch (t) {
    case knob_type::integer: return "integer";
    case knob_type::real: return "real";
    case knob_type::boolean: return "boolean";
    case knob_type::text: return "string";
  }
  return "?";
}

int run_config(const config_cli& c) {
  auto cfg = c.flags.resolve();
  if (!cfg) return report(cfg.err());
  if (c.knob_table) {
    const config defaults;
    for (const auto& k : knobs())
      std::printf("%-26s %-8s default %-12s bound %s\n    %s\n", k.key.c_str(), type_name(k.type),
                  k.get(defaults).c_str(), k.bound.c_str(), k.help.c_str());
  } else {
    std::printf("%s", to_toml(*cfg).c_str());
  }
  if (c.json) {
    std::string entries;
    for (const auto& k : knobs()) {
      json_line e;
      e.add("key", k.key).add("type", type_name(k.type)).add("value", k.get(*cfg)).add("bound", k.bound);
      entries += (entries.empty() ? "" : ",") + e.str();
    }
    json_line j;
    j.add("command", "config").add_raw("knobs", "[" + entries + "]");
    std::printf("%s\n", j.str().c_str());
  }
  return exit_ok;
}

}  // namespace

runner add_config_command(CLI::App& app) {
  auto c = std::make_shared<config_cli>();
  CLI::App* cmd = app.add_subcommand("config", "Show the effective configuration or the knob table");
  c->flags.add_to(*cmd);
  cmd->add_flag("--knobs", c->knob_table, "List every knob with its default, bound and meaning");
  cmd->add_flag("--json", c->json, "Print a one-line JSON summary last");
  return [c](logger&) { return run_config(*c); };
}

}  // namespace archipelago::cli
