// archipelago replay --db DIR: read a run's snapshots back — list, show,
// check, eval, sample, diff, export, tape, verify — and resume from one.
// Every subcommand opens the store read-only: nothing on disk changes.

#include <algorithm>
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
#include "core/checksum.hpp"
#include "learner/model/sampler.hpp"
#include "learner/model/trainer.hpp"
#include "node/mesh_snapshots.hpp"
#include "parameter_shard/shard_snapshots.hpp"
#include "parameter_shard/shard_wire.hpp"

namespace archipelago::cli {
namespace {

struct replay_cli {
  std::string db;
  bool json = false;
  std::uint64_t version = 0, other = 0;
  std::string corpus;
  sample_options sample;
  std::string format = "npy", out;
  std::uint64_t from_round = 0, to_round = UINT64_MAX;
  run_options resume;
  int threads = 2;
};

/// The store with what its run agreed on.
struct opened_store {
  std::shared_ptr<storage::snapshot_store> store;
  config cfg;
  mesh_setup setup;
};

expected<opened_store> open_replay(const std::string& db) {
  auto store = open_store_read_only(db);
  if (!store) return store.err();
  auto cfg = config_of((*store)->info());
  if (!cfg) return make_error(errc::corrupt_data, db + ": " + cfg.err().message);
  auto policy = resolve_policy(*cfg);
  if (!policy) return make_error(errc::corrupt_data, db + ": the stored configuration: " + policy.err().message);
  opened_store out{*store, *cfg, make_mesh_setup(*cfg, *policy)};
  if (out.setup.layout.fingerprint() != out.store->info().layout_fingerprint)
    return make_error(errc::unsupported, db + ": its model layout differs from this build's reading of its "
                                              "configuration (written by another version?)");
  return out;
}

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

std::map<std::uint64_t, storage::eval_record> evals_of(const storage::snapshot_store& store) {
  std::map<std::uint64_t, storage::eval_record> out;
  (void)store.for_each_eval([&](const storage::eval_record& e) {
    out[e.mesh_version] = e;
    return true;
  });
  return out;
}

// ---- list / show ------------------------------------------------------------------

int run_list(const replay_cli& c, const opened_store& s) {
  const auto evals = evals_of(*s.store);
  std::printf("%8s  %-19s  %9s  %12s  %7s  %s\n", "version", "time (UTC)", "fragments", "tokens", "steps", "eval loss");
  std::string rows;
  std::size_t count = 0;
  auto ok = s.store->for_each_manifest([&](const storage::manifest& m) {
    auto e = evals.find(m.mesh_version);
    const double loss = e == evals.end() ? std::nan("") : e->second.eval_loss;
    char eval[32] = "-";
    if (!std::isnan(loss)) std::snprintf(eval, sizeof eval, "%.4f", loss);
    std::printf("%8llu  %-19s  %9zu  %12llu  %7llu  %s\n", static_cast<unsigned long long>(m.mesh_version),
                clock_time(m.time_ns).c_str(), m.entries.size(), static_cast<unsigned long long>(m.ledger.processed),
                static_cast<unsigned long long>(m.learner_steps), eval);
    json_line row;
    row.add("version", m.mesh_version).add("time_ns", static_cast<std::int64_t>(m.time_ns))
        .add("fragments", static_cast<std::int64_t>(m.entries.size())).add("tokens", m.ledger.processed)
        .add("learner_steps", m.learner_steps).add("eval_loss", loss);
    rows += (rows.empty() ? "" : ",") + row.str();
    ++count;
    return true;
  });
  if (!ok) return report_input(ok.err());
  if (count == 0) std::printf("(no versions)\n");
  if (!c.json) return exit_ok;
  json_line j;
  j.add("command", "replay list").add("db", c.db).add("versions", static_cast<std::int64_t>(count))
      .add_raw("rows", "[" + rows + "]");
  return print_json(j);
}

int run_show(const replay_cli& c, const opened_store& s) {
  auto m = s.store->read_manifest(c.version);
  if (!m) return report_input(m.err());
  const auto evals = evals_of(*s.store);
  const auto e = evals.find(m->mesh_version);
  std::printf("version %llu, %s UTC, learners at step %llu, %llu tokens processed\n",
              static_cast<unsigned long long>(m->mesh_version), clock_time(m->time_ns).c_str(),
              static_cast<unsigned long long>(m->learner_steps), static_cast<unsigned long long>(m->ledger.processed));
  std::printf("shards' ledger (fragment-tokens): merged %llu, late %llu, rejected %llu, unmerged %llu\n",
              static_cast<unsigned long long>(m->ledger.merged), static_cast<unsigned long long>(m->ledger.late),
              static_cast<unsigned long long>(m->ledger.rejected), static_cast<unsigned long long>(m->ledger.lost));
  if (e != evals.end()) std::printf("eval loss %.4f nats/byte\n", e->second.eval_loss);
  std::printf("%8s  %8s  %8s  %-18s\n", "fragment", "version", "round", "checksum");
  std::string entries;
  for (const auto& en : m->entries) {
    std::printf("%8u  %8llu  %8llu  %016llx\n", en.fragment, static_cast<unsigned long long>(en.version),
                static_cast<unsigned long long>(en.round), static_cast<unsigned long long>(en.theta_checksum));
    json_line row;
    row.add("fragment", static_cast<std::int64_t>(en.fragment)).add("version", en.version).add("round", en.round)
        .add("checksum", en.theta_checksum);
    entries += (entries.empty() ? "" : ",") + row.str();
  }
  if (!c.json) return exit_ok;
  json_line j;
  j.add("command", "replay show").add("version", m->mesh_version).add("time_ns", static_cast<std::int64_t>(m->time_ns))
      .add("learner_steps", m->learner_steps).add("tokens", m->ledger.processed)
      .add("eval_loss", e == evals.end() ? std::nan("") : e->second.eval_loss).add_raw("entries", "[" + entries + "]");
  return print_json(j);
}

// ---- check: the whole store, every record ----------------------------------------

int run_check(const replay_cli& c, const opened_store& s) {
  std::vector<std::string> errors;
  std::size_t manifests = 0, states = 0;
  std::uint64_t previous = 0;
  std::map<std::uint32_t, std::uint64_t> versions;  // fragment → version in the previous manifest
  std::set<std::pair<std::uint32_t, std::uint64_t>> checked;
  // Keys first, so that one undecodable manifest does not hide the others.
  std::vector<std::uint64_t> keys;
  if (auto ok = s.store->kv().scan(storage::column::manifests, {}, {}, [&](std::string_view key, std::string_view) {
        keys.push_back(storage::read_be64(key));
        return true;
      });
      !ok)
    return report_input(ok.err());
  for (std::uint64_t key : keys) {
    auto m = s.store->read_manifest(key);
    if (!m) {
      errors.push_back(m.err().message);
      continue;
    }
    ++manifests;
    if (m->mesh_version != key) errors.push_back("manifest under key " + std::to_string(key) + " says version " +
                                                 std::to_string(m->mesh_version));
    if (m->mesh_version <= previous) errors.push_back("mesh version " + std::to_string(m->mesh_version) + " after " +
                                                      std::to_string(previous));
    previous = m->mesh_version;
    if (m->mesh_hash != s.store->info().mesh_hash)
      errors.push_back("version " + std::to_string(key) + " was written by a mesh with another policy");
    for (const auto& e : m->entries) {
      auto before = versions.find(e.fragment);
      if (before != versions.end() && e.version < before->second)
        errors.push_back("fragment " + std::to_string(e.fragment) + " goes back from version " +
                         std::to_string(before->second) + " to " + std::to_string(e.version) + " in mesh version " +
                         std::to_string(key));
      versions[e.fragment] = e.version;
      if (!checked.insert({e.fragment, e.version}).second) continue;
      auto f = s.store->read_fragment(e.fragment, e.version);
      ++states;
      if (!f) errors.push_back("mesh version " + std::to_string(key) + ": " + f.err().message);
      else if (checksum64(f->theta.data(), f->theta.size() * 4) != e.theta_checksum)
        errors.push_back("mesh version " + std::to_string(key) + ": fragment " + std::to_string(e.fragment) +
                         " version " + std::to_string(e.version) + " differs from the manifest's checksum");
    }
  }
  std::size_t tape = 0;
  if (auto ok = s.store->for_each_tape([&](const storage::tape_record&) { return ++tape, true; }); !ok)
    errors.push_back(ok.err().message);
  if (auto l = s.store->ledgers(); !l) errors.push_back(l.err().message);
  for (const auto& e : errors) std::fprintf(stderr, "archipelago replay check: %s\n", e.c_str());
  std::printf("%zu manifests, %zu fragment states, %zu tape records: %s\n", manifests, states, tape,
              errors.empty() ? "all readable, checksums valid, versions monotonic" : "ERRORS (see above)");
  if (c.json) {
    std::string heads, errs;
    for (const auto& [p, v] : versions) heads += (heads.empty() ? "\"" : ",\"") + std::to_string(p) + "\":" + std::to_string(v);
    for (const auto& e : errors) errs += (errs.empty() ? "\"" : ",\"") + json_escape(e) + "\"";
    json_line j;
    j.add("command", "replay check").add("ok", errors.empty()).add("manifests", static_cast<std::int64_t>(manifests))
        .add("fragment_states", static_cast<std::int64_t>(states)).add("tape_records", static_cast<std::int64_t>(tape))
        .add("head", previous).add_raw("head_versions", "{" + heads + "}").add_raw("errors", "[" + errs + "]");
    print_json(j);
  }
  return errors.empty() ? exit_ok : exit_bad_input;
}

// ---- eval / sample / diff / export ------------------------------------------------

expected<std::vector<float>> params_of(const opened_store& s, std::uint64_t version) {
  auto m = s.store->read_manifest(version);
  if (!m) return m.err();
  return s.store->read_params(*m, s.setup.layout, s.setup.plan);
}

int run_eval(const replay_cli& c, const opened_store& s) {
  auto params = params_of(s, c.version);
  if (!params) return report_input(params.err());
  config cfg = s.cfg;
  if (!c.corpus.empty()) cfg.data.corpus = c.corpus;
  auto data = load_dataset(cfg.data, 1, s.setup.shape.context, cfg.train.seed);
  if (!data) return report_input(data.err());
  set_compute_threads(c.threads);
  engine eval(cfg, s.setup.shape, *data, 0);
  std::copy(params->begin(), params->end(), eval.model().params());
  const eval_result r = eval.evaluate();
  std::printf("version %llu: eval loss %.4f nats/byte = %.4f bits/byte on %lld held-out bytes of %s\n",
              static_cast<unsigned long long>(c.version), r.loss, r.bits_per_byte, static_cast<long long>(r.scored),
              cfg.data.corpus.empty() ? "the synthetic corpus" : cfg.data.corpus.c_str());
  if (!c.json) return exit_ok;
  json_line j;
  j.add("command", "replay eval").add("version", c.version).add("eval_loss", r.loss).add("eval_bpb", r.bits_per_byte)
      .add("scored", static_cast<std::int64_t>(r.scored)).add("corpus", cfg.data.corpus.empty() ? "synthetic" : cfg.data.corpus);
  return print_json(j);
}

int run_sample_version(const replay_cli& c, const opened_store& s) {
  if (auto ok = validate(c.sample); !ok) return report_input(ok.err());
  auto params = params_of(s, c.version);
  if (!params) return report_input(params.err());
  set_compute_threads(c.threads);
  gpt<float> model(s.setup.layout);
  std::copy(params->begin(), params->end(), model.params());
  const std::string text = sample_text(model, c.sample);
  std::printf("%s%s\n", c.sample.prompt.c_str(), text.c_str());
  if (!c.json) return exit_ok;
  json_line j;
  j.add("command", "replay sample").add("version", c.version).add("prompt", c.sample.prompt).add("text", text);
  return print_json(j);
}

int run_diff(const replay_cli& c, const opened_store& s) {
  auto a = s.store->read_manifest(c.version);
  if (!a) return report_input(a.err());
  auto b = s.store->read_manifest(c.other);
  if (!b) return report_input(b.err());
  std::printf("%8s  %9s  %9s  %12s  %12s  %12s\n", "fragment", "version A", "version B", "|B-A|", "|B-A|/|A|", "max |B-A|");
  std::string rows;
  double total_sq = 0, total_a_sq = 0;
  for (const auto& ea : a->entries) {
    const storage::manifest_entry* eb = b->find(ea.fragment);
    if (!eb) continue;
    auto fa = s.store->read_fragment(ea.fragment, ea.version);
    if (!fa) return report_input(fa.err());
    auto fb = s.store->read_fragment(eb->fragment, eb->version);
    if (!fb) return report_input(fb.err());
    double sq = 0, a_sq = 0, max_abs = 0;
    for (std::size_t i = 0; i < fa->theta.size() && i < fb->theta.size(); ++i) {
      const double d = static_cast<double>(fb->theta[i]) - fa->theta[i];
      sq += d * d;
      a_sq += static_cast<double>(fa->theta[i]) * fa->theta[i];
      max_abs = std::max(max_abs, std::abs(d));
    }
    total_sq += sq;
    total_a_sq += a_sq;
    const double rel = a_sq > 0 ? std::sqrt(sq / a_sq) : 0;
    std::printf("%8u  %9llu  %9llu  %12.6g  %12.6g  %12.6g\n", ea.fragment, static_cast<unsigned long long>(ea.version),
                static_cast<unsigned long long>(eb->version), std::sqrt(sq), rel, max_abs);
    json_line row;
    row.add("fragment", static_cast<std::int64_t>(ea.fragment)).add("version_a", ea.version).add("version_b", eb->version)
        .add("l2", std::sqrt(sq)).add("relative", rel).add("max_abs", max_abs);
    rows += (rows.empty() ? "" : ",") + row.str();
  }
  const double rel = total_a_sq > 0 ? std::sqrt(total_sq / total_a_sq) : 0;
  std::printf("whole model: |B-A| %.6g, relative %.6g\n", std::sqrt(total_sq), rel);
  if (!c.json) return exit_ok;
  json_line j;
  j.add("command", "replay diff").add("a", c.version).add("b", c.other).add("l2", std::sqrt(total_sq))
      .add("relative", rel).add_raw("fragments", "[" + rows + "]");
  return print_json(j);
}

/// The tensor's shape as exported: a matrix (rows, cols); a vector (cols).
std::string shape_text(const tensor_spec& t, char open, char close) {
  return t.rows == 1 && t.kind == tensor_kind::vector
             ? std::string(1, open) + std::to_string(t.cols) + (open == '(' ? ",)" : std::string(1, close))
             : std::string(1, open) + std::to_string(t.rows) + "," + std::to_string(t.cols) + close;
}

status write_file(const std::filesystem::path& path, const std::string& head, const float* data, std::size_t floats) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(head.data(), static_cast<std::streamsize>(head.size()));
  f.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(floats * sizeof(float)));
  f.close();
  if (!f) return make_error(errc::io_error, "cannot write " + path.string());
  return {};
}

