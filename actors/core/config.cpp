#include "core/config.hpp"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include <toml++/toml.h>

#include "core/checksum.hpp"

namespace archipelago {
namespace {

status invalid(std::string message) { return status(make_error(errc::invalid_input, std::move(message))); }

template <class T>
std::string number_text(T value) {
  if constexpr (std::is_floating_point_v<T>) {
    std::ostringstream out;
    out.precision(10);
    out << value;
    std::string s = out.str();
    // Keep reals recognisable as reals in TOML.
    if (s.find_first_of(".eEn") == std::string::npos) s += ".0";
    return s;
  } else {
    return std::to_string(value);
  }
}

template <class T>
bool parse_number(std::string_view text, T& out) {
  if constexpr (std::is_floating_point_v<T>) {
    std::string copy(text);
    char* end = nullptr;
    const double v = std::strtod(copy.c_str(), &end);
    if (copy.empty() || end != copy.c_str() + copy.size() || !std::isfinite(v)) return false;
    out = static_cast<T>(v);
    return true;
  } else {
    auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), out);
    return ec == std::errc{} && ptr == text.data() + text.size();
  }
}

/// A numeric knob bounded to [lo, hi].
template <class Section, class T>
knob number_knob(std::string key, Section config::*section, T Section::*field, T lo, T hi,
                 std::string help) {
  knob k;
  k.key = key;
  k.type = std::is_floating_point_v<T> ? knob_type::real : knob_type::integer;
  k.bound = "[" + number_text(lo) + ", " + number_text(hi) + "]";
  k.help = std::move(help);
  k.set = [=](config& cfg, std::string_view text) -> status {
    T value{};
    if (!parse_number(text, value))
      return invalid(key + ": '" + std::string(text) + "' is not " +
                     (std::is_floating_point_v<T> ? "a finite number" : "an integer"));
    if (value < lo || value > hi)
      return invalid(key + " must be in [" + number_text(lo) + ", " + number_text(hi) + "], got " +
                     std::string(text));
    cfg.*section.*field = value;
    return {};
  };
  k.get = [=](const config& cfg) { return number_text(cfg.*section.*field); };
  return k;
}

template <class Section>
knob bool_knob(std::string key, Section config::*section, bool Section::*field, std::string help) {
  knob k;
  k.key = key;
  k.type = knob_type::boolean;
  k.bound = "true | false";
  k.help = std::move(help);
  k.set = [=](config& cfg, std::string_view text) -> status {
    if (text == "true" || text == "1") cfg.*section.*field = true;
    else if (text == "false" || text == "0") cfg.*section.*field = false;
    else return invalid(key + ": '" + std::string(text) + "' is not true or false");
    return {};
  };
  k.get = [=](const config& cfg) { return std::string(cfg.*section.*field ? "true" : "false"); };
  return k;
}

/// A text knob; `check` returns an error message for a bad value, empty if fine.
template <class Section>
knob text_knob(std::string key, Section config::*section, std::string Section::*field,
               std::string bound, std::string help,
               std::function<std::string(std::string_view)> check = {}) {
  knob k;
  k.key = key;
  k.type = knob_type::text;
  k.bound = std::move(bound);
  k.help = std::move(help);
  k.set = [=](config& cfg, std::string_view text) -> status {
    if (check) {
      if (auto problem = check(text); !problem.empty()) return invalid(key + ": " + problem);
    }
    cfg.*section.*field = std::string(text);
    return {};
  };
  k.get = [=](const config& cfg) { return cfg.*section.*field; };
  return k;
}

