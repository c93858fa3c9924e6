#pragma once
// The snapshot store: versioned outer parameters over a kv_store
// (storage/FORMAT.md). A commit writes new fragment states, their merge
// records and a manifest — a consistent cut naming one version per fragment —
// in one atomic batch, then applies retention. Every read checks the record's
// checksum; a record that fails is errc::corrupt_data and is never returned.

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.hpp"
#include "core/layout.hpp"
#include "storage/kv_store.hpp"

namespace archipelago::storage {

/// The format this build writes; it reads every format from oldest_format_version
/// on, and a writer opening an older store raises its StoreInfo (FORMAT.md).
inline constexpr std::uint32_t format_version = 2;
inline constexpr std::uint32_t oldest_format_version = 1;

struct store_info {
  std::uint32_t format = format_version;
  std::int64_t created_ns = 0;
  std::string config_toml;
  std::uint64_t layout_fingerprint = 0;
  std::uint64_t mesh_hash = 0;
  std::uint64_t param_floats = 0;
};

/// One fragment's full outer state at one version: enough to resume it exactly.
struct fragment_state {
  std::uint32_t fragment = 0;
  std::uint64_t version = 0;
  std::uint64_t round = 0;  // the round that produced it; 0 for the initial value
  std::int64_t time_ns = 0;
  std::vector<float> theta, momentum;  // momentum: the Nesterov buffer (empty in gradient mode)
  std::vector<float> adam_m, adam_v;   // gradient mode: the shard's AdamW moments
  std::int64_t adam_steps = 0;
};

struct manifest_entry {
  std::uint32_t fragment = 0;
  std::uint64_t version = 0, round = 0, theta_checksum = 0;
  std::uint64_t state_bytes = 0;  // the state's floats × 4; 0: unknown (a format 1 commit)
};

/// A fragment state to commit, by reference: the spans stay valid and unchanged
/// until commit() returns, and `keep` owns what they point into. A shard commits
/// its live buffers this way (it changes nothing of a fragment whose version is
/// not yet durable), so a version being written is never copied.
struct fragment_write {
  std::uint32_t fragment = 0;
  std::uint64_t version = 0;
  std::uint64_t round = 0;
  std::int64_t time_ns = 0;
  std::span<const float> theta, momentum, adam_m, adam_v;
  std::int64_t adam_steps = 0;
  std::shared_ptr<const void> keep;
  /// True when the spans point into the caller's own state (nothing is copied for
  /// the writer's queue); false when `keep` holds a copy made for this write.
  bool borrowed = false;
  std::uint64_t bytes() const { return 4 * (theta.size() + momentum.size() + adam_m.size() + adam_v.size()); }
};
/// A write that owns `state`.
fragment_write owned_write(fragment_state state);
/// A write of `state` as it is, for a commit made while the caller holds it.
fragment_write borrowed_write(const fragment_state& state);

struct stored_ledger {
  std::uint64_t merged = 0, late = 0, rejected = 0, lost = 0, processed = 0, overwritten = 0;  // tokens
};

struct manifest {
  std::uint64_t mesh_version = 0;
  std::int64_t time_ns = 0;
  std::uint64_t mesh_hash = 0;
  std::vector<manifest_entry> entries;  // ascending fragment
  stored_ledger ledger;
  std::uint64_t learner_steps = 0;
  const manifest_entry* find(std::uint32_t fragment) const;
};

struct recorded_contribution {
  std::uint32_t learner = 0;
  std::uint64_t incarnation = 0, steps = 0, tokens = 0;
  std::vector<float> delta;
};

/// The contributions merged into one fragment version, in merge order.
struct merge_record {
  std::uint32_t fragment = 0;
  std::uint64_t version = 0, round = 0;
  std::vector<recorded_contribution> contributions;
};

struct tape_member {
  std::uint32_t learner = 0;
  std::uint64_t incarnation = 0;
  double weight = 0;
  std::uint64_t tokens = 0, steps = 0;
};

struct tape_record {
  std::uint64_t sequence = 0;  // assigned by the store
  std::uint64_t round = 0;
  std::uint32_t fragment = 0;
  std::int64_t opened_ns = 0, quorum_ns = -1, grace_ns = 0, closed_ns = 0;
  std::string reason;
  std::vector<tape_member> members, late;
  std::vector<tape_member> screened_out;  // members a shard rejected at the close: not merged
  std::uint64_t version = 0;
  std::int64_t committed_ns = 0;
  std::uint64_t broker_epoch = 0;  // the epoch of the broker that closed the round; 0: an older writer
  std::string settings;  // knobs changed live that took effect since the previous taped round; empty: none
};

struct learner_ledger {
  std::uint32_t learner = 0;
  std::uint64_t incarnation = 0;
  stored_ledger totals;
  std::uint64_t steps = 0;  // the incarnation's steps the totals cover; 0: unknown (a record of an older writer)
  double step_time_s = 0, merged_step_time_s = 0;
  std::string endpoint;  // where it listens (its Join); empty: unknown, or it left
  std::vector<stored_ledger> fragments;  // the totals per fragment; empty: unknown (an older writer)
  // The steps before `steps` whose shares may still be raised (schemas/snapshot.capnp).
  std::vector<std::uint32_t> tail_tokens, tail_time_us;
  std::vector<std::uint8_t> tail_buckets;  // P per step
};

/// The broker's round numbers handed out so far (meta column): every round it opened is below rounds_below.
struct round_lease {
  std::uint64_t rounds_below = 0;
  std::uint64_t incarnation = 0;
  std::int64_t time_ns = 0;
};

struct eval_record {
  std::uint64_t mesh_version = 0;
  std::int64_t time_ns = 0;
  double eval_loss = 0;
  std::uint64_t tokens = 0;
};

/// Which manifests survive: the newest keep_last, every keep_every-th (mesh
/// version divisible by it), the first, and those with an eval record;
/// fragment states no surviving manifest names are deleted. Merge records are
/// kept (replay verify needs them).
struct retention {
  std::uint64_t keep_last = 32;
  std::uint64_t keep_every = 100;  // 0: none beyond keep_last
  /// Beyond the rules above: while the fragment states the kept manifests name
  /// hold more than this many bytes, the oldest kept manifest leaves, whatever
  /// kept it; the newest always stays. 0: no bound in bytes.
  std::uint64_t keep_bytes = 0;
};

/// How a commit writes a fragment state (readers follow the records, so these
/// never change the format): in pieces of `piece_floats`, and — a commit at least
/// `unlogged_from_bytes` large — past RocksDB's log into table files
/// (written once, not twice), flushed to disk before its manifest is written.
struct write_tuning {
  std::size_t piece_floats = std::size_t{2} << 20;          // 8 MiB
  std::size_t unlogged_from_bytes = std::size_t{16} << 20;
  std::size_t batch_bytes = std::size_t{16} << 20;          // pieces per unlogged write
};

/// A commit: the new fragment states (and, when recording, what was merged into
/// them). Fragments not named keep their version in the new manifest.
struct commit_job {
  std::vector<fragment_write> fragments;
  std::vector<merge_record> merges;
  stored_ledger ledger;
  std::uint64_t learner_steps = 0;
  std::int64_t time_ns = 0;
};

class snapshot_store {
 public:
  /// A new store on an empty kv, or an existing one whose layout and mesh hash match
  /// `info` (invalid_input naming what differs). Rewrites nothing that exists.
  static expected<std::shared_ptr<snapshot_store>> create(std::shared_ptr<kv_store> kv, store_info info,
                                                          retention keep = {}, write_tuning tuning = {});
  /// An existing store; corrupt_data when the kv holds no archipelago store,
  /// unsupported (naming both) when its format is not one this build reads.
  static expected<std::shared_ptr<snapshot_store>> open(std::shared_ptr<kv_store> kv, retention keep = {},
                                                        write_tuning tuning = {});