/// One .npy file per tensor (format 1.0, little-endian float32, C order) in directory `out`.
status export_npy(const param_layout& layout, const std::vector<float>& params, const std::string& out) {
  std::error_code ec;
  std::filesystem::create_directories(out, ec);
  if (ec) return make_error(errc::io_error, "cannot create " + out + ": " + ec.message());
  for (const auto& t : layout.tensors) {
    std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': " + shape_text(t, '(', ')') + ", }";
    const std::size_t total = 10 + header.size() + 1;
    header.append((64 - total % 64) % 64, ' ');
    header += '\n';
    std::string head = "\x93NUMPY";
    head += '\x01';
    head += '\x00';
    head += static_cast<char>(header.size() & 0xff);
    head += static_cast<char>(header.size() >> 8);
    if (auto ok = write_file(std::filesystem::path(out) / (t.name + ".npy"), head + header, params.data() + t.offset, t.size()); !ok)
      return ok;
  }
  return {};
}

/// One safetensors file: le64 header length, a JSON header, then the tensors' bytes.
status export_safetensors(const param_layout& layout, const std::vector<float>& params, const std::string& out,
                          std::uint64_t version) {
  std::string header = "{\"__metadata__\":{\"format\":\"pt\",\"archipelago_version\":\"" + std::to_string(version) + "\"}";
  std::vector<float> data;
  for (const auto& t : layout.tensors) {
    const std::size_t begin = data.size() * 4;
    data.insert(data.end(), params.begin() + static_cast<std::ptrdiff_t>(t.offset),
                params.begin() + static_cast<std::ptrdiff_t>(t.offset + t.size()));
    header += ",\"" + json_escape(t.name) + "\":{\"dtype\":\"F32\",\"shape\":" + shape_text(t, '[', ']') +
              ",\"data_offsets\":[" + std::to_string(begin) + "," + std::to_string(data.size() * 4) + "]}";
  }
  header += "}";
  header.append((8 - header.size() % 8) % 8, ' ');
  std::string head(8, '\0');
  for (int i = 0; i < 8; ++i) head[i] = static_cast<char>(static_cast<std::uint64_t>(header.size()) >> (8 * i));
  return write_file(out, head + header, data.data(), data.size());
}

