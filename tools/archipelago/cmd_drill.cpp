// archipelago drill: run a fault plan against a mesh and report what happened.

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>

#include <unistd.h>

#include "cli_common.hpp"
#include "commands.hpp"
#include "core/refusals.hpp"
#include "report/drill_report.hpp"
#include "drill/drill.hpp"

namespace archipelago::cli {
namespace {

struct drill_flags {
  config_flags flags;
  std::string plan;
  std::vector<std::string> modes;
  std::string reference_mode;  // empty: each drill's own mode
  bool json = false, no_reference = false;
  bool processes = false;  // the mesh as separate `archipelago node` processes
  std::string binary;      // --processes: the archipelago executable the nodes run (default: this one)
  std::vector<std::string> learner_commands;  // --processes: "I=COMMAND", learner I's own program
  std::string report_dir = "drill-report";
  std::string work_dir;
  double time_scale = 1;
  double max_eval_gap = 0.03;
};

void print_report(const drill_report& r) {
  std::printf("\n== %s, mode %s%s: %d learners, %d shards, K = %d; compute budget %.0f ms per step (%llu overruns)\n",
              r.plan.c_str(), r.mode.c_str(), r.processes ? ", separate processes" : "", r.learners, r.shards, r.quorum,
              r.step_time_ms,
              static_cast<unsigned long long>(r.budget_overruns));
  std::printf("timeline (s):\n");
  for (const auto& f : r.faults) {
    std::printf("  %7.2f  %-58s", f.at_s, f.what.c_str());
    if (f.skipped) std::printf(" skipped (target down)");
    else if (f.repaired_s >= 0) std::printf(" repaired %7.2f", f.repaired_s);
    else if (f.what.starts_with("broker_host_lost")) std::printf(" never restarted  ");
    if (f.rejoin_s >= 0) std::printf("  back at work %.2f s later", f.rejoin_s);
    std::printf("\n");
  }
  const mesh_summary& s = r.run;
  const ledger_totals& l = s.broker.ledger;
  std::printf("faults: %zu injected, %zu skipped; %llu chaos commands (%llu not sent)\n", r.faults_injected,
              r.faults_skipped, static_cast<unsigned long long>(r.chaos_commands),
              static_cast<unsigned long long>(r.chaos_commands_failed));
  std::printf("rounds: %llu (%.2f/s), %llu versions; uptime %.1f %%; global downtime %.1f s (no new version for > %.0f s "
              "while >= K learners live); broker outage %.1f s\n",
              static_cast<unsigned long long>(s.rounds), s.wall_s > 0 ? s.rounds / s.wall_s : 0.0,
              static_cast<unsigned long long>(s.published), 100 * r.uptime, r.downtime_s, r.downtime_gap_s,
              r.broker_outage_s);
  if (r.standbys > 0 || r.epochs.size() > 1) {
    std::printf("brokers: %d standby(s); epochs on the tapes:", r.standbys);
    for (const drill_epoch& e : r.epochs)
      std::printf(" %llu (broker/%u, %llu merged rounds, %.2f-%.2f s)", static_cast<unsigned long long>(e.epoch), e.broker,
                  static_cast<unsigned long long>(e.rounds), e.first_closed_s, e.last_closed_s);
    std::printf("; merges by a deposed broker %llu, epochs interleaved %llu; step-downs per broker:",
                static_cast<unsigned long long>(r.deposed_merges), static_cast<unsigned long long>(r.epochs_interleaved));
    for (auto n : r.step_downs) std::printf(" %llu", static_cast<unsigned long long>(n));
    std::printf("\n");
    for (const drill_takeover& t : r.takeovers) {
      std::printf("takeover after fault %zu (%.2f s): broker/%u deposed; ", t.fault, t.at_s, t.deposed);
      if (t.broker < 0) std::printf("NOBODY took over");
      else std::printf("broker/%lld leads in epoch %llu, its first merged round %.2f s, a new version %.2f s after the fault",
                       static_cast<long long>(t.broker), static_cast<unsigned long long>(t.epoch), t.first_round_s, t.back_s);
      if (t.stepped_down_s >= 0) std::printf("; broker/%u stepped down %.2f s after the heal", t.deposed, t.stepped_down_s);
      std::printf(" (bound %.1f s)\n", r.takeover_bound_s);
    }
  }
  std::printf("fragment availability %.1f %% (mean over fragments; each fragment advancing, no gap over %.1f s):",
              100 * r.availability, r.fragment_gap_s);
  for (double a : r.fragment_availability) std::printf(" %.0f", 100 * a);
  std::printf("\n");
  std::printf("per learner, inner steps:");
  if (!r.samples.empty())
    for (auto n : r.samples.back().learner_steps) std::printf(" %llu", static_cast<unsigned long long>(n));
  std::printf("\n");
  std::printf("goodput %.1f %%", 100 * r.goodput);
  if (r.reference) std::printf(" (fault-free %s reference %.1f %%)", r.reference_mode.c_str(), 100 * r.reference_goodput);
  std::printf("; committed rounds lost: %llu\n", static_cast<unsigned long long>(r.committed_rounds_lost));
  std::printf("token ledger (token-shares per fragment): merged %llu, late %llu, overwritten %llu, lost %llu, rejected "
              "%llu = %llu processed; + %llu never reported by killed learners = %llu the learners processed (%s)\n",
              static_cast<unsigned long long>(l.merged), static_cast<unsigned long long>(l.late),
              static_cast<unsigned long long>(l.overwritten), static_cast<unsigned long long>(l.lost), static_cast<unsigned long long>(l.rejected),
              static_cast<unsigned long long>(l.processed), static_cast<unsigned long long>(r.unreported_tokens),
              static_cast<unsigned long long>(s.tokens), r.ledger_exact ? "exact" : "NOT EXACT");
  std::printf("participation %.1f %% (mean over %llu settled rounds of members merged / live learners)",
              100 * s.broker.participation, static_cast<unsigned long long>(s.broker.participation_rounds));
  if (r.min_participation > 0) std::printf("; the plan passes at >= %.0f %%", 100 * r.min_participation);
  std::printf("\n");
  std::printf("refused or cut, by reason (every node): %s\n", describe_refusals(s.refused).c_str());
  std::printf("eval loss %.4f nats/byte", s.eval_loss);
  if (r.reference)
    std::printf(" vs fault-free %s reference %.4f (%+.2f %%); tokens %.2f M and %.2f M", r.reference_mode.c_str(),
                r.reference->eval_loss, 100 * eval_gap(r), static_cast<double>(s.tokens) * 1e-6,
                static_cast<double>(r.reference->tokens) * 1e-6);
  std::printf("\n");
}

/// The properties a drill must show; each failure named.
std::vector<std::string> failed_checks(const drill_report& r, double max_eval_gap) {
  std::vector<std::string> out;
  if (r.downtime_s > 0) out.push_back("global downtime " + std::to_string(r.downtime_s) + " s");
  if (r.committed_rounds_lost > 0) out.push_back(std::to_string(r.committed_rounds_lost) + " committed versions lost");
  if (!r.ledger_exact) out.push_back("the ledger is not exact");
  if (r.deposed_merges > 0)
    out.push_back(std::to_string(r.deposed_merges) + " merged rounds of a deposed broker (a fragment version after one "
                  "of a newer epoch, or one version under two epochs)");
  if (r.epochs_interleaved > 0)
    out.push_back(std::to_string(r.epochs_interleaved) + " merged rounds of an epoch closed after a newer epoch's first");
  for (const drill_takeover& t : r.takeovers) {
    const std::string fault = "fault " + std::to_string(t.fault) + " took broker/" + std::to_string(t.deposed) + " away: ";
    if (t.broker < 0 || t.back_s < 0) out.push_back(fault + "no standby took over and published");
    else if (t.back_s > r.takeover_bound_s)
      out.push_back(fault + "the first version under broker/" + std::to_string(t.broker) + " came " +
                    std::to_string(t.back_s) + " s later, over the takeover bound of " + std::to_string(r.takeover_bound_s) + " s");
    const bool partition = r.faults.at(t.fault).what.starts_with("partition");
    if (partition && t.stepped_down_s < 0) out.push_back(fault + "it never stepped down after the heal");
  }
  if (r.run.broker.participation < r.min_participation)
    out.push_back("participation " + std::to_string(100 * r.run.broker.participation) + " % below the plan's " +
                  std::to_string(100 * r.min_participation) + " %");
  if (const double gap = eval_gap(r); std::isfinite(gap) && gap > max_eval_gap)
    out.push_back("eval loss " + std::to_string(100 * gap) + " % above the " + r.reference_mode + " reference");
  return out;
}

int run_drills(const drill_flags& o, logger& log) {
  std::ifstream in(o.plan);
  if (!in) return report_input(make_error(errc::not_found, "cannot read the plan " + o.plan));
  std::stringstream text;
  text << in.rdbuf();
  auto base = o.flags.resolve();  // the default mesh (4 learners of nano, 2 shards): what the plans are written for
  if (!base) return report(base.err());
  drill_options opts;
  opts.binary = o.binary;
  opts.plan_origin = std::filesystem::path(o.plan).filename().string();
  opts.plan_text = text.str();
  opts.reference = !o.no_reference;
  opts.reference_mode = o.reference_mode;
  if (!o.reference_mode.empty() && o.no_reference)
    return report_input(make_error(errc::invalid_input, "--reference-mode needs the reference run (drop --no-reference)"));
  opts.work_dir = o.work_dir;
  opts.time_scale = o.time_scale;
  std::vector<std::string> modes = o.modes.empty() ? std::vector<std::string>{base->mesh.mode} : o.modes;
  // Every mode's mesh and plan are checked before anything starts.
  std::vector<config> configs;
  for (const auto& mode : modes) {
    config cfg = *base;
    if (auto ok = set_knob(cfg, "mesh.mode", mode); !ok) return report(ok.err());
    if (auto ok = validate_mesh(cfg); !ok) return report(ok.err());
    if (auto plan = load_drill_plan(cfg, opts); !plan) return report_input(plan.err());
    if (auto reference = with_reference_mode(cfg, o.reference_mode); !reference) return report_input(reference.err());
    configs.push_back(cfg);
  }
  std::error_code ec;
  std::filesystem::create_directories(o.report_dir, ec);
  if (ec) return report(make_error(errc::io_error, "cannot create " + o.report_dir + ": " + ec.message()));

  if (o.processes && opts.binary.empty()) opts.binary = std::filesystem::read_symlink("/proc/self/exe", ec).string();
  if (o.processes && (opts.binary.empty() || ::access(opts.binary.c_str(), X_OK) != 0))
    return report_input(make_error(errc::invalid_input, "--binary: " + (opts.binary.empty() ? std::string("(none)") : opts.binary) +
                                                            " is not an executable archipelago"));
  if (!o.processes) opts.binary.clear();
  for (const std::string& lc : o.learner_commands) {
    const auto eq = lc.find('=');
    if (eq == std::string::npos || eq == 0 || eq > 6 || lc.find_first_not_of("0123456789") != eq ||
        lc.find_first_not_of(' ', eq + 1) == std::string::npos)
      return report_input(make_error(errc::invalid_input, "--learner-command '" + lc + "' is not INDEX=COMMAND"));
    const auto index = static_cast<std::uint32_t>(std::stoul(lc.substr(0, eq)));
    if (!o.processes)
      return report_input(make_error(errc::invalid_input, "--learner-command needs --processes (a learner of its own program)"));
    for (const auto& cfg : configs)
      if (static_cast<int>(index) >= cfg.mesh.learners)
        return report_input(make_error(errc::invalid_input, "--learner-command " + std::to_string(index) +
                                                                ": mesh.learners is " + std::to_string(cfg.mesh.learners)));
    opts.learner_commands[index] = lc.substr(eq + 1);
  }
  json_line own_learners;  // {"INDEX": "COMMAND"}: which learners ran a program of their own
  for (const auto& [index, command] : opts.learner_commands) {
    std::printf("learner %u runs: %s\n", index, command.c_str());
    own_learners.add(std::to_string(index), command);
  }
  install_stop_handlers();
  progress_line progress(log, 8);
  std::vector<drill_report> done;
  for (const auto& cfg : configs) {
    auto on_line = [&](const std::string& line) { progress.update(cfg.mesh.mode + " " + line); };
    auto stop = [] { return stop_requested.load(); };
    auto r = run_drill(cfg, log, opts, on_line, stop);
    progress.finish();
    if (!r) return report(r.err());
    print_report(*r);
    const std::string stem = std::filesystem::path(o.plan).stem().string() + "-" + r->mode;
    std::ofstream(std::filesystem::path(o.report_dir) / (stem + ".json")) << drill_report_json(*r) << "\n";
    done.push_back(std::move(*r));
    if (stop_requested) break;
  }
  const auto html = std::filesystem::path(o.report_dir) / (std::filesystem::path(o.plan).stem().string() + ".html");
  std::ofstream(html) << drill_report_html(done);
  std::printf("\nreport: %s (and one .json per mode beside it)\n", html.string().c_str());

  std::vector<std::string> failures;
  for (const auto& r : done)
    for (const auto& f : failed_checks(r, o.max_eval_gap)) failures.push_back(r.mode + ": " + f);
  for (const auto& f : failures) std::printf("FAILED: %s\n", f.c_str());
  if (failures.empty()) std::printf("drill passed: no global downtime, no committed round lost, ledger exact%s%s\n",
                                    done.empty() || done.front().takeovers.empty() ? ""
                                        : ", every takeover within its bound, no merge by a deposed broker",
                                    o.no_reference ? "" : ", eval loss within the bound of the reference");
  if (o.json) {
    std::string runs = "[";
    for (std::size_t i = 0; i < done.size(); ++i) runs += (i ? ",{" : "{") + drill_summary_json(done[i]) + "}";
    runs += "]";
    json_line j;
    j.add("command", "drill").add("passed", failures.empty()).add("report", html.string()).add_raw("runs", runs)
        .add_raw("learner_commands", own_learners.str());
    // The first mode's figures also at the top level, for scripts reading one drill.
    std::string line = j.str();
    if (!done.empty()) line = line.substr(0, line.size() - 1) + "," + drill_summary_json(done.front()) + "}";
    std::printf("%s\n", line.c_str());
  }
  return failures.empty() && !stop_requested ? exit_ok : exit_failure;
}

}  // namespace

runner add_drill_command(CLI::App& app) {
  auto o = std::make_shared<drill_flags>();
  CLI::App* cmd = app.add_subcommand("drill", "Run a fault plan (deploy/drills/) against a mesh and report what happened");
  cmd->add_option("--plan", o->plan, "The fault plan (TOML), e.g. deploy/drills/crash_storm.toml")->required();
  cmd->add_option("--modes", o->modes, "Run the plan once per mode, e.g. dp,decoupled (default: mesh.mode)")
      ->delimiter(',');
  o->flags.add_shortcut(*cmd, "--learners", "mesh.learners", "M", "Learners (the plans are written for 4)");
  o->flags.add_shortcut(*cmd, "--model", "model.size", "SIZE", "Model size: " + model_size_choices());
  o->flags.add_shortcut(*cmd, "--step-time-ms", "mesh.step_time_ms", "MS",
                        "Compute budget per inner step (default: calibrated at start from a few steps "
                        "on the cores at hand)");
  o->flags.add_to(*cmd);
  cmd->add_option("--time-scale", o->time_scale,
                  "Multiply every time of the plan by this (0.2: a short form of the same drill)")
      ->capture_default_str();
  cmd->add_flag("--no-reference", o->no_reference, "Skip the fault-free reference run");
  cmd->add_option("--reference-mode", o->reference_mode,
                  "Run the fault-free reference in this mesh.mode (default: the drill's own), e.g. dp: the mode "
                  "under faults against synchronous training without them, at equal tokens");
  cmd->add_flag("--processes", o->processes,
                "Run the mesh as separate `archipelago node` processes on loopback tcp:// (crash = SIGKILL, "
                "pause = SIGSTOP/SIGCONT; the wire without CURVE, on loopback)");
  cmd->add_option("--binary", o->binary, "With --processes: the archipelago executable the nodes run (default: this one)");
  cmd->add_option("--learner-command", o->learner_commands,
                  "With --processes: INDEX=COMMAND runs learner INDEX as COMMAND (words split at spaces) with the "
                  "arguments `archipelago node` gets, e.g. a PyTorch learner (tools/python/examples/torch_gpt.py); "
                  "repeatable");
  cmd->add_option("--max-eval-gap", o->max_eval_gap, "Largest eval-loss excess over the reference that passes")
      ->capture_default_str();
  cmd->add_option("--report", o->report_dir, "Write the report (HTML, JSON) into this directory")->capture_default_str();
  cmd->add_option("--work-dir", o->work_dir, "Keep the runs' snapshot stores here (default: a temporary directory)");
  cmd->add_flag("--json", o->json, "Print a one-line JSON summary last");
  return [o](logger& log) { return run_drills(*o, log); };
}

}  // namespace archipelago::cli
