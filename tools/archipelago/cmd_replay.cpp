// archipelago replay --db DIR: read a run's snapshots back — list, show,
// check, eval, sample, diff, export, tape, verify, save — and resume from one.
// Every subcommand opens the stores read-only: nothing in them changes (save
// and resume write only a new store). The reading is tools/replay's; this file
// parses flags and prints.

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <set>

#include "cli_common.hpp"
#include "cmd_run.hpp"
#include "commands.hpp"
#include "node/mesh_snapshots.hpp"
#include "replay/replay.hpp"

namespace archipelago::cli {
namespace {

struct replay_cli {
  std::vector<std::string> dbs;
  std::string db;  // the one store (all but the mesh commands)
  bool json = false;
  std::string version_text, other_text;  // a version number, or head (the newest)
  std::uint64_t version = 0, other = 0;   // resolved against the store
  std::string corpus;
  sample_options sample;
  std::string format = "npy", out;
  std::uint64_t from_round = 0, to_round = UINT64_MAX;
  run_options resume;
  int threads = 2;
};

std::string clock_time(std::int64_t ns) {
  const std::time_t t = static_cast<std::time_t>(ns / 1'000'000'000);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S", &tm);
  return buf;
}

int print_json(json_line& j) {
  std::printf("%s\n", j.str().c_str());
  return exit_ok;
}

int run_list(const replay_cli& c, const replay_store& s) {
  auto rows = list_versions(s);
  if (!rows) return report_input(rows.err());
  std::printf("%8s  %-19s  %9s  %12s  %7s  %s\n", "version", "time (UTC)", "fragments", "tokens", "steps", "eval loss");
  std::string json_rows;
  for (const version_row& r : *rows) {
    char eval[32] = "-";
    if (!std::isnan(r.eval_loss)) std::snprintf(eval, sizeof eval, "%.4f", r.eval_loss);
    std::printf("%8llu  %-19s  %9zu  %12llu  %7llu  %s\n", static_cast<unsigned long long>(r.version),
                clock_time(r.time_ns).c_str(), r.fragments, static_cast<unsigned long long>(r.tokens),
                static_cast<unsigned long long>(r.learner_steps), eval);
    json_line row;
    row.add("version", r.version).add("time_ns", static_cast<std::int64_t>(r.time_ns))
        .add("fragments", static_cast<std::int64_t>(r.fragments)).add("tokens", r.tokens)
        .add("learner_steps", r.learner_steps).add("eval_loss", r.eval_loss);
    json_rows += (json_rows.empty() ? "" : ",") + row.str();
  }
  if (rows->empty()) std::printf("(no versions)\n");
  if (!c.json) return exit_ok;
  json_line j;
  j.add("command", "replay list").add("db", c.db).add("versions", static_cast<std::int64_t>(rows->size()))
      .add_raw("rows", "[" + json_rows + "]");
  return print_json(j);
}

int run_show(const replay_cli& c, const replay_store& s) {
  auto d = show_version(s, c.version);
  if (!d) return report_input(d.err());
  const storage::manifest& m = d->manifest;
  std::printf("version %llu, %s UTC, learners at step %llu, %llu tokens processed\n",
              static_cast<unsigned long long>(m.mesh_version), clock_time(m.time_ns).c_str(),
              static_cast<unsigned long long>(m.learner_steps), static_cast<unsigned long long>(m.ledger.processed));
  std::printf("shards' ledger (fragment-tokens): merged %llu, late %llu, rejected %llu, unmerged %llu\n",
              static_cast<unsigned long long>(m.ledger.merged), static_cast<unsigned long long>(m.ledger.late),
              static_cast<unsigned long long>(m.ledger.rejected), static_cast<unsigned long long>(m.ledger.lost));
  if (!std::isnan(d->eval_loss)) std::printf("eval loss %.4f nats/byte\n", d->eval_loss);
  std::printf("%8s  %8s  %8s  %-18s\n", "fragment", "version", "round", "checksum");
  std::string entries;
  for (const auto& en : m.entries) {
    std::printf("%8u  %8llu  %8llu  %016llx\n", en.fragment, static_cast<unsigned long long>(en.version),
                static_cast<unsigned long long>(en.round), static_cast<unsigned long long>(en.theta_checksum));
    json_line row;
    row.add("fragment", static_cast<std::int64_t>(en.fragment)).add("version", en.version).add("round", en.round)
        .add("checksum", en.theta_checksum);
    entries += (entries.empty() ? "" : ",") + row.str();
  }
  if (!c.json) return exit_ok;
  json_line j;
  j.add("command", "replay show").add("version", m.mesh_version).add("time_ns", static_cast<std::int64_t>(m.time_ns))
      .add("learner_steps", m.learner_steps).add("tokens", m.ledger.processed).add("eval_loss", d->eval_loss)
      .add_raw("entries", "[" + entries + "]");
  return print_json(j);
}

int run_check(const replay_cli& c, const replay_store& s) {
  auto r = check_store(s);
  if (!r) return report_input(r.err());
  for (const auto& e : r->errors) std::fprintf(stderr, "archipelago replay check: %s\n", e.c_str());
  std::printf("%zu manifests, %zu fragment states, %zu tape records: %s\n", r->manifests, r->fragment_states,
              r->tape_records, r->errors.empty() ? "all readable, checksums valid, versions monotonic" : "ERRORS (see above)");
  if (c.json) {
    std::string heads, errs;
    for (const auto& [p, v] : r->head_versions)
      heads += (heads.empty() ? "\"" : ",\"") + std::to_string(p) + "\":" + std::to_string(v);
    for (const auto& e : r->errors) errs += (errs.empty() ? "\"" : ",\"") + json_escape(e) + "\"";
    json_line j;
    j.add("command", "replay check").add("ok", r->errors.empty()).add("manifests", static_cast<std::int64_t>(r->manifests))
        .add("fragment_states", static_cast<std::int64_t>(r->fragment_states))
        .add("tape_records", static_cast<std::int64_t>(r->tape_records)).add("head", r->head)
        .add_raw("head_versions", "{" + heads + "}").add_raw("errors", "[" + errs + "]");
    print_json(j);
  }
  return r->errors.empty() ? exit_ok : exit_bad_input;
}

int run_eval(const replay_cli& c, const replay_store& s) {
  auto r = evaluate_version(s, c.version, c.corpus, c.threads);
  if (!r) return report_input(r.err());
  const std::string corpus = c.corpus.empty() ? s.cfg.data.corpus : c.corpus;
  std::printf("version %llu: eval loss %.4f nats/byte = %.4f bits/byte on %lld held-out bytes of %s\n",
              static_cast<unsigned long long>(c.version), r->loss, r->bits_per_byte, static_cast<long long>(r->scored),
              corpus.empty() ? "the synthetic corpus" : corpus.c_str());
  if (!c.json) return exit_ok;
  json_line j;
  j.add("command", "replay eval").add("version", c.version).add("eval_loss", r->loss).add("eval_bpb", r->bits_per_byte)
      .add("scored", static_cast<std::int64_t>(r->scored)).add("corpus", corpus.empty() ? "synthetic" : corpus);
  return print_json(j);
}

int run_sample_version(const replay_cli& c, const replay_store& s) {
  auto text = sample_version(s, c.version, c.sample, c.threads);
  if (!text) return report_input(text.err());
  std::printf("%s%s\n", c.sample.prompt.c_str(), text->c_str());
  if (!c.json) return exit_ok;
  json_line j;
  j.add("command", "replay sample").add("version", c.version).add("prompt", c.sample.prompt).add("text", *text);
  return print_json(j);
}

int run_diff(const replay_cli& c, const replay_store& s) {
  auto d = diff_versions(s, c.version, c.other);
  if (!d) return report_input(d.err());
  std::printf("%8s  %9s  %9s  %12s  %12s  %12s\n", "fragment", "version A", "version B", "|B-A|", "|B-A|/|A|", "max |B-A|");
  std::string rows;
  for (const fragment_change& f : d->fragments) {
    std::printf("%8u  %9llu  %9llu  %12.6g  %12.6g  %12.6g\n", f.fragment, static_cast<unsigned long long>(f.version_a),
                static_cast<unsigned long long>(f.version_b), f.l2, f.relative, f.max_abs);
    json_line row;
    row.add("fragment", static_cast<std::int64_t>(f.fragment)).add("version_a", f.version_a).add("version_b", f.version_b)
        .add("l2", f.l2).add("relative", f.relative).add("max_abs", f.max_abs);
    rows += (rows.empty() ? "" : ",") + row.str();
  }
  std::printf("whole model: |B-A| %.6g, relative %.6g\n", d->l2, d->relative);
  if (!c.json) return exit_ok;
  json_line j;
  j.add("command", "replay diff").add("a", c.version).add("b", c.other).add("l2", d->l2).add("relative", d->relative)
      .add_raw("fragments", "[" + rows + "]");
  return print_json(j);
}

/// The fragment plan as JSON: per fragment, its tensors' names in the order its
/// values are concatenated (what a manifest's checksum covers).
std::string plan_json(const mesh_setup& setup) {
  std::string plan;
  for (const auto& f : setup.plan.fragments) {
    std::string names;
    for (std::size_t t : f.tensors) names += (names.empty() ? "\"" : ",\"") + json_escape(setup.layout.tensors[t].name) + "\"";
    plan += (plan.empty() ? "[" : ",[") + names + "]";
  }
  return "[" + plan + "]";
}

int run_export(const replay_cli& c, const replay_store& s) {
  if (auto ok = export_version(s, c.version, c.format, c.out); !ok) return report_input(ok.err());
  std::printf("version %llu: %zu tensors, %zu parameters written to %s (%s)\n",
              static_cast<unsigned long long>(c.version), s.setup.layout.tensors.size(), s.setup.layout.param_count,
              c.out.c_str(), c.format.c_str());
  if (!c.json) return exit_ok;
  json_line j;
  j.add("command", "replay export").add("version", c.version).add("format", c.format).add("out", c.out)
      .add("tensors", static_cast<std::int64_t>(s.setup.layout.tensors.size()))
      .add("parameters", static_cast<std::int64_t>(s.setup.layout.param_count)).add_raw("fragments", plan_json(s.setup));
  return print_json(j);
}

std::string members_text(const std::vector<storage::tape_member>& members, bool weights) {
  std::string out;
  for (const auto& m : members) {
    char buf[64];
    if (weights) std::snprintf(buf, sizeof buf, "%s%u(w %.3g)", out.empty() ? "" : " ", m.learner, m.weight);
    else std::snprintf(buf, sizeof buf, "%s%u", out.empty() ? "" : " ", m.learner);
    out += buf;
  }
  return out.empty() ? "-" : out;
}

/// One round of the tape as JSON.
std::string tape_json(const storage::tape_record& t, double quorum_ms) {
  std::string members, late, screened;
  for (const auto& m : t.members) {
    json_line e;
    e.add("learner", static_cast<std::int64_t>(m.learner)).add("incarnation", m.incarnation).add("weight", m.weight)
        .add("tokens", m.tokens).add("steps", m.steps);
    members += (members.empty() ? "" : ",") + e.str();
  }
  for (const auto& m : t.late) late += (late.empty() ? "" : ",") + std::to_string(m.learner);
  for (const auto& m : t.screened_out) screened += (screened.empty() ? "" : ",") + std::to_string(m.learner);
  json_line row;
  row.add("sequence", t.sequence).add("round", t.round).add("fragment", static_cast<std::int64_t>(t.fragment))
      .add("version", t.version)
      .add("quorum_ms", quorum_ms).add("grace_ms", static_cast<double>(t.grace_ns) * 1e-6).add("reason", t.reason)
      .add("committed_ns", static_cast<std::int64_t>(t.committed_ns)).add("epoch", t.broker_epoch)
      .add("broker", static_cast<std::int64_t>(leader_of_epoch(t.broker_epoch)))
      .add_raw("members", "[" + members + "]").add_raw("late", "[" + late + "]")
      .add_raw("screened_out", "[" + screened + "]");
  if (!t.settings.empty()) row.add("settings", t.settings);
  return row.str();
}

int run_tape(const replay_cli& c, const replay_store& s) {
  auto rounds = tape_rounds(s, c.from_round, c.to_round);
  if (!rounds) return report_input(rounds.err());
  std::printf("%8s  %8s  %8s  %9s  %9s  %-13s  %-30s  %s\n", "round", "fragment", "version", "quorum ms", "grace ms",
              "closed by", "members (weight)", "late; screened out");
  std::string rows;
  std::uint64_t epoch = 0;
  for (const storage::tape_record& t : *rounds) {
    if (t.broker_epoch != epoch && t.broker_epoch != 0)  // a takeover, or a restarted broker
      std::printf("-- from here broker/%u leads, epoch %llu (incarnation %llu)\n", leader_of_epoch(t.broker_epoch),
                  static_cast<unsigned long long>(t.broker_epoch), static_cast<unsigned long long>(t.broker_epoch >> 8));
    epoch = t.broker_epoch;
    if (!t.settings.empty()) std::printf("-- set live %s\n", t.settings.c_str());
    const double quorum_ms = t.quorum_ns < 0 ? std::nan("") : static_cast<double>(t.quorum_ns - t.opened_ns) * 1e-6;
    std::printf("%8llu  %8u  %8llu  %9.1f  %9.1f  %-13s  %-30s  %s\n", static_cast<unsigned long long>(t.round),
                t.fragment, static_cast<unsigned long long>(t.version), quorum_ms,
                static_cast<double>(t.grace_ns) * 1e-6, t.reason.c_str(), members_text(t.members, true).c_str(),
                (members_text(t.late, false) + (t.screened_out.empty() ? "" : "; " + members_text(t.screened_out, false))).c_str());
    rows += (rows.empty() ? "" : ",") + tape_json(t, quorum_ms);
  }
  std::printf("%zu rounds\n", rounds->size());
  if (!c.json) return exit_ok;
  json_line j;
  j.add("command", "replay tape").add("count", static_cast<std::int64_t>(rounds->size())).add_raw("rounds", "[" + rows + "]");
  return print_json(j);
}

int run_verify(const replay_cli& c, const replay_store& s) {
  auto r = verify_merges(s, c.db);
  if (!r) return report_input(r.err());
  for (const auto& f : r->failures) std::fprintf(stderr, "archipelago replay verify: %s\n", f.c_str());
  std::printf("replayed %zu merges over %zu fragments; %zu stored versions compared bit for bit: %s\n", r->merges,
              r->fragments, r->compared, r->failures.empty() ? "all identical" : "MISMATCH");
  if (r->unrecorded)
    std::printf("%zu stored versions are newer than the last recorded merge (written without "
                "--record-contributions): not verified\n", r->unrecorded);
  if (c.json) {
    json_line j;
    j.add("command", "replay verify").add("ok", r->failures.empty()).add("merges", static_cast<std::int64_t>(r->merges))
        .add("fragments", static_cast<std::int64_t>(r->fragments)).add("compared", static_cast<std::int64_t>(r->compared))
        .add("failures", static_cast<std::int64_t>(r->failures.size()))
        .add("unrecorded", static_cast<std::int64_t>(r->unrecorded));
    print_json(j);
  }
  return r->failures.empty() ? exit_ok : exit_failure;
}


// ---- several stores: one mesh (replay_mesh.cpp) ----------------------------------------

std::string part_list(const mesh_view& v) {
  std::string out;
  for (const auto& p : v.parts) out += (out.empty() ? "\"" : ",\"") + json_escape(p.db) + "\"";
  return "[" + out + "]";
}

int run_mesh_list(const replay_cli& c, const mesh_view& v) {
  auto cuts = list_cuts(v);
  if (!cuts) return report_input(cuts.err());
  std::printf("%zu shard stores, tape: %s (%zu rounds)\n", v.parts.size(),
              v.tape_db.empty() ? "none given (only the head cut is known)" : v.tape_db.c_str(), v.tape.size());
  for (std::size_t i = 0; i < v.parts.size(); ++i)
    std::printf("  store %zu: %s (%zu fragments, %u to %u; %zu manifests)\n", i, v.parts[i].db.c_str(),
                v.parts[i].fragments.size(), v.parts[i].fragments.front(), v.parts[i].fragments.back(),
                v.parts[i].manifests);
  if (!v.manifest_counts)
    std::printf("tokens, steps: the work the tape's merges carried by the cut (mean over fragments; steps per learner)\n");
  std::printf("%8s  %-19s  %-8s  %12s  %7s  %s\n", "cut", "time (UTC)", "complete", "tokens", "steps",
              "manifest per store (- none kept)");
  std::string json_rows;
  std::size_t complete = 0;
  std::string newest;
  for (const mesh_cut& cut : *cuts) {
    std::string per_store, per_store_json;
    for (const auto& m : cut.manifests) {
      per_store += (per_store.empty() ? "" : " ") + (m ? std::to_string(*m) : std::string("-"));
      per_store_json += (per_store_json.empty() ? "" : ",") + (m ? std::to_string(*m) : std::string("null"));
    }
    const bool ok = cut.complete(v);
    if (ok) ++complete, newest = cut.name();
    const std::string name = cut.name() + (cut.head && cut.tape_seq ? "*" : "");
    const std::string tokens = cut.counts_known ? std::to_string(cut.tokens) : "-";
    const std::string steps = cut.counts_known ? std::to_string(cut.learner_steps) : "-";
    std::printf("%8s  %-19s  %-8s  %12s  %7s  %s\n", name.c_str(), clock_time(cut.time_ns).c_str(),
                ok ? "yes" : "no", tokens.c_str(), steps.c_str(), per_store.c_str());
    std::string versions;
    for (std::uint64_t x : cut.versions) versions += (versions.empty() ? "" : ",") + std::to_string(x);
    json_line row;
    row.add("cut", cut.name()).add("head", cut.head).add("complete", ok).add("time_ns", static_cast<std::int64_t>(cut.time_ns))
        .add_raw("tokens", cut.counts_known ? tokens : "null").add_raw("learner_steps", cut.counts_known ? steps : "null")
        .add_raw("manifests", "[" + per_store_json + "]").add_raw("versions", "[" + versions + "]");
    if (!ok) row.add("missing", missing_of(v, cut));
    json_rows += (json_rows.empty() ? "" : ",") + row.str();
  }
  std::printf("%zu cuts kept by some store, %zu complete%s%s\n", cuts->size(), complete,
              newest.empty() ? "" : "; the newest complete: ", newest.c_str());
  if (!v.missing.empty()) std::printf("incomplete view: %s\n", missing_of(v, mesh_cut{{}, false, {}, std::vector<std::optional<std::uint64_t>>(v.parts.size(), 0)}).c_str());
  if (!c.json) return exit_ok;
  json_line j;
  j.add("command", "replay list").add_raw("stores", part_list(v)).add("tape_db", v.tape_db)
      .add("tape_records", static_cast<std::int64_t>(v.tape.size())).add("cuts", static_cast<std::int64_t>(cuts->size()))
      .add("counts_from", v.manifest_counts ? "manifests" : "tape")
      .add("complete", static_cast<std::int64_t>(complete)).add("newest_complete", newest)
      .add_raw("rows", "[" + json_rows + "]");
  return print_json(j);
}

int run_mesh_check(const replay_cli& c, const mesh_view& v) {
  std::size_t manifests = 0, states = 0, tape_records = 0, errors = 0;
  std::vector<std::string> all;
  for (const auto& p : v.parts) all.push_back(p.db);
  all.insert(all.end(), v.broker_dbs.begin(), v.broker_dbs.end());
  for (const auto& db : all) {
    auto s = open_replay(db);
    if (!s) return report_input(s.err());
    auto r = check_store(*s);
    if (!r) return report_input(r.err());
    for (const auto& e : r->errors) std::fprintf(stderr, "archipelago replay check: %s: %s\n", db.c_str(), e.c_str());
    std::printf("%s: %zu manifests, %zu fragment states, %zu tape records: %s\n", db.c_str(), r->manifests,
                r->fragment_states, r->tape_records, r->errors.empty() ? "ok" : "ERRORS (see above)");
    manifests += r->manifests, states += r->fragment_states, tape_records += r->tape_records;
    errors += r->errors.size();
  }
  if (!v.missing.empty()) std::printf("the view lacks fragments: no store given holds them\n");
  if (c.json) {
    json_line j;
    j.add("command", "replay check").add("ok", errors == 0).add("stores", static_cast<std::int64_t>(all.size()))
        .add("manifests", static_cast<std::int64_t>(manifests)).add("fragment_states", static_cast<std::int64_t>(states))
        .add("tape_records", static_cast<std::int64_t>(tape_records)).add("errors", static_cast<std::int64_t>(errors))
        .add("complete_view", v.missing.empty());
    print_json(j);
  }
  return errors == 0 ? exit_ok : exit_bad_input;
}

/// The model of the cut the command names, with the cut.
expected<std::pair<mesh_cut, std::vector<float>>> mesh_model(const replay_cli& c, const mesh_view& v) {
  auto cut = find_cut(v, c.version_text);
  if (!cut) return cut.err();
  auto params = params_of(v, *cut);
  if (!params) return params.err();
  return std::pair{std::move(*cut), std::move(*params)};
}

int run_mesh_eval(const replay_cli& c, const mesh_view& v) {
  auto m = mesh_model(c, v);
  if (!m) return report_input(m.err());
  auto r = evaluate_params(v.cfg, v.setup, m->second, c.corpus, c.threads);
  if (!r) return report_input(r.err());
  const std::string corpus = c.corpus.empty() ? v.cfg.data.corpus : c.corpus;
  std::printf("cut %s of %zu stores: eval loss %.4f nats/byte = %.4f bits/byte on %lld held-out bytes of %s\n",
              m->first.name().c_str(), v.parts.size(), r->loss, r->bits_per_byte, static_cast<long long>(r->scored),
              corpus.empty() ? "the synthetic corpus" : corpus.c_str());
  if (!c.json) return exit_ok;
  json_line j;
  j.add("command", "replay eval").add("cut", m->first.name()).add("eval_loss", r->loss).add("eval_bpb", r->bits_per_byte)
      .add("scored", static_cast<std::int64_t>(r->scored)).add("corpus", corpus.empty() ? "synthetic" : corpus)
      .add_raw("stores", part_list(v));
  return print_json(j);
}

int run_mesh_sample(const replay_cli& c, const mesh_view& v) {
  if (auto ok = validate(c.sample); !ok) return report_input(ok.err());
  auto m = mesh_model(c, v);
  if (!m) return report_input(m.err());
  auto text = sample_params(v.setup, m->second, c.sample, c.threads);
  if (!text) return report_input(text.err());
  std::printf("%s%s\n", c.sample.prompt.c_str(), text->c_str());
  if (!c.json) return exit_ok;
  json_line j;
  j.add("command", "replay sample").add("cut", m->first.name()).add("prompt", c.sample.prompt).add("text", *text);
  return print_json(j);
}

int run_mesh_export(const replay_cli& c, const mesh_view& v) {
  auto m = mesh_model(c, v);
  if (!m) return report_input(m.err());
  if (auto ok = export_params(v.setup, m->second, c.format, c.out, "cut " + m->first.name()); !ok)
    return report_input(ok.err());
  std::string versions, manifests;
  for (std::uint64_t x : m->first.versions) versions += (versions.empty() ? "" : ",") + std::to_string(x);
  for (const auto& x : m->first.manifests) manifests += (manifests.empty() ? "" : ",") + std::to_string(x.value_or(0));
  std::printf("cut %s of %zu stores: %zu tensors, %zu parameters written to %s (%s)\n", m->first.name().c_str(),
              v.parts.size(), v.setup.layout.tensors.size(), v.setup.layout.param_count, c.out.c_str(), c.format.c_str());
  if (!c.json) return exit_ok;
  json_line j;
  j.add("command", "replay export").add("cut", m->first.name()).add("format", c.format).add("out", c.out)
      .add("tensors", static_cast<std::int64_t>(v.setup.layout.tensors.size()))
      .add("parameters", static_cast<std::int64_t>(v.setup.layout.param_count))
      .add_raw("versions", "[" + versions + "]").add_raw("stores", part_list(v))
      .add_raw("manifests", "[" + manifests + "]").add_raw("fragments", plan_json(v.setup));
  return print_json(j);
}

int print_saved(const replay_cli& c, const std::string& what, const saved_point& p, std::uint64_t written) {
  std::printf("%s saved to %s as its version %llu (%zu fragments; learners' schedule at step %llu, %llu tokens)\n",
              what.c_str(), c.out.c_str(), static_cast<unsigned long long>(written), p.states.size(),
              static_cast<unsigned long long>(p.learner_steps), static_cast<unsigned long long>(p.tokens));
  if (!c.json) return exit_ok;
  json_line j;
  j.add("command", "replay save").add("from", what).add("out", c.out).add("version", written)
      .add("fragments", static_cast<std::int64_t>(p.states.size())).add("learner_steps", p.learner_steps)
      .add("tokens", p.tokens);
  return print_json(j);
}

int run_save(const replay_cli& c, const replay_store& s) {
  saved_point p;
  auto m = pick_manifest(*s.store, c.version, &p.states);
  if (!m) return report_input(make_error(m.err().code, c.db + ": " + m.err().message));
  p.tokens = m->ledger.processed;
  p.learner_steps = m->learner_steps;
  auto written = save_point(s.setup, p, c.out);
  if (!written) return report_input(written.err());
  return print_saved(c, "version " + std::to_string(c.version) + " of " + c.db, p, *written);
}

/// Cut `c.version_text` of the view saved as one store in `c.out`.
expected<std::pair<saved_point, std::uint64_t>> save_cut(const replay_cli& c, const mesh_view& v) {
  auto cut = find_cut(v, c.version_text);
  if (!cut) return cut.err();
  saved_point p;
  auto states = states_of(v, *cut);
  if (!states) return states.err();
  p.states = std::move(*states);
  if (cut->counts_known) p.tokens = cut->tokens, p.learner_steps = cut->learner_steps;
  auto written = save_point(v.setup, p, c.out);
  if (!written) return written.err();
  return std::pair{std::move(p), *written};
}

int run_mesh_save(const replay_cli& c, const mesh_view& v) {
  auto saved = save_cut(c, v);
  if (!saved) return report_input(saved.err());
  return print_saved(c, "cut " + c.version_text + " of " + std::to_string(v.parts.size()) + " stores", saved->first,
                     saved->second);
}

/// A version argument against one store: a number, or head (its newest valid manifest).
expected<std::uint64_t> resolve_version(const replay_store& s, const std::string& text) {
  if (text == "head") {
    auto m = pick_manifest(*s.store, std::nullopt);
    if (!m) return m.err();
    return m->mesh_version;
  }
  std::uint64_t v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc{} || end != text.data() + text.size())
    return make_error(errc::invalid_input, "version '" + text + "': expected a number from `replay list` or head");
  return v;
}

}  // namespace

runner add_replay_command(CLI::App& app) {
  auto c = std::make_shared<replay_cli>();
  CLI::App* cmd = app.add_subcommand("replay", "Read a run's snapshots back: list, show, check, eval, sample, diff, "
                                               "export, tape, verify, resume");
  cmd->add_option("--db", c->dbs,
                  "A snapshot directory (run --db, node --db), or a directory of a mesh's stores (launch.py --db, "
                  "Slurm's ARCH_DB); repeat it for the stores of one mesh: list, check, eval, sample and export "
                  "then read the whole model over them")
      ->required();
  cmd->require_subcommand(1);
  auto add = [&](const std::string& name, const std::string& help) {
    CLI::App* sub = cmd->add_subcommand(name, help);
    sub->add_flag("--json", c->json, "Print a one-line JSON summary last");
    return sub;
  };
  auto version_arg = [&](CLI::App* sub, std::string& field, const std::string& name) {
    sub->add_option(name, field, "Mesh version, or cut of several stores (see replay list); head: the newest; "
                                 "newest (several stores): the newest complete cut the tape names; V0,V1,... "
                                 "(several stores): one version per fragment, as a learner's evaluation of the "
                                 "global model names it")
        ->required();
  };
  std::map<std::string, std::function<int(const replay_cli&, const replay_store&)>> subs;
  add("list", "Versions with time, tokens and eval loss where known");
  subs["list"] = run_list;
  version_arg(add("show", "One version: its fragments, versions and checksums"), c->version_text, "VERSION");
  subs["show"] = run_show;
  add("check", "Read every record; exit 2 if anything is corrupt, missing or out of order");
  subs["check"] = run_check;
  {
    CLI::App* sub = add("eval", "Eval loss of a version");
    version_arg(sub, c->version_text, "VERSION");
    sub->add_option("--corpus", c->corpus, "Evaluate on this text file's held-out part instead");
    sub->add_option("--threads", c->threads, "Compute threads")->check(CLI::Range(1, 256));
  }
  subs["eval"] = run_eval;
  {
    CLI::App* sub = add("sample", "Generate text from a version");
    version_arg(sub, c->version_text, "VERSION");
    sub->add_option("--prompt", c->sample.prompt, "Text to continue");
    sub->add_option("--bytes", c->sample.bytes, "Bytes to generate (default 256)");
    sub->add_option("--temperature", c->sample.temperature, "Sampling temperature > 0 (default 0.8)");
    sub->add_option("--seed", c->sample.seed, "Sampling seed");
  }
  subs["sample"] = run_sample_version;
  {
    CLI::App* sub = add("diff", "Change per fragment between two versions");
    version_arg(sub, c->version_text, "A");
    version_arg(sub, c->other_text, "B");
  }
  subs["diff"] = run_diff;
  {
    CLI::App* sub = add("export", "Write a version's tensors for numpy / PyTorch");
    version_arg(sub, c->version_text, "VERSION");
    sub->add_option("--format", c->format, "npy (a directory of .npy files) or safetensors (one file)")
        ->check(CLI::IsMember({"npy", "safetensors"}));
    sub->add_option("--out", c->out, "Output directory (npy) or file (safetensors)")->required();
  }
  subs["export"] = run_export;
  {
    CLI::App* sub = add("tape", "Round history: members, weights, grace, who came late");
    sub->add_option("--from", c->from_round, "First round");
    sub->add_option("--to", c->to_round, "Last round");
  }
  subs["tape"] = run_tape;
  add("verify", "Re-apply every recorded merge from the first version; compare every version bit for bit");
  subs["verify"] = run_verify;

  {
    CLI::App* sub = add("save", "Write a version (a cut of several stores) into a new store: its one manifest holds "
                                "every fragment; run --resume DIR and node --resume-from DIR start from it");
    version_arg(sub, c->version_text, "VERSION");
    sub->add_option("--out", c->out, "The new store's directory (must not exist)")->required();
  }
  subs["save"] = run_save;

  CLI::App* resume = cmd->add_subcommand("resume", "Start a new run in one process from a version, or from a cut "
                                                   "of several stores (a rollback)");
  resume->add_option("VERSION", c->version_text, "Mesh version (a cut of several stores) to start from; head: the newest")
      ->required();
  add_run_flags(*resume, c->resume);

  std::map<std::string, std::function<int(const replay_cli&, const mesh_view&)>> mesh_subs{
      {"list", run_mesh_list}, {"check", run_mesh_check}, {"eval", run_mesh_eval},
      {"sample", run_mesh_sample}, {"export", run_mesh_export}, {"save", run_mesh_save}};

  return [c, cmd, resume, subs, mesh_subs](logger& log) {
    auto dirs = expand_store_dirs(c->dbs);
    if (!dirs) return report_input(dirs.err());
    if (dirs->size() > 1) {
      auto view = open_mesh_view(*dirs);
      if (!view) return report_input(view.err());
      for (const auto& [name, fn] : mesh_subs)
        if (cmd->get_subcommand(name)->parsed()) return fn(*c, *view);
      if (resume->parsed()) {
        // The cut becomes the new run's first snapshot; the run continues from it, as run --resume does.
        run_options& o = c->resume;
        if (o.snapshots.db.empty())
          return report_input(make_error(errc::invalid_input, "resume of several stores: give the new run's store "
                                                              "(resume CUT --db DIR): the cut is written there first"));
        c->out = o.snapshots.db;
        auto saved = save_cut(*c, *view);
        if (!saved) return report_input(saved.err());
        std::printf("cut %s of %zu stores written to %s\n", c->version_text.c_str(), view->parts.size(),
                    o.snapshots.db.c_str());
        o.snapshots.resume_db = o.snapshots.db;
        return run_mesh_command(o, log);
      }
      return report_input(make_error(errc::invalid_input, "replay over several stores does list, check, eval, sample, "
                                                          "export, save and resume; show, diff, tape and verify read "
                                                          "one store: give its --db alone"));
    }
    c->db = dirs->front();
    auto s = open_replay(c->db);
    if (!s) return report_input(s.err());
    if (resume->parsed()) {
      run_options& o = c->resume;
      if (o.snapshots.db == c->db)
        return report_input(make_error(errc::invalid_input, "--db of the new run must differ from the replayed store"));
      auto v = resolve_version(*s, c->version_text);
      if (!v) return report_input(v.err());
      o.snapshots.resume_db = c->db;
      o.snapshots.resume_version = *v;
      return run_mesh_command(o, log);
    }
    for (auto [text, field] : {std::pair{&c->version_text, &c->version}, std::pair{&c->other_text, &c->other}}) {
      if (text->empty()) continue;
      auto v = resolve_version(*s, *text);
      if (!v) return report_input(v.err());
      *field = *v;
    }
    for (const auto& [name, fn] : subs)
      if (cmd->get_subcommand(name)->parsed()) return fn(*c, *s);
    return exit_bad_input;
  };
}

}  // namespace archipelago::cli
