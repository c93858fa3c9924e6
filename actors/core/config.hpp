#pragma once
// Configuration: one TOML file plus flags that override it. Every knob, with its
// default, bound and meaning, is declared once, in the table in config.cpp;
// `archipelago config --knobs` prints that table.

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.hpp"
#include "core/layout.hpp"

namespace archipelago {

struct model_config {
  std::string size = "nano";  // preset; the fields below override it when non-zero
  int context = 0;
  int d_model = 0;
  int n_layer = 0;
  int n_head = 0;
  bool tied = true;
  std::string layout;  // a layout file (core/layout.hpp); empty: the GPT of the shape above
};

struct optimizer_config {
  double lr = 3e-3;            // peak inner learning rate
  double min_lr_ratio = 0.1;   // cosine decays to lr * min_lr_ratio
  std::int64_t warmup_steps = 100;
  double weight_decay = 0.1;   // decoupled; matrices only
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double clip_norm = 1.0;      // global gradient norm; 0 disables clipping
  // adamw: AdamW on every tensor. muon: Muon on the 2-D weight matrices (Newton–Schulz
  // orthogonalised Nesterov momentum), AdamW on embeddings, the unembedding and vectors.
  std::string kind = "adamw";
  double muon_momentum = 0.95;  // Muon's momentum (an EMA of the gradient)
  int muon_ns_steps = 5;        // Newton–Schulz iterations per update
};

struct data_config {
  std::string corpus;                   // empty: the built-in synthetic corpus
  double heldout_fraction = 0.05;
  int batch = 32;                       // sequences per step
  std::int64_t eval_tokens = 65536;     // scored tokens per evaluation
  std::int64_t synthetic_bytes = 8 << 20;
  int synthetic_words = 256;            // vocabulary of the synthetic source
  std::uint64_t synthetic_seed = 7;
};

struct train_config {
  std::int64_t steps = 3000;
  int threads = 2;                      // compute threads (OpenMP)
  std::uint64_t seed = 1;
  std::int64_t eval_every = 250;        // steps between evaluations; 0: only at the end
  double time_limit_s = 0;              // stop early after this wall time; 0: no limit
  std::string precision = "fp32";       // dense GEMM inputs: fp32 | bf16 | auto (fp32 accumulation)
};

/// The mesh (docs/design/algorithm.md §2, §8). The mode picks the synchronisation policy;
/// the knobs below refine it where the mode leaves a choice.
struct mesh_config {
  std::string mode = "decoupled";  // dp | diloco | streaming | decoupled
  int learners = 4;                // M
  int shards = 2;                  // parameter shards
  int fragments = 24;              // P (decoupled, streaming); dp and diloco use 1
  int quorum = 1;                  // K (decoupled); the synchronous modes wait for all
  int rounds_in_flight = 2;        // τ
  std::string fragment_order = "round_robin";  // which fragment a round's turn goes to: round_robin | stalest | shuffled
  double grace_factor = 0.8;       // γ
  bool grace = true;               // adaptive grace window (decoupled)
  double ema_alpha = 0.5;          // smoothing of the timing estimates
  // η_out and μ: DiLoCo's 0.7 and 0.9 suit syncs every ~500 steps; a fragment
  // here syncs every ~P steps, where they overshoot (docs/design/algorithm.md §2).
  double outer_lr = 0.6;           // η_out
  double outer_momentum = 0.6;     // μ
  std::int64_t outer_warmup = 0;   // outer steps per fragment over which η_out ramps up; 0: none
  std::string merge = "rda";       // shards' merge of deltas: rda | mean (the weighted-mean ablation)
  // The robust merge (shards only; docs/guides/robust-merge.md): staleness,
  // norm and direction screening of each member at close, optionally a trimmed merge.
  bool robust = false;
  double robust_norm_factor = 3;   // norm bound = the lower median of the round's (and trusted) norms × this
  int robust_window = 4;           // trusted figures remembered per fragment
  std::string robust_screen = "reject";  // reject | clip
  int robust_trim = 0;             // contributions trimmed per side per coordinate
  double robust_min_cosine = 0;    // direction screen: reject below this cosine; -1: off
  double robust_cosine_ratio = 0.5;  // ... and below this × the honest members' cosine
  std::int64_t robust_max_anchor_lag = 64;  // staleness: versions a contribution's anchor may lag
  double mix = -1;                 // α_mix; -1: the mode's (0, streaming 0.5)
  bool rebase = false;             // on receipt keep the progress not yet contributed (excludes mix)
  bool flush = false;              // a learner done with its steps leaves once all its work is merged
  bool catch_up = false;           // decoupled: a learner that missed versions of a fragment fetches first
  // A synchronous warm start: the schedule's first this many steps run as dp,
  // then the mode starts from dp's model at that step (the one-process mesh only).
  std::int64_t warm_start = 0;
  int inner_steps = 50;            // H for diloco and streaming (paper 500, scaled)
  bool elastic = true;             // synchronous modes: stop waiting for a dead learner (false: stall)
  double round_timeout_s = 60;     // bound on any open round
  std::string etcd;                // brokers' lease service: http://HOST:PORT[,...]; empty: none
  // Heterogeneous learners: comma-separated values, one per learner (empty: the defaults).
  std::string learner_threads;     // compute threads (default: train.threads / M, at least 1)
  std::string learner_batch;       // sequences per step (default: data.batch)
  std::string learner_slowdown;    // step-time factor >= 1, by pacing (default: 1)
  // A fixed compute budget: every inner step takes at least this long (the
  // learner sleeps the rest), so a learner lost in a drill does not hand its
  // CPU to the others on a small machine. 0: as fast as the CPU allows.
  double step_time_ms = 0;
  // A mesh of nodes has no evaluator of its own: learner 0 evaluates the global
  // model it holds (the fragment values it last received, each at its version)
  // every this many of its steps and when it leaves. 0: never.
  std::int64_t global_eval_every = 0;
};

struct wire_config {
  std::int64_t heartbeat_interval_ms = 1000;  // both ways; any control message counts
  int liveness = 3;                           // silent intervals before a peer is dead
  std::int64_t reconnect_initial_ms = 100;    // backoff after a peer died
  std::int64_t reconnect_max_ms = 5000;
  int socket_hwm = 64;                        // ZeroMQ high-water mark, messages
  std::int64_t outbox_capacity = 1024;        // messages queued by actors
  std::int64_t peer_queue_capacity = 256;     // messages waiting for one peer
  std::int64_t max_tensor_bytes = std::int64_t{1} << 30;
  std::int64_t bulk_piece_bytes = 64 * 1024;  // an emulated link interleaves control between such pieces
  std::int64_t bulk_sndbuf_bytes = 0;         // the bulk lane's kernel send buffer, fixed; 0: adaptive (below)
  double bulk_queue_target_ms = 50;           // the adaptive bulk window's queueing target; 0: the OS's autotuning
  std::string encoding = "fp32";              // outer-gradient encoding on the wire
  int block_size = 64;                        // quantisation block
  bool error_feedback = false;                // lossy encodings: a learner adds what encoding dropped to its next contribution
  bool curve = true;                          // CURVE on tcp:// endpoints
  bool accept_chaos = false;                  // obey ChaosCommand messages (fault drills only)
  std::string key_file;                       // this node's keypair (archipelago keygen)
  std::string allow;                          // allowed public keys: a directory of *.pub or a list file
};

/// Default shaping of every link this node sends on (the WAN emulator).
struct link_config {
  double bandwidth_mbit = 0;  // 0 = unlimited
  double latency_ms = 0;      // one way
  double jitter_ms = 0;
  double loss = 0;
  double duplicate = 0;
  double reorder = 0;
  double corrupt = 0;
};

/// Snapshots in RocksDB (storage/FORMAT.md), when a run or node has --db.
struct storage_config {
  std::int64_t keep_last = 32;    // newest manifests kept
  std::int64_t keep_every = 100;  // ... and every one whose mesh version is a multiple; 0: none
  std::int64_t keep_mb = 16384;   // ... while the states they name hold at most this much; 0: no bound
  bool sync = false;              // fsync every commit: survives power loss, not just a crash
  std::int64_t queue_mb = 256;    // snapshot bytes queued before new versions are skipped
  std::int64_t backlog = 0;       // a shard's versions not yet durable before the broker holds its rounds; 0: never
};

struct config {
  model_config model;
  optimizer_config optimizer;
  data_config data;
  train_config train;
  mesh_config mesh;
  wire_config wire;
  link_config link;
  storage_config storage;
};

enum class knob_type : std::uint8_t { integer, real, boolean, text };

struct knob {
  std::string key;           // "section.name"
  knob_type type;
  std::string bound;         // human-readable bound, e.g. "[1, 64]"
  std::string help;
  std::function<status(config&, std::string_view)> set;  // parses and checks the bound
  std::function<std::string(const config&)> get;
};

/// Every knob, in declaration order.
const std::vector<knob>& knobs();

/// Sets one knob from text ("--set key=value"). Unknown keys and values out of
/// bounds are errc::invalid_input naming the key.
status set_knob(config& cfg, std::string_view key, std::string_view value);
/// Applies "key=value".
status set_knob_assignment(config& cfg, std::string_view assignment);

/// Applies a TOML document (sections = knob prefixes). `origin` names the file in errors.
status apply_toml(config& cfg, std::string_view toml_text, const std::string& origin);
/// Reads and applies a TOML file; a missing or unreadable file is an error.
status apply_toml_file(config& cfg, const std::string& path);

/// The whole configuration as TOML (round-trips through apply_toml).
std::string to_toml(const config& cfg);

/// The defaults `archipelago run` starts from (the embedded default job): the knobs' own,
/// but for a schedule of 1,500 steps per learner, so that four learners of the default model
/// finish in about two minutes on 2 cores. `archipelago config --for run` shows them.
config run_defaults();

/// Cross-knob checks and the resolved model shape (preset + overrides).
expected<model_shape> resolve_model(const model_config& m);
/// The mesh's parameter layout: model.layout's file, or the GPT of resolve_model.
expected<param_layout> resolve_layout(const config& cfg);
status validate(const config& cfg);
/// validate() plus the checks a mesh needs (K ≤ M, shards ≤ fragments, a fragment plan exists,
/// per-learner lists of the right length).
status validate_mesh(const config& cfg);

/// What a mode means for the actors (docs/design/algorithm.md §8): the same learner, broker
/// and shard code runs every mode; only these values differ.
struct sync_policy {
  std::string mode;
  int fragments = 24;            // P
  int shards = 2;                // parameter shards (dp, diloco: one, as they have one fragment)
  int quorum = 1;                // K
  int rounds_in_flight = 2;      // τ
  bool wait_for_all = false;     // a round closes only when every live eligible learner is in
  bool adaptive_grace = true;    // decoupled: the grace window after the quorum
  double steps_per_round = 1;    // the broker opens rounds this many ξ_step apart
  int contribute_after = 1;      // a learner answers a round once it did this many steps on the fragment
  int wait_slack = -1;           // ... and stops stepping this many steps later without an update; -1: never
  double mix = 0;                // α_mix
  bool rebase = false;           // learners keep their uncontributed progress on receipt
  bool catch_up = false;         // decoupled: learners behind on a fragment catch up before contributing
  bool send_gradients = false;   // dp: learners send gradients, the shards run AdamW
};

/// validate_mesh() and the policy of cfg.mesh.mode.
expected<sync_policy> resolve_policy(const config& cfg);

/// mesh.etcd's list of client URLs ("http://10.0.0.5:2379,http://10.0.0.6:2379").
expected<std::vector<std::string>> parse_etcd_endpoints(std::string_view list);

/// A hash of the knobs every node of a mesh must agree on (mode, fragments,
/// shards, H, τ, wire encoding); Join carries it.
std::uint64_t mesh_agreement_hash(const config& cfg);

/// One learner's compute: threads, batch and slow-down (heterogeneous learners).
struct learner_profile {
  int threads = 1;
  int batch = 32;
  double slowdown = 1;
};
/// Learner `index`'s profile (cfg must pass validate_mesh).
learner_profile learner_profile_of(const config& cfg, int index);

}  // namespace archipelago