/// A comma-separated list of numbers, each in [lo, hi]; empty means "not given".
expected<std::vector<double>> parse_list(std::string_view text, double lo, double hi) {
  std::vector<double> out;
  if (text.empty()) return out;
  std::size_t start = 0;
  while (true) {
    const std::size_t comma = text.find(',', start);
    const std::string_view item = text.substr(start, comma == std::string_view::npos ? text.npos : comma - start);
    double v = 0;
    if (!parse_number(item, v))
      return make_error(errc::invalid_input, "'" + std::string(item) + "' is not a number");
    if (v < lo || v > hi)
      return make_error(errc::invalid_input, "'" + std::string(item) + "' is outside [" + number_text(lo) + ", " +
                                                 number_text(hi) + "]");
    out.push_back(v);
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  return out;
}

std::function<std::string(std::string_view)> list_check(double lo, double hi) {
  return [=](std::string_view text) -> std::string {
    auto list = parse_list(text, lo, hi);
    return list ? "" : list.err().message;
  };
}

std::vector<knob> make_knobs() {
  using I = std::int64_t;
  using U = std::uint64_t;
  auto m = &config::model;
  auto o = &config::optimizer;
  auto d = &config::data;
  auto t = &config::train;
  auto w = &config::wire;
  auto h = &config::mesh;
  auto l = &config::link;
  auto st = &config::storage;
  std::string presets;
  for (const auto& name : model_preset_names()) presets += (presets.empty() ? "" : " | ") + name;
  return {
      // model
      text_knob("model.size", m, &model_config::size, presets,
                "Named model size; the shape knobs below override it when non-zero. Default: nano.",
                [](std::string_view v) -> std::string {
                  auto p = model_preset(std::string(v));
                  return p ? "" : p.err().message;
                }),
      number_knob("model.context", m, &model_config::context, 0, 4096,
                  "Positions per sequence (T); 0 keeps the preset's. Default: 0."),
      number_knob("model.d_model", m, &model_config::d_model, 0, 8192,
                  "Residual width (C); 0 keeps the preset's. Default: 0."),
      number_knob("model.n_layer", m, &model_config::n_layer, 0, 256,
                  "Transformer blocks (L); 0 keeps the preset's. Default: 0."),
      number_knob("model.n_head", m, &model_config::n_head, 0, 8192,
                  "Attention heads; must divide d_model; 0 keeps the preset's. Default: 0."),
      bool_knob("model.tied", m, &model_config::tied,
                "Unembedding shares the token embedding. Default: true."),
      text_knob("model.layout", m, &model_config::layout, "path or empty",
                "A layout file (JSON: named float32 tensors with shapes) for a model of your own, trained by "
                "learners of the Python package; the shards start from its init laws. Native learners train "
                "only the GPT and refuse it. model.context still sets the data's window. Default: empty (the GPT)."),
      // optimizer
      number_knob("optimizer.lr", o, &optimizer_config::lr, 1e-9, 10.0,
                  "Peak inner AdamW learning rate. Default: 3e-3."),
      number_knob("optimizer.min_lr_ratio", o, &optimizer_config::min_lr_ratio, 0.0, 1.0,
                  "Cosine decay ends at lr * min_lr_ratio. Default: 0.1."),
      number_knob("optimizer.warmup_steps", o, &optimizer_config::warmup_steps, I{0}, I{1} << 40,
                  "Linear warm-up steps. Default: 100."),
      number_knob("optimizer.weight_decay", o, &optimizer_config::weight_decay, 0.0, 10.0,
                  "Decoupled weight decay on matrices (not biases, norms, embeddings). Default: 0.1."),
      number_knob("optimizer.beta1", o, &optimizer_config::beta1, 0.0, 0.999999,
                  "AdamW first-moment decay. Default: 0.9."),
      number_knob("optimizer.beta2", o, &optimizer_config::beta2, 0.0, 0.999999,
                  "AdamW second-moment decay. Default: 0.95."),
      number_knob("optimizer.eps", o, &optimizer_config::eps, 1e-30, 1.0,
                  "AdamW denominator epsilon. Default: 1e-8."),
      number_knob("optimizer.clip_norm", o, &optimizer_config::clip_norm, 0.0, 1e9,
                  "Global gradient-norm clip; 0 disables. Default: 1.0."),
      text_knob("optimizer.kind", o, &optimizer_config::kind, "adamw | muon",
                "The inner optimizer (dp: the shards' optimizer). adamw: AdamW on every tensor. muon: Muon on "
                "the 2-D weight matrices (Newton-Schulz orthogonalised Nesterov momentum, the update scaled "
                "to AdamW's RMS by 0.2 sqrt(max(rows, cols)), so optimizer.lr and weight_decay keep their "
                "meaning), AdamW on embeddings, the unembedding, biases and norms. Default: adamw.",
                [](std::string_view v) -> std::string {
                  if (v == "adamw" || v == "muon") return "";
                  return "unknown optimizer '" + std::string(v) + "' (adamw or muon)";
                }),
      number_knob("optimizer.muon_momentum", o, &optimizer_config::muon_momentum, 0.0, 0.9999,
                  "optimizer.kind = muon: momentum of the matrices' gradient average. Default: 0.95."),
      number_knob("optimizer.muon_ns_steps", o, &optimizer_config::muon_ns_steps, 1, 20,
                  "optimizer.kind = muon: Newton-Schulz iterations per update. Default: 5."),
      // data
      text_knob("data.corpus", d, &data_config::corpus, "path or empty",
                "Text file read as bytes; empty uses the built-in synthetic corpus. Default: empty."),
      number_knob("data.heldout_fraction", d, &data_config::heldout_fraction, 0.001, 0.5,
                  "Share of the corpus held out for evaluation. Default: 0.05."),
      number_knob("data.batch", d, &data_config::batch, 1, 4096,
                  "Sequences per step (B). Default: 32."),
      number_knob("data.eval_tokens", d, &data_config::eval_tokens, I{1}, I{1} << 32,
                  "Scored held-out tokens per evaluation (fewer if the held-out part is small). "
                  "Default: 65536."),
      number_knob("data.synthetic_bytes", d, &data_config::synthetic_bytes, I{1} << 12, I{1} << 32,
                  "Size of the generated synthetic corpus. Default: 8388608."),
      number_knob("data.synthetic_words", d, &data_config::synthetic_words, 4, 100000,
                  "Word vocabulary of the synthetic source. Default: 256."),
      number_knob("data.synthetic_seed", d, &data_config::synthetic_seed, U{0}, ~U{0},
                  "Seed of the synthetic source (its words and transition tables). Default: 7."),
      // train
      number_knob("train.steps", t, &train_config::steps, I{1}, I{1} << 40,
                  "Optimizer steps (per learner in a mesh). Default: 3000; `run`: 1500."),
      number_knob("train.threads", t, &train_config::threads, 1, 256,
                  "Compute threads. Default: 2."),
      number_knob("train.seed", t, &train_config::seed, U{0}, ~U{0},
                  "Seed of initialization, data split and batch sampling. Default: 1."),
      number_knob("train.eval_every", t, &train_config::eval_every, I{0}, I{1} << 40,
                  "Steps between evaluations; 0 evaluates only at the end. Default: 250."),
      number_knob("train.time_limit_s", t, &train_config::time_limit_s, 0.0, 1e9,
                  "Stop after this many seconds of training; 0 means no limit. Default: 0."),
      text_knob("train.precision", t, &train_config::precision, "fp32 | bf16 | auto",
                "Inputs of the dense layers' GEMMs: fp32, or bf16 with fp32 accumulation, fp32 master "
                "weights and optimizer state (needs AVX512_BF16 or AMX; elsewhere it runs fp32 and says so "
                "in one line); auto picks bf16 where the CPU has it. Default: fp32.",
                [](std::string_view v) -> std::string {
                  for (const char* name : {"fp32", "bf16", "auto"})
                    if (v == name) return "";
                  return "unknown precision '" + std::string(v) + "' (fp32, bf16 or auto)";
                }),
      // mesh
      text_knob("mesh.mode", h, &mesh_config::mode, "dp | diloco | streaming | decoupled",
                "Synchronisation policy (docs/design/algorithm.md §8). Default: decoupled.",
                [](std::string_view v) -> std::string {
                  for (const char* name : {"dp", "diloco", "streaming", "decoupled"})
                    if (v == name) return "";
                  return "unknown mode '" + std::string(v) + "' (dp, diloco, streaming or decoupled)";
                }),
      number_knob("mesh.learners", h, &mesh_config::learners, 1, 1024, "Learners (M). Default: 4."),
      number_knob("mesh.shards", h, &mesh_config::shards, 1, 1024, "Parameter shards. Default: 2."),
      number_knob("mesh.fragments", h, &mesh_config::fragments, 1, 4096,
                  "Fragments (P) for decoupled and streaming; dp and diloco use one. Default: 24."),
      number_knob("mesh.quorum", h, &mesh_config::quorum, 1, 1024,
                  "Minimum quorum (K) of a decoupled round. Default: 1."),
      number_knob("mesh.rounds_in_flight", h, &mesh_config::rounds_in_flight, 1, 64,
                  "Rounds open at once (tau). Default: 2."),
      text_knob("mesh.fragment_order", h, &mesh_config::fragment_order, "round_robin | stalest | shuffled",
                "Which fragment each round's turn goes to: round_robin (turn r: fragment r mod P; a paused "
                "fragment's turns pass unused), stalest (the fragment whose last round opened longest ago "
                "among those that can open: a paused fragment's turns go to the others, and it goes first "
                "once it can open again) or shuffled (every cycle of P turns in a new order, seeded by "
                "train.seed). Default: round_robin.",
                [](std::string_view v) -> std::string {
                  if (parse_fragment_order(v)) return "";
                  return "unknown fragment order '" + std::string(v) + "' (round_robin, stalest or shuffled)";
                }),
      number_knob("mesh.grace_factor", h, &mesh_config::grace_factor, 0.0, 10.0,
                  "Grace safety factor (gamma). Default: 0.8."),
      bool_knob("mesh.grace", h, &mesh_config::grace,
                "Adaptive grace window after the quorum (decoupled). Default: true."),
      number_knob("mesh.ema_alpha", h, &mesh_config::ema_alpha, 0.01, 1.0,
                  "Weight of the newest sample in the timing EMAs. Default: 0.5."),
      number_knob("mesh.outer_lr", h, &mesh_config::outer_lr, 0.0, 10.0,
                  "Outer learning rate (eta_out). Default: 0.6."),
      number_knob("mesh.outer_momentum", h, &mesh_config::outer_momentum, 0.0, 0.999,
                  "Outer Nesterov momentum (mu). Default: 0.6."),
      number_knob("mesh.outer_warmup", h, &mesh_config::outer_warmup, I{0}, I{1} << 40,
                  "Outer steps of each fragment over which eta_out ramps linearly from eta_out/W up to "
                  "eta_out (a fragment resumed past them takes the full step); 0: none. Default: 0."),
      text_knob("mesh.merge", h, &mesh_config::merge, "rda | mean",
                "How shards merge the learners' deltas: radial-directional averaging (rda) or the "
                "token-weighted mean (mean, the ablation baseline); embeddings always take the mean. "
                "Default: rda.",
                [](std::string_view v) -> std::string {
                  if (v == "rda" || v == "mean") return "";
                  return "unknown merge '" + std::string(v) + "' (rda or mean)";
                }),
      bool_knob("mesh.robust", h, &mesh_config::robust,
                "Robust merge on the shards: every member of a round is screened for staleness (its anchor "
                "version, mesh.robust_max_anchor_lag; a replayed delta), by its delta's norm per sqrt(step) "
                "(mesh.robust_norm_factor; rejected or clipped, mesh.robust_screen) and by its direction "
                "(mesh.robust_min_cosine, mesh.robust_cosine_ratio); mesh.robust_trim > 0 makes the merge's "
                "means coordinate-wise trimmed. Default: false."),
      number_knob("mesh.robust_norm_factor", h, &mesh_config::robust_norm_factor, 1.0, 1e6,
                  "mesh.robust: a member whose delta norm per sqrt(step) exceeds this times the lower "
                  "median of the round's members (3 or more; else of them and the fragment's trusted ones, "
                  "mesh.robust_window) is screened. Default: 3."),
      number_knob("mesh.robust_window", h, &mesh_config::robust_window, 1, 4096,
                  "mesh.robust: trusted figures (the members accepted in the fragment's latest rounds of 3 or "
                  "more: norms per sqrt(step), cosines with its descent) remembered per fragment, the newest; "
                  "the reference of rounds of fewer than 3 members. Default: 4."),
      text_knob("mesh.robust_screen", h, &mesh_config::robust_screen, "reject | clip",
                "mesh.robust: what happens to a member above the norm bound: rejected (the ledger "
                "counts it rejected, with the reason in the log) or clipped to the bound and merged. "
                "Default: reject.",
                [](std::string_view v) -> std::string {
                  if (v == "reject" || v == "clip") return "";
                  return "unknown robust_screen '" + std::string(v) + "' (reject or clip)";
                }),
      number_knob("mesh.robust_trim", h, &mesh_config::robust_trim, 0, 64,
                  "mesh.robust: contributions dropped per side per coordinate in the merge's weighted "
                  "means (at most (members - 1) / 2; 0: no trimming, screening only). Default: 0."),
      number_knob("mesh.robust_min_cosine", h, &mesh_config::robust_min_cosine, -1.0, 1.0,
                  "mesh.robust: a member whose delta's cosine with the reference direction (the coordinate-wise "
                  "median of the other members' unit deltas with 3 or more members, else the fragment's recent descent: "
                  "the opposite of its outer momentum) is below this is rejected: a sign-flipped delta of honest "
                  "norm points against the others. -1 turns the direction screen off. Default: 0."),
      number_knob("mesh.robust_cosine_ratio", h, &mesh_config::robust_cosine_ratio, 0.0, 1.0,
                  "mesh.robust: a member whose cosine with the reference direction is below this times the "
                  "honest level (the lower median of the round's members' cosines with 3 or more, else of the "
                  "fragment's trusted cosines with its descent) is rejected too: a random or steadily sideways "
                  "delta of honest norm. 0: mesh.robust_min_cosine alone. Default: 0.5."),
      number_knob("mesh.robust_max_anchor_lag", h, &mesh_config::robust_max_anchor_lag, I{1}, I{1} << 40,
                  "mesh.robust: a contribution anchored more than this many versions behind its fragment (or on "
                  "one not yet published) is rejected as stale. Default: 64."),
      text_knob("mesh.etcd", h, &mesh_config::etcd, "http://HOST:PORT[,http://HOST:PORT...]",
                "etcd's client URLs: a broker leads only while it holds the mesh's lease there, in "
                "an epoch etcd allocates, so two brokers never lead at once (brokers only; not part "
                "of the mesh agreement). Empty: brokers elect by the control lane's liveness. "
                "Default: empty.",
                [](std::string_view v) -> std::string {
                  if (v.empty()) return "";
                  auto endpoints = parse_etcd_endpoints(v);
                  return endpoints ? "" : endpoints.err().message;
                }),
      number_knob("mesh.mix", h, &mesh_config::mix, -1.0, 1.0,
                  "alpha_mix on receipt of a fragment; -1 takes the mode's (0, streaming 0.5). "
                  "Default: -1."),
      number_knob("mesh.inner_steps", h, &mesh_config::inner_steps, 1, 1000000,
                  "Inner steps between two syncs of a fragment (H) in diloco and streaming. Default: 50."),
      bool_knob("mesh.rebase", h, &mesh_config::rebase,
                "On receipt of a merged fragment a learner keeps the progress it made since it last "
                "contributed it (theta_p <- Theta_p + theta_p - theta_p at that contribution; since the "
                "anchor when it did not) instead of overwriting it, and contributes that progress "
                "next: no step is thrown away by the overlap. Excludes mesh.mix > 0 (streaming's "
                "default 0.5 becomes 0). No effect in dp. Default: false."),
      bool_knob("mesh.flush", h, &mesh_config::flush,
                "A learner done with its steps leaves only once every fragment's work is in a version "
                "it received: it answers rounds until then (bounded by mesh.round_timeout_s), so the "
                "last steps are merged instead of lost. The synchronous modes wait for that anyway. "
                "Default: false."),
      bool_knob("mesh.catch_up", h, &mesh_config::catch_up,
                "Decoupled only: a learner holding an older version of a fragment than the one a round "
                "opens on (it was cut off, or broadcasts were lost) fetches the newest and contributes "
                "to it only from there: its local progress stays, its anchor becomes the mesh's value "
                "and its step and token counts are divided by 1 + the versions it missed (the steps "
                "dropped are booked overwritten). Without it, its first delta is measured from the "
                "old anchor, over every step since, and is merged onto the newer value. "
                "Default: false."),
      number_knob("mesh.warm_start", h, &mesh_config::warm_start, I{0}, I{1} << 40,
                  "A synchronous warm start: the first N steps of the schedule run as dp (the learners' "
                  "gradients averaged every step), then the mode runs the rest of the schedule from dp's "
                  "model. The one-process mesh only (run, bench); no effect in dp. 0: none. Default: 0."),
      bool_knob("mesh.elastic", h, &mesh_config::elastic,
                "dp, diloco, streaming: rounds stop waiting for a dead learner (false: they stall "
                "until it is back, the non-elastic baseline). Default: true."),
      number_knob("mesh.round_timeout_s", h, &mesh_config::round_timeout_s, 0.01, 86400.0,
                  "Bound on any open round; a learner waiting for a fragment this long re-fetches it. "
                  "Default: 60."),
      text_knob("mesh.learner_threads", h, &mesh_config::learner_threads, "list of M integers",
                "Compute threads per learner, e.g. \"2,1,1\". Default: train.threads / M, at least 1.",
                list_check(1, 256)),
      text_knob("mesh.learner_batch", h, &mesh_config::learner_batch, "list of M integers",
                "Sequences per step per learner. Default: data.batch.", list_check(1, 4096)),
      text_knob("mesh.learner_slowdown", h, &mesh_config::learner_slowdown, "list of M numbers",
                "Step-time factor per learner (>= 1; a slow learner is paced). Default: 1.",
                list_check(1, 1000)),
      number_knob("mesh.step_time_ms", h, &mesh_config::step_time_ms, 0.0, 3.6e6,
                  "A fixed compute budget: every inner step takes at least this long (the learner "
                  "sleeps the rest); drills use it so a lost learner does not speed up the others. "
                  "0: as fast as the CPU allows. Default: 0."),
      number_knob("mesh.global_eval_every", h, &mesh_config::global_eval_every, I{0}, I{1} << 40,
                  "Learner 0 evaluates the global model it holds (the fragments it last received, at "
                  "their versions) every this many of its steps and when it leaves: a mesh of nodes' "
                  "eval curve (its status, /metrics and log). 0: never. Default: 0."),
      // wire
      number_knob("wire.heartbeat_interval_ms", w, &wire_config::heartbeat_interval_ms, I{10}, I{600000},
                  "Heartbeat interval, both ways, on the control lane; any control message counts. "
                  "Default: 1000."),
      number_knob("wire.liveness", w, &wire_config::liveness, 1, 100,
                  "Silent heartbeat intervals before a peer is dead. Default: 3."),
      number_knob("wire.reconnect_initial_ms", w, &wire_config::reconnect_initial_ms, I{1}, I{600000},
                  "First reconnect delay after a peer died; doubles, with jitter. Default: 100."),
      number_knob("wire.reconnect_max_ms", w, &wire_config::reconnect_max_ms, I{1}, I{3600000},
                  "Cap of the reconnect delay. Default: 5000."),
      number_knob("wire.socket_hwm", w, &wire_config::socket_hwm, 1, 1000000,
                  "ZeroMQ high-water mark per socket, in messages. Default: 64."),
      number_knob("wire.outbox_capacity", w, &wire_config::outbox_capacity, I{1}, I{1} << 24,
                  "Messages actors may queue for the I/O thread; beyond it sends fail as overloaded. "
                  "Default: 1024."),
      number_knob("wire.peer_queue_capacity", w, &wire_config::peer_queue_capacity, I{1}, I{1} << 24,
                  "Messages waiting for one peer's socket; beyond it they are dropped and counted. "
                  "Default: 256."),
      number_knob("wire.max_tensor_bytes", w, &wire_config::max_tensor_bytes, I{1} << 10, I{1} << 31,
                  "Largest tensor frame accepted. Default: 1073741824."),
      number_knob("wire.bulk_piece_bytes", w, &wire_config::bulk_piece_bytes, I{1} << 10, I{1} << 30,
                  "On an emulated slow link (link.*, chaos link faults), tensor messages enter the link "
                  "in pieces of this size so that control messages wait behind one piece, not a whole "
                  "fragment. Default: 65536."),
      number_knob("wire.bulk_sndbuf_bytes", w, &wire_config::bulk_sndbuf_bytes, I{0}, I{1} << 30,
                  "Kernel send buffer of the bulk (tensor) connections, fixed: bounds the tensor bytes "
                  "in flight per link. 0: adaptive (wire.bulk_queue_target_ms). Default: 0."),
      number_knob("wire.bulk_queue_target_ms", w, &wire_config::bulk_queue_target_ms, 0.0, 10000.0,
                  "Over tcp://, each bulk connection's send buffer (its bytes in flight) follows the "
                  "queueing delay it causes (its RTT above its minimum), shrinking above this target "
                  "and growing below it, so that heartbeats crossing the same bottleneck wait about "
                  "this long behind tensors. 0: the OS's autotuning (unbounded queues). Default: 50."),
      text_knob("wire.encoding", w, &wire_config::encoding, "fp32 | bf16 | int8 | int4 | int2",
                "Encoding of outer gradients on the wire. Default: fp32.",
                [](std::string_view v) -> std::string {
                  for (const char* name : {"fp32", "bf16", "int8", "int4", "int2"})
                    if (v == name) return "";
                  return "'" + std::string(v) + "' is not one of fp32, bf16, int8, int4, int2";
                }),
      number_knob("wire.block_size", w, &wire_config::block_size, 8, 65536,
                  "Values per quantisation block (int8/int4/int2). Default: 64."),
      bool_knob("wire.error_feedback", w, &wire_config::error_feedback,
                "Error feedback for the lossy encodings (bf16, int8, int4, int2): a learner keeps, per fragment, "
                "what encoding its contribution dropped and adds it to its next contribution of that fragment, so "
                "that the sum of what it sends follows the sum of its deltas (the gap stays within one "
                "contribution's encoding error). No effect on fp32. Default: false."),
      bool_knob("wire.curve", w, &wire_config::curve,
                "CURVE encryption and authentication on tcp:// endpoints. Default: true."),
      bool_knob("wire.accept_chaos", w, &wire_config::accept_chaos,
                "Obey ChaosCommand messages (link shaping, slow-down, storage faults) from the chaos "
                "monkey; only for fault drills. Default: false."),
      text_knob("wire.key_file", w, &wire_config::key_file, "path",
                "This node's CURVE keypair, written by archipelago keygen. Default: empty."),
      text_knob("wire.allow", w, &wire_config::allow, "path",
                "Public keys allowed to connect: a directory of *.pub files or a list file. "
                "Default: empty."),
      // link
      number_knob("link.bandwidth_mbit", l, &link_config::bandwidth_mbit, 0.0, 1e6,
                  "Emulated bandwidth of each outgoing link in Mbit/s; 0 = unlimited. Default: 0."),
      number_knob("link.latency_ms", l, &link_config::latency_ms, 0.0, 3.6e6,
                  "Emulated one-way latency. Default: 0."),
      number_knob("link.jitter_ms", l, &link_config::jitter_ms, 0.0, 3.6e6,
                  "Emulated jitter, uniform in [0, jitter]; order is kept. Default: 0."),
      number_knob("link.loss", l, &link_config::loss, 0.0, 1.0, "Probability a message is lost. Default: 0."),
      number_knob("link.duplicate", l, &link_config::duplicate, 0.0, 1.0,
                  "Probability a message is delivered twice. Default: 0."),
      number_knob("link.reorder", l, &link_config::reorder, 0.0, 1.0,
                  "Probability a message is held back and overtaken. Default: 0."),
      number_knob("link.corrupt", l, &link_config::corrupt, 0.0, 1.0,
                  "Probability a bit of a message is flipped (checksums catch it). Default: 0."),
      // storage
      number_knob("storage.keep_last", st, &storage_config::keep_last, I{1}, I{1} << 40,
                  "Snapshots (mesh versions) kept, newest first. Default: 32."),
      number_knob("storage.keep_every", st, &storage_config::keep_every, I{0}, I{1} << 40,
                  "Also keep every mesh version divisible by this; 0: none. Default: 100."),
      number_knob("storage.keep_mb", st, &storage_config::keep_mb, I{0}, I{1} << 40,
                  "Bound in MiB on the fragment states a store keeps (each store: a shard's, a run's): "
                  "beyond it the oldest snapshots go, whatever kept them; the newest always stays. 0: no "
                  "bound. Default: 16384."),
      bool_knob("storage.sync", st, &storage_config::sync,
                "fsync every snapshot commit (survives power loss, not only a process crash). Default: false."),
      number_knob("storage.queue_mb", st, &storage_config::queue_mb, I{1}, I{1} << 20,
                  "Bytes the snapshot writer's queue may hold (merge records, the broker's tape and ledger; a "
                  "shard's fragment states are its own buffers and count nothing); beyond it a record is refused "
                  "and tried again (never blocks a round). Default: 256."),
      number_knob("storage.backlog", st, &storage_config::backlog, I{0}, I{1024},
                  "Back-pressure: the broker holds a shard's next rounds while this many of its merged versions "
                  "are not yet durable (its storage is slower than the rounds), counted in "
                  "archipelago_rounds_held_for_storage_total; 0: never held (each fragment still waits for its own last version). Default: 0."),
  };
}

const knob* find_knob(std::string_view key) {
  for (const auto& k : knobs())
    if (k.key == key) return &k;
  return nullptr;
}

}  // namespace

