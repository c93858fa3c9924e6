// archipelago config: print the effective configuration, every knob with its
// default, bound and meaning, or the model presets.

#include <cstdio>
#include <memory>

#include "cli_common.hpp"
#include "commands.hpp"
#include "core/layout.hpp"

namespace archipelago::cli {
namespace {

struct config_cli {
  config_flags flags;
  std::string for_command;  // "": the knobs' own defaults; "run": run_defaults()
  bool knob_table = false;
  bool presets = false;
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

// Every knob: its default (the command's when --for names one), and `run`'s where that differs.
void print_knobs(const config& defaults, bool for_run) {
  const config run = run_defaults();
  for (const auto& k : knobs()) {
    std::string value = k.get(defaults);
    if (!for_run && k.get(run) != value) value += " (run: " + k.get(run) + ")";
    std::printf("%-26s %-8s default %-12s bound %s\n    %s\n", k.key.c_str(), type_name(k.type), value.c_str(),
                k.bound.c_str(), k.help.c_str());
  }
}

std::string knobs_json(const config& cfg, const config& defaults) {
  const config run = run_defaults();
  std::string entries;
  for (const auto& k : knobs()) {
    json_line e;
    e.add("key", k.key).add("type", type_name(k.type)).add("value", k.get(cfg)).add("default", k.get(defaults));
    if (k.get(run) != k.get(config{})) e.add("run_default", k.get(run));
    e.add("bound", k.bound).add("help", k.help);
    entries += (entries.empty() ? "" : ",") + e.str();
  }
  return "[" + entries + "]";
}

// The model presets: shape and parameter count of each.
int print_presets(bool json) {
  std::string entries;
  std::printf("%-8s %6s %6s %4s %4s %14s\n", "size", "T", "C", "L", "H", "parameters");
  for (const auto& name : model_preset_names()) {
    auto shape = model_preset(name);
    if (!shape) return report(shape.err());
    const auto params = make_layout(*shape).param_count;
    std::printf("%-8s %6d %6d %4d %4d %14llu\n", name.c_str(), shape->context, shape->d_model, shape->n_layer,
                shape->n_head, static_cast<unsigned long long>(params));
    json_line e;
    e.add("size", name)
        .add("context", static_cast<std::int64_t>(shape->context))
        .add("d_model", static_cast<std::int64_t>(shape->d_model))
        .add("n_layer", static_cast<std::int64_t>(shape->n_layer))
        .add("n_head", static_cast<std::int64_t>(shape->n_head))
        .add("parameters", static_cast<std::int64_t>(params));
    entries += (entries.empty() ? "" : ",") + e.str();
  }
  if (json) {
    json_line j;
    j.add("command", "config").add_raw("presets", "[" + entries + "]");
    std::printf("%s\n", j.str().c_str());
  }
  return exit_ok;
}

int run_config(const config_cli& c) {
  if (c.presets) return print_presets(c.json);
  const bool for_run = c.for_command == "run";
  const config defaults = for_run ? run_defaults() : config{};
  auto cfg = c.flags.resolve(defaults);
  if (!cfg) return report(cfg.err());
  if (c.knob_table) print_knobs(defaults, for_run);
  else std::printf("%s", to_toml(*cfg).c_str());
  if (c.json) {
    json_line j;
    j.add("command", "config").add_raw("knobs", knobs_json(*cfg, defaults));
    std::printf("%s\n", j.str().c_str());
  }
  return exit_ok;
}

}  // namespace

runner add_config_command(CLI::App& app) {
  auto c = std::make_shared<config_cli>();
  CLI::App* cmd = app.add_subcommand("config", "Show the effective configuration, the knob table or the model presets");
  c->flags.add_to(*cmd);
  cmd->add_option("--for", c->for_command,
                  "Start from this command's defaults: run (the embedded default job: train.steps = 1500)")
      ->check(CLI::IsMember({"run"}));
  cmd->add_flag("--knobs", c->knob_table, "List every knob with its default, bound and meaning");
  cmd->add_flag("--presets", c->presets, "List the model presets (model.size): shape and parameters");
  cmd->add_flag("--json", c->json, "Print a one-line JSON summary last");
  return [c](logger&) { return run_config(*c); };
}

}  // namespace archipelago::cli