int run_export(const replay_cli& c, const opened_store& s) {
  auto params = params_of(s, c.version);
  if (!params) return report_input(params.err());
  const status ok = c.format == "npy" ? export_npy(s.setup.layout, *params, c.out)
                                      : export_safetensors(s.setup.layout, *params, c.out, c.version);
  if (!ok) return report_input(ok.err());
  std::printf("version %llu: %zu tensors, %zu parameters written to %s (%s)\n",
              static_cast<unsigned long long>(c.version), s.setup.layout.tensors.size(), s.setup.layout.param_count,
              c.out.c_str(), c.format.c_str());
  if (!c.json) return exit_ok;
  json_line j;
  j.add("command", "replay export").add("version", c.version).add("format", c.format).add("out", c.out)
      .add("tensors", static_cast<std::int64_t>(s.setup.layout.tensors.size()))
      .add("parameters", static_cast<std::int64_t>(s.setup.layout.param_count));
  return print_json(j);
}

// ---- tape ---------------------------------------------------------------------------

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

int run_tape(const replay_cli& c, const opened_store& s) {
  std::printf("%8s  %8s  %8s  %9s  %9s  %-13s  %-30s  %s\n", "round", "fragment", "version", "quorum ms", "grace ms",
              "closed by", "members (weight)", "late");
  std::string rows;
  std::size_t count = 0;
  auto ok = s.store->for_each_tape([&](const storage::tape_record& t) {
    if (t.round < c.from_round || t.round > c.to_round) return true;
    const double quorum_ms = t.quorum_ns < 0 ? std::nan("") : static_cast<double>(t.quorum_ns - t.opened_ns) * 1e-6;
    std::printf("%8llu  %8u  %8llu  %9.1f  %9.1f  %-13s  %-30s  %s\n", static_cast<unsigned long long>(t.round),
                t.fragment, static_cast<unsigned long long>(t.version), quorum_ms,
                static_cast<double>(t.grace_ns) * 1e-6, t.reason.c_str(), members_text(t.members, true).c_str(),
                members_text(t.late, false).c_str());
    std::string members, late;
    for (const auto& m : t.members) {
      json_line e;
      e.add("learner", static_cast<std::int64_t>(m.learner)).add("incarnation", m.incarnation).add("weight", m.weight)
          .add("tokens", m.tokens).add("steps", m.steps);
      members += (members.empty() ? "" : ",") + e.str();
    }
    for (const auto& m : t.late) late += (late.empty() ? "" : ",") + std::to_string(m.learner);
    json_line row;
    row.add("round", t.round).add("fragment", static_cast<std::int64_t>(t.fragment)).add("version", t.version)
        .add("quorum_ms", quorum_ms).add("grace_ms", static_cast<double>(t.grace_ns) * 1e-6).add("reason", t.reason)
        .add("committed_ns", static_cast<std::int64_t>(t.committed_ns))
        .add_raw("members", "[" + members + "]").add_raw("late", "[" + late + "]");
    rows += (rows.empty() ? "" : ",") + row.str();
    ++count;
    return true;
  });
  if (!ok) return report_input(ok.err());
  std::printf("%zu rounds\n", count);
  if (!c.json) return exit_ok;
  json_line j;
  j.add("command", "replay tape").add("count", static_cast<std::int64_t>(count)).add_raw("rounds", "[" + rows + "]");
  return print_json(j);
}