const std::vector<knob>& knobs() {
  static const std::vector<knob> table = make_knobs();
  return table;
}

status set_knob(config& cfg, std::string_view key, std::string_view value) {
  const knob* k = find_knob(key);
  if (k == nullptr)
    return invalid("unknown configuration key '" + std::string(key) +
                   "' (archipelago config --knobs lists them)");
  return k->set(cfg, value);
}

status set_knob_assignment(config& cfg, std::string_view assignment) {
  const auto eq = assignment.find('=');
  if (eq == std::string_view::npos || eq == 0)
    return invalid("expected key=value, got '" + std::string(assignment) + "'");
  return set_knob(cfg, assignment.substr(0, eq), assignment.substr(eq + 1));
}

config run_defaults() {
  config cfg;
  cfg.train.steps = 1500;
  return cfg;
}

status apply_toml(config& cfg, std::string_view toml_text, const std::string& origin) {
  // Debian's toml++ is built with exceptions; they stop at this boundary.
  toml::table root;
  try {
    root = toml::parse(toml_text, origin);
  } catch (const toml::parse_error& e) {
    return invalid(origin + ":" + std::to_string(e.source().begin.line) + ": " +
                   std::string(e.description()));
  }
  status result;
  root.for_each([&](const toml::key& section, const toml::node& node) {
    if (!result) return;
    const auto* table = node.as_table();
    if (table == nullptr) {
      result = invalid(origin + ": top-level key '" + std::string(section.str()) +
                       "' must be a [section]");
      return;
    }
    table->for_each([&](const toml::key& name, const toml::node& value) {
      if (!result) return;
      const std::string key = std::string(section.str()) + "." + std::string(name.str());
      const knob* k = find_knob(key);
      if (k == nullptr) {
        result = invalid(origin + ":" + std::to_string(name.source().begin.line) +
                         ": unknown configuration key '" + key + "'");
        return;
      }
      std::string text;
      bool type_ok = false;
      switch (k->type) {
        case knob_type::integer:
          if (auto v = value.value_exact<std::int64_t>()) text = std::to_string(*v), type_ok = true;
          break;
        case knob_type::real:
          if (auto v = value.value<double>()) text = number_text(*v), type_ok = true;
          break;
        case knob_type::boolean:
          if (auto v = value.value_exact<bool>()) text = *v ? "true" : "false", type_ok = true;
          break;
        case knob_type::text:
          if (auto v = value.value_exact<std::string>()) text = *v, type_ok = true;
          break;
      }
      if (!type_ok) {
        result = invalid(origin + ":" + std::to_string(value.source().begin.line) + ": " + key +
                         " has the wrong type (expected " +
                         (k->type == knob_type::integer ? "an integer"
                          : k->type == knob_type::real  ? "a number"
                          : k->type == knob_type::boolean ? "true or false"
                                                         : "a string") +
                         ")");
        return;
      }
      if (auto s = k->set(cfg, text); !s)
        result = invalid(origin + ": " + s.err().message);
    });
  });
  return result;
}