  const store_info& info() const { return info_; }
  /// The newest mesh version committed through this handle (or found at open).
  std::uint64_t last_mesh_version() const;
  kv_store& kv() { return *kv_; }

  // ---- writes (thread-safe; each one atomic) ----
  /// Writes the job and a new manifest; returns the new mesh version. On error
  /// nothing of the job counts as committed (the next commit reuses the version).
  expected<std::uint64_t> commit(const commit_job& job);
  /// The fragment states the kept manifests name, in bytes (what storage.keep_mb bounds).
  std::uint64_t retained_bytes() const;
  status put_tape(tape_record record);
  status put_ledger(const std::vector<learner_ledger>& ledgers);
  /// Raises the round lease (never lowers it: a lower rounds_below is a no-op).
  status put_round_lease(const round_lease& lease);
  status put_eval(const eval_record& record);
  /// Crash recovery: the newest manifest whose fragments all read back valid
  /// becomes the head. Newer manifests (torn or corrupt) and fragment states no
  /// manifest names (debris of a failed write) are deleted. nullopt: no manifest.
  /// What was dropped and why goes to `dropped`; the head's fragment states, read
  /// and verified on the way, to `head_states` (a restore need not read them again).
  expected<std::optional<manifest>> recover(std::vector<std::string>* dropped = nullptr,
                                            std::vector<fragment_state>* head_states = nullptr);

  // ---- reads (checksums verified) ----
  expected<std::optional<manifest>> latest_manifest() const;
  expected<manifest> read_manifest(std::uint64_t mesh_version) const;
  /// The newest manifest whose fragment states all read back valid; the versions
  /// skipped on the way and why go to `skipped`; its fragment states, each read
  /// and verified once, to `states` (in the manifest's order).
  expected<std::optional<manifest>> latest_valid_manifest(std::vector<std::string>* skipped = nullptr,
                                                          std::vector<fragment_state>* states = nullptr) const;
  status for_each_manifest(const std::function<bool(const manifest&)>& visit) const;
  expected<fragment_state> read_fragment(std::uint32_t fragment, std::uint64_t version) const;
  /// not_found when that version was not recorded.
  expected<merge_record> read_merge(std::uint32_t fragment, std::uint64_t version) const;
  /// Versions of `fragment` that have a merge record, ascending.
  expected<std::vector<std::uint64_t>> merge_versions(std::uint32_t fragment) const;
  status for_each_tape(const std::function<bool(const tape_record&)>& visit) const;
  /// The newest tape record; nullopt when the tape is empty.
  expected<std::optional<tape_record>> last_tape() const;
  status for_each_eval(const std::function<bool(const eval_record&)>& visit) const;
  expected<std::vector<learner_ledger>> ledgers() const;
  /// The round lease; nullopt when no broker wrote one.
  expected<std::optional<round_lease>> read_round_lease() const;
  /// Every fragment version stored (keys only), ascending.
  expected<std::vector<std::pair<std::uint32_t, std::uint64_t>>> fragment_versions() const;