// ---- verify: re-apply every recorded merge, bit for bit ----------------------------

int run_verify(const replay_cli& c, const opened_store& s) {
  // What to compare each replayed version against: its stored state, and every manifest naming it.
  std::map<std::pair<std::uint32_t, std::uint64_t>, std::uint64_t> named;  // (fragment, version) → checksum
  if (auto ok = s.store->for_each_manifest([&](const storage::manifest& m) {
        for (const auto& e : m.entries) named[{e.fragment, e.version}] = e.theta_checksum;
        return true;
      });
      !ok)
    return report_input(ok.err());
  auto stored = s.store->fragment_versions();
  if (!stored) return report_input(stored.err());
  std::map<std::uint32_t, std::vector<std::uint64_t>> states;
  for (const auto& [p, v] : *stored) states[p].push_back(v);

  shard_config sc = shard_settings(s.setup);
  sc.max_contributions_per_round = SIZE_MAX;
  const std::vector<float> zeros(s.setup.layout.total_floats, 0.f);

  std::size_t merges = 0, compared = 0, fragments = 0, unrecorded = 0;
  std::vector<std::string> failures;
  for (const auto& [p, versions] : states) {
    auto recorded = s.store->merge_versions(p);
    if (!recorded) return report_input(recorded.err());
    if (recorded->empty()) continue;
    // Start from the newest stored state at or before the first recorded merge.
    const std::uint64_t first = recorded->front();
    std::optional<std::uint64_t> start;
    for (std::uint64_t v : versions)
      if (v < first) start = v;
    if (!start) {
      failures.push_back("fragment " + std::to_string(p) + ": no stored state before its first recorded merge (version " +
                         std::to_string(first) + ")");
      continue;
    }
    auto base = s.store->read_fragment(p, *start);
    if (!base) return report_input(base.err());
    shard_core core(s.setup.layout, s.setup.plan, {{p}}, sc, zeros.data());
    if (auto ok = core.restore({p}, outer_state_of(std::move(*base))); !ok) return report_input(ok.err());
    ++fragments;
    const std::uint64_t last = recorded->back();
    unrecorded += static_cast<std::size_t>(std::count_if(versions.begin(), versions.end(),
                                                         [last](std::uint64_t v) { return v > last; }));
    for (std::uint64_t v = *start + 1; v <= last; ++v) {
      auto m = s.store->read_merge(p, v);
      if (!m) {
        failures.push_back("fragment " + std::to_string(p) + ": " + m.err().message + " (the chain breaks there)");
        break;
      }
      std::vector<learner_ref> members;
      for (auto& rc : m->contributions) {
        const learner_ref who{{rc.learner}, incarnation{rc.incarnation}};
        members.push_back(who);
        (void)core.on_contribution(round_number{m->round}, {p}, who, rc.steps, rc.tokens, std::move(rc.delta));
      }
      auto published = core.on_round_close(round_number{m->round}, {p}, members);
      if (!published || !*published || (*published)->version != v) {
        failures.push_back("fragment " + std::to_string(p) + " version " + std::to_string(v) +
                           ": the recorded contributions do not produce a new version");
        break;
      }
      ++merges;
      const auto& theta = core.value({p});
      const std::uint64_t sum = checksum64(theta.data(), theta.size() * 4);
      bool ok = true;
      if (auto it = named.find({p, v}); it != named.end()) {
        ++compared;
        ok = it->second == sum;
      }
      if (ok && std::binary_search(versions.begin(), versions.end(), v)) {
        auto f = s.store->read_fragment(p, v);
        if (!f) return report_input(f.err());
        ++compared;
        const auto state = core.outer_state({p});
        ok = f->theta == state.theta && f->momentum == state.momentum && f->adam_m == state.adam_m &&
             f->adam_v == state.adam_v;
      }
      if (!ok) {
        failures.push_back("fragment " + std::to_string(p) + " version " + std::to_string(v) +
                           ": replayed value differs from the stored one");
        break;
      }
    }
  }
  if (fragments == 0 && failures.empty())
    return report_input(make_error(errc::invalid_input, c.db + " has no recorded contributions: record a run with "
                                                         "`run --db DIR --record-contributions`"));
  for (const auto& f : failures) std::fprintf(stderr, "archipelago replay verify: %s\n", f.c_str());
  std::printf("replayed %zu merges over %zu fragments; %zu stored versions compared bit for bit: %s\n", merges,
              fragments, compared, failures.empty() ? "all identical" : "MISMATCH");
  if (unrecorded)
    std::printf("%zu stored versions are newer than the last recorded merge (written without "
                "--record-contributions): not verified\n", unrecorded);
  if (c.json) {
    json_line j;
    j.add("command", "replay verify").add("ok", failures.empty()).add("merges", static_cast<std::int64_t>(merges))
        .add("fragments", static_cast<std::int64_t>(fragments)).add("compared", static_cast<std::int64_t>(compared))
        .add("failures", static_cast<std::int64_t>(failures.size()))
        .add("unrecorded", static_cast<std::int64_t>(unrecorded));
    print_json(j);
  }
  return failures.empty() ? exit_ok : exit_failure;
}

}  // namespace