status apply_toml_file(config& cfg, const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return status(make_error(errc::not_found, "cannot read config file '" + path + "'"));
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) return status(make_error(errc::io_error, "error reading config file '" + path + "'"));
  return apply_toml(cfg, text.str(), path);
}

std::string to_toml(const config& cfg) {
  std::string out;
  std::string current_section;
  for (const auto& k : knobs()) {
    const auto dot = k.key.find('.');
    const std::string section = k.key.substr(0, dot);
    if (section != current_section) {
      out += (out.empty() ? "[" : "\n[") + section + "]\n";
      current_section = section;
    }
    std::string value = k.get(cfg);
    if (k.type == knob_type::text) {
      // A TOML basic string: quotes and backslashes escaped, and every control
      // character but tab as \uXXXX (TOML refuses them raw: a value read from an
      // escape must be written back as one, or the file does not read back).
      std::string quoted = "\"";
      for (char c : value) {
        const auto u = static_cast<unsigned char>(c);
        if (c == '"' || c == '\\') {
          quoted += '\\';
          quoted += c;
        } else if ((u < 0x20 && c != '\t') || u == 0x7f) {
          char escape[8];
          std::snprintf(escape, sizeof escape, "\\u%04x", u);
          quoted += escape;
        } else {
          quoted += c;
        }
      }
      value = quoted + "\"";
    }
    out += k.key.substr(dot + 1) + " = " + value + "\n";
  }
  return out;
}