  /// The full parameter buffer (laid out by `layout`) of manifest `m`.
  expected<std::vector<float>> read_params(const manifest& m, const param_layout& layout,
                                           const fragment_plan& plan) const;
  /// The same from `m`'s fragment states already read (latest_valid_manifest's `states`).
  static expected<std::vector<float>> params_from(const manifest& m, const std::vector<fragment_state>& states,
                                                  const param_layout& layout, const fragment_plan& plan);

 private:
  snapshot_store(std::shared_ptr<kv_store> kv, store_info info, retention keep, write_tuning tuning);
  status load_manifests();
  /// A store of an older format takes this build's before its first commit.
  status raise_format();
  /// Reads (fragment, version)'s pieces into `f`, whose head said how many of each part.
  status read_pieces(fragment_state& f, std::uint64_t piece_floats) const;
  /// Retention's choice for the new manifest `m`: the manifests that leave.
  std::vector<std::uint64_t> leaving_for(const manifest& m);
  /// The retention bookkeeping of a kept manifest, taken up and let go.
  void reference(const manifest& m);
  void release(std::uint64_t mesh_version);

  std::shared_ptr<kv_store> kv_;
  store_info info_;
  retention keep_;
  write_tuning tuning_;
  mutable std::mutex write_mutex_;
  // Writer state, guarded by write_mutex_: the cut so far, the retained
  // manifests' fragment versions with their reference counts, the next sequence numbers.
  std::map<std::uint32_t, manifest_entry> cut_;
  std::uint64_t last_mesh_version_ = 0;
  std::map<std::uint64_t, std::vector<std::pair<std::uint32_t, std::uint64_t>>> retained_;
  std::map<std::pair<std::uint32_t, std::uint64_t>, std::uint32_t> references_;
  std::map<std::pair<std::uint32_t, std::uint64_t>, std::uint64_t> state_bytes_;  // of the referenced states
  std::uint64_t retained_bytes_ = 0;  // their sum
  std::set<std::uint64_t> pinned_;  // versions kept for their eval record (looked up once)
  std::uint64_t next_tape_ = 1;
};

/// Fragment p's values from / into a full parameter buffer (the plan's tensor order).
void gather_fragment(const param_layout& layout, const fragment_spec& spec, const float* params, float* out);
void scatter_fragment(const param_layout& layout, const fragment_spec& spec, const float* in, float* params);

/// A ledger or tape record as the store frames it (storage/FORMAT.md): what a
/// leading broker sends its standbys (BrokerState), who put_* them into their own store.
std::string encode_record(const learner_ledger& l);
std::string encode_record(const tape_record& t);
expected<learner_ledger> decode_ledger_record(std::string_view v);
expected<tape_record> decode_tape_record(std::string_view v);  // its sequence is the receiving store's

/// Every other record of a store, framed and read back as the store does: the
/// bytes a damaged (or hostile) store directory hands the reader. Decoding checks
/// the frame, the checksum and, with read limits, the Cap'n Proto record; any
/// failure is errc::corrupt_data naming `what`. Fuzzed by tests/fuzz/snapshot_record_fuzz.cpp.
std::string encode_record(const store_info& s);
std::string encode_record(const fragment_state& f);
std::string encode_record(const manifest& m);
std::string encode_record(const merge_record& m);
std::string encode_record(const round_lease& l);
std::string encode_record(const eval_record& e);
/// A format 2 fragment state's piece: `values` are part `part`'s floats from `offset` on.
std::string encode_piece_record(std::uint32_t fragment, std::uint64_t version, std::uint32_t index, std::uint8_t part,
                                std::uint64_t offset, std::span<const float> values);
expected<store_info> decode_store_info_record(std::string_view v);
expected<fragment_state> decode_fragment_record(std::string_view v, const std::string& what);
expected<manifest> decode_manifest_record(std::string_view v, const std::string& what);
expected<merge_record> decode_merge_record(std::string_view v, const std::string& what);
expected<round_lease> decode_round_lease_record(std::string_view v);
expected<eval_record> decode_eval_record(std::string_view v, const std::string& what);
/// A piece as read: its header fields, and its floats appended to `out`.
struct piece_header {
  std::uint32_t fragment = 0, index = 0;
  std::uint64_t version = 0, offset = 0;
  std::uint8_t part = 0;
};
expected<piece_header> decode_piece_record(std::string_view v, const std::string& what, std::vector<float>& out);

}  // namespace archipelago::storage