runner add_replay_command(CLI::App& app) {
  auto c = std::make_shared<replay_cli>();
  CLI::App* cmd = app.add_subcommand("replay", "Read a run's snapshots back: list, show, check, eval, sample, diff, "
                                               "export, tape, verify, resume");
  cmd->add_option("--db", c->db, "The snapshot directory (run --db, node --db)")->required();
  cmd->require_subcommand(1);
  auto add = [&](const std::string& name, const std::string& help) {
    CLI::App* sub = cmd->add_subcommand(name, help);
    sub->add_flag("--json", c->json, "Print a one-line JSON summary last");
    return sub;
  };
  auto version_arg = [&](CLI::App* sub, std::uint64_t& field, const std::string& name) {
    sub->add_option(name, field, "Mesh version (see replay list)")->required();
  };
  std::map<std::string, std::function<int(const replay_cli&, const opened_store&)>> subs;
  add("list", "Versions with time, tokens and eval loss where known");
  subs["list"] = run_list;
  version_arg(add("show", "One version: its fragments, versions and checksums"), c->version, "VERSION");
  subs["show"] = run_show;
  add("check", "Read every record; exit 2 if anything is corrupt, missing or out of order");
  subs["check"] = run_check;
  {
    CLI::App* sub = add("eval", "Eval loss of a version");
    version_arg(sub, c->version, "VERSION");
    sub->add_option("--corpus", c->corpus, "Evaluate on this text file's held-out part instead");
    sub->add_option("--threads", c->threads, "Compute threads")->check(CLI::Range(1, 256));
  }
  subs["eval"] = run_eval;
  {
    CLI::App* sub = add("sample", "Generate text from a version");
    version_arg(sub, c->version, "VERSION");
    sub->add_option("--prompt", c->sample.prompt, "Text to continue");
    sub->add_option("--bytes", c->sample.bytes, "Bytes to generate (default 256)");
    sub->add_option("--temperature", c->sample.temperature, "Sampling temperature > 0 (default 0.8)");
    sub->add_option("--seed", c->sample.seed, "Sampling seed");
  }
  subs["sample"] = run_sample_version;
  {
    CLI::App* sub = add("diff", "Change per fragment between two versions");
    version_arg(sub, c->version, "A");
    version_arg(sub, c->other, "B");
  }
  subs["diff"] = run_diff;
  {
    CLI::App* sub = add("export", "Write a version's tensors for numpy / PyTorch");
    version_arg(sub, c->version, "VERSION");
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

  CLI::App* resume = cmd->add_subcommand("resume", "Start a new run from a version (a rollback)");
  std::uint64_t* resume_version = &c->version;
  resume->add_option("VERSION", *resume_version, "Mesh version to start from")->required();
  add_run_flags(*resume, c->resume);

  return [c, cmd, resume, subs] {
    if (resume->parsed()) {
      run_options& o = c->resume;
      if (o.snapshots.db == c->db)
        return report_input(make_error(errc::invalid_input, "--db of the new run must differ from the replayed store"));
      o.snapshots.resume_db = c->db;
      o.snapshots.resume_version = c->version;
      return run_mesh_command(o);
    }
    auto s = open_replay(c->db);
    if (!s) return report_input(s.err());
    for (const auto& [name, fn] : subs)
      if (cmd->get_subcommand(name)->parsed()) return fn(*c, *s);
    return exit_bad_input;
  };
}

}  // namespace archipelago::cli