expected<model_shape> resolve_model(const model_config& m) {
  auto preset = model_preset(m.size);
  if (!preset) return preset.err();
  model_shape s = *preset;
  if (m.context) s.context = m.context;
  if (m.d_model) s.d_model = m.d_model;
  if (m.n_layer) s.n_layer = m.n_layer;
  if (m.n_head) s.n_head = m.n_head;
  s.tied = m.tied;
  if (auto ok = validate(s); !ok) return ok.err();
  return s;
}

expected<param_layout> resolve_layout(const config& cfg) {
  auto shape = resolve_model(cfg.model);
  if (!shape) return shape.err();
  if (cfg.model.layout.empty()) return make_layout(*shape);
  auto layout = load_layout_file(cfg.model.layout);
  if (!layout) return make_error(layout.err().code, "model.layout: " + layout.err().message);
  layout->shape = *shape;  // the data's context (model.context) still comes from the shape
  return layout;
}

status validate(const config& cfg) {
  if (auto layout = resolve_layout(cfg); !layout) return status(layout.err());
  if (cfg.wire.reconnect_max_ms < cfg.wire.reconnect_initial_ms)
    return invalid("wire.reconnect_max_ms (" + std::to_string(cfg.wire.reconnect_max_ms) +
                   ") must be at least wire.reconnect_initial_ms (" +
                   std::to_string(cfg.wire.reconnect_initial_ms) + ")");
  return {};
}

status validate_mesh(const config& cfg) {
  if (auto ok = validate(cfg); !ok) return ok;
  const mesh_config& m = cfg.mesh;
  if (m.quorum > m.learners)
    return invalid("mesh.quorum (" + std::to_string(m.quorum) + ") must not exceed mesh.learners (" +
                   std::to_string(m.learners) + ")");
  // dp and diloco have one fragment, hence one shard whatever mesh.shards says.
  if (m.mode != "dp" && m.mode != "diloco") {
    if (m.shards > m.fragments)
      return invalid("mesh.shards (" + std::to_string(m.shards) + ") must not exceed mesh.fragments (" +
                     std::to_string(m.fragments) + ")");
    if (auto plan = make_fragment_plan(*resolve_layout(cfg), m.fragments); !plan)
      return invalid("mesh.fragments: " + plan.err().message);
  }
  if (m.warm_start >= cfg.train.steps && m.mode != "dp")
    return invalid("mesh.warm_start (" + std::to_string(m.warm_start) + ") must be below train.steps (" +
                   std::to_string(cfg.train.steps) + "): the mode runs the steps after it");
  if (m.rebase && m.mix > 0)
    return invalid("mesh.rebase and mesh.mix > 0 both say what a learner does on receipt of a fragment: "
                   "choose one");
  for (const auto& [key, text] : {std::pair{"mesh.learner_threads", &m.learner_threads},
                                  std::pair{"mesh.learner_batch", &m.learner_batch},
                                  std::pair{"mesh.learner_slowdown", &m.learner_slowdown}}) {
    auto list = parse_list(*text, 0, 1e9);
    if (!list) return invalid(std::string(key) + ": " + list.err().message);
    if (!list->empty() && list->size() != static_cast<std::size_t>(m.learners))
      return invalid(std::string(key) + " has " + std::to_string(list->size()) + " values for " +
                     std::to_string(m.learners) + " learners (give one per learner)");
  }
  return {};
}

expected<sync_policy> resolve_policy(const config& cfg) {
  if (auto ok = validate_mesh(cfg); !ok) return ok.err();
  const mesh_config& m = cfg.mesh;
  sync_policy p;
  p.mode = m.mode;
  p.shards = m.shards;
  p.rounds_in_flight = m.rounds_in_flight;
  // The synchronous modes wait for every live learner; non-elastic ones also
  // need all M to be live (a dead learner stalls them).
  p.wait_for_all = true;
  p.adaptive_grace = false;
  p.quorum = m.elastic ? 1 : m.learners;
  if (m.mode == "dp") {
    p.fragments = p.shards = 1;
    p.rounds_in_flight = 1;
    p.contribute_after = 1;
    p.wait_slack = 0;  // a learner waits for the new parameters before its next step
    p.send_gradients = true;
  } else if (m.mode == "diloco") {
    p.fragments = p.shards = 1;
    p.rounds_in_flight = 1;
    p.contribute_after = m.inner_steps;
    p.steps_per_round = m.inner_steps;
    p.wait_slack = 0;  // waits for the merged model at the end of each H-step phase
  } else if (m.mode == "streaming") {
    p.fragments = m.fragments;
    p.contribute_after = m.inner_steps;
    p.steps_per_round = static_cast<double>(m.inner_steps) / m.fragments;  // each fragment every H steps
    p.wait_slack = m.rounds_in_flight;  // waits only when a fragment's result is τ steps overdue
    p.mix = 0.5;
  } else {  // decoupled
    p.fragments = m.fragments;
    p.quorum = m.quorum;
    p.wait_for_all = false;
    p.adaptive_grace = m.grace;
    p.catch_up = m.catch_up;
  }
  if (m.mix >= 0) p.mix = m.mix;
  // dp's learners never move θ between a contribution and the update.
  if (m.rebase && !p.send_gradients) {
    p.rebase = true;
    p.mix = 0;
  }
  return p;
}

expected<std::vector<std::string>> parse_etcd_endpoints(std::string_view list) {
  std::vector<std::string> out;
  std::size_t start = 0;
  while (start <= list.size()) {
    const std::size_t comma = std::min(list.find(',', start), list.size());
    const std::string_view e = list.substr(start, comma - start);
    start = comma + 1;
    if (e.empty()) continue;
    if (!e.starts_with("http://") || e.size() <= 7 || e.find('/', 7) != e.npos)
      return make_error(errc::invalid_input, "'" + std::string(e) + "' is not http://HOST:PORT (etcd's client URL)");
    out.emplace_back(e);
  }
  if (out.empty()) return make_error(errc::invalid_input, "no etcd endpoint in '" + std::string(list) + "'");
  return out;
}

std::uint64_t mesh_agreement_hash(const config& cfg) {
  const mesh_config& m = cfg.mesh;
  std::string text = m.mode + "|" + std::to_string(m.fragments) + "|" + std::to_string(m.shards) + "|" +
                           std::to_string(m.inner_steps) + "|" + std::to_string(m.rounds_in_flight) + "|" +
                           cfg.wire.encoding;
  // Appended only when not the default, so meshes configured before the knob keep their hash.
  if (m.merge != "rda") text += "|merge=" + m.merge;
  return checksum64(text.data(), text.size());
}

learner_profile learner_profile_of(const config& cfg, int index) {
  const mesh_config& m = cfg.mesh;
  auto pick = [&](const std::string& text, double fallback) {
    auto list = parse_list(text, 0, 1e9);
    return list && static_cast<std::size_t>(index) < list->size() ? (*list)[static_cast<std::size_t>(index)]
                                                                   : fallback;
  };
  learner_profile p;
  p.threads = static_cast<int>(pick(m.learner_threads, std::max(1, cfg.train.threads / std::max(1, m.learners))));
  p.batch = static_cast<int>(pick(m.learner_batch, cfg.data.batch));
  p.slowdown = pick(m.learner_slowdown, 1.0);
  return p;
}

}  // namespace archipelago
