#include "storage/snapshot_store.hpp"

#include <capnp/message.h>
#include <capnp/serialize.h>
#include <kj/exception.h>

#include <algorithm>
#include <cstring>

#include "core/checksum.hpp"
#include "schemas/snapshot.capnp.h"

namespace archipelago::storage {
namespace {

constexpr std::string_view store_key = "store";
constexpr std::string_view round_lease_key = "round_lease";

// ---- record framing: flat Cap'n Proto array ++ le64 XXH3 of it ----------------

/// The builder's message as a flat array written straight into the record (one
/// copy, which matters for pieces of several MiB), then the checksum.
std::string frame(capnp::MessageBuilder& builder) {
  const std::size_t body = capnp::computeSerializedSizeInWords(builder) * sizeof(capnp::word);
  std::string out(body + 8, '\0');
  kj::ArrayOutputStream stream(kj::arrayPtr(reinterpret_cast<kj::byte*>(out.data()), body));
  capnp::writeMessage(stream, builder);
  const std::uint64_t sum = checksum64(out.data(), body);
  for (int i = 0; i < 8; ++i) out[body + static_cast<std::size_t>(i)] = static_cast<char>(sum >> (8 * i));
  return out;
}

/// A builder whose first segment holds `data_bytes` of Data fields and a small
/// struct around them: the record is then one segment (FORMAT.md).
capnp::MallocMessageBuilder builder_for(std::size_t data_bytes) {
  return capnp::MallocMessageBuilder(static_cast<unsigned>(std::min<std::size_t>(
      data_bytes / sizeof(capnp::word) + 64, std::size_t{1} << 31)));
}

/// Checks the checksum, then decodes with read limits; `what` names the record in errors.
template <class Schema, class Fn>
auto unframe(std::string_view value, const std::string& what, Fn&& decode)
    -> expected<decltype(decode(std::declval<typename Schema::Reader>()))> {
  if (value.size() < 16 || value.size() % 8 != 0)
    return make_error(errc::corrupt_data, what + ": record of " + std::to_string(value.size()) +
                                              " bytes is not a framed record (torn write?)");
  const std::size_t body = value.size() - 8;
  std::uint64_t stored = 0;
  for (int i = 0; i < 8; ++i) stored |= static_cast<std::uint64_t>(static_cast<unsigned char>(value[body + i])) << (8 * i);
  if (checksum64(value.data(), body) != stored) return make_error(errc::corrupt_data, what + ": checksum mismatch");
  kj::Array<capnp::word> words = kj::heapArray<capnp::word>(body / 8);
  std::memcpy(words.begin(), value.data(), body);
  try {
    capnp::ReaderOptions limits;
    limits.traversalLimitInWords = body / 8 + 64;  // one pass over the record, no amplification
    limits.nestingLimit = 16;
    capnp::FlatArrayMessageReader reader(words, limits);
    return decode(reader.getRoot<Schema>());
  } catch (const kj::Exception& e) {
    return make_error(errc::corrupt_data, what + ": undecodable record: " + std::string(e.getDescription().cStr()));
  }
}

kj::ArrayPtr<const kj::byte> bytes_of(const std::vector<float>& v) {
  return {reinterpret_cast<const kj::byte*>(v.data()), v.size() * sizeof(float)};
}

std::vector<float> floats_of(capnp::Data::Reader d) {
  if (d.size() % sizeof(float) != 0) throw kj::Exception(kj::Exception::Type::FAILED, __FILE__, __LINE__,
                                                           kj::str("float data of ", d.size(), " bytes"));
  std::vector<float> v(d.size() / sizeof(float));
  if (!v.empty()) std::memcpy(v.data(), d.begin(), d.size());
  return v;
}

std::uint64_t theta_checksum(const std::vector<float>& theta) {
  return checksum64(theta.data(), theta.size() * sizeof(float));
}

std::string fragment_key(std::uint32_t fragment, std::uint64_t version) { return be32(fragment) + be64(version); }
std::string piece_key(std::uint32_t fragment, std::uint64_t version, std::uint32_t index) {
  return fragment_key(fragment, version) + be32(index);
}
/// Past every piece key of (fragment, version): they are its key plus 4 bytes.
std::string pieces_end(std::uint32_t fragment, std::uint64_t version) {
  return fragment_key(fragment, version) + std::string(5, '\xff');
}

/// Cap'n Proto's Data holds less than 2^29 bytes: a piece stays well below it.
constexpr std::size_t max_piece_floats = std::size_t{1} << 26;

const char* const part_names[] = {"theta", "momentum", "adam_m", "adam_v"};

void set_ledger(wire_snapshot::LedgerTotals::Builder b, const stored_ledger& l) {
  b.setMergedTokens(l.merged);
  b.setLateTokens(l.late);
  b.setRejectedTokens(l.rejected);
  b.setLostTokens(l.lost);
  b.setProcessedTokens(l.processed);
  b.setOverwrittenTokens(l.overwritten);
}
stored_ledger get_ledger(wire_snapshot::LedgerTotals::Reader r) {
  return {r.getMergedTokens(), r.getLateTokens(),      r.getRejectedTokens(),
          r.getLostTokens(),   r.getProcessedTokens(), r.getOverwrittenTokens()};
}

// ---- encoders / decoders ------------------------------------------------------

std::string encode(const store_info& s) {
  capnp::MallocMessageBuilder b;
  auto r = b.initRoot<wire_snapshot::StoreInfo>();
  r.setFormatVersion(s.format);
  r.setCreatedNs(s.created_ns);
  r.setConfigToml(s.config_toml);
  r.setLayoutFingerprint(s.layout_fingerprint);
  r.setMeshHash(s.mesh_hash);
  r.setParamFloats(s.param_floats);
  return frame(b);
}
expected<store_info> decode_info(std::string_view v) {
  return unframe<wire_snapshot::StoreInfo>(v, "store info", [](wire_snapshot::StoreInfo::Reader r) {
    return store_info{r.getFormatVersion(), r.getCreatedNs(), r.getConfigToml().cStr(), r.getLayoutFingerprint(),
                      r.getMeshHash(), r.getParamFloats()};
  });
}

/// A format 2 fragment state's head: everything but the floats, which go to pieces.
std::string encode_head(const fragment_write& f, std::uint64_t piece_floats, std::uint64_t theta_sum) {
  capnp::MallocMessageBuilder b;
  auto r = b.initRoot<wire_snapshot::FragmentState>();
  r.setFragment(f.fragment);
  r.setVersion(f.version);
  r.setRound(f.round);
  r.setTimeNs(f.time_ns);
  r.setAdamSteps(f.adam_steps);
  r.setThetaChecksum(theta_sum);
  r.setPieceFloats(piece_floats);
  r.setThetaFloats(f.theta.size());
  r.setMomentumFloats(f.momentum.size());
  r.setAdamMFloats(f.adam_m.size());
  r.setAdamVFloats(f.adam_v.size());
  return frame(b);
}

std::string encode_piece(std::uint32_t fragment, std::uint64_t version, std::uint32_t index, std::uint8_t part,
                         std::uint64_t offset, std::span<const float> values) {
  capnp::MallocMessageBuilder b = builder_for(values.size_bytes());
  auto r = b.initRoot<wire_snapshot::FragmentPiece>();
  r.setFragment(fragment);
  r.setVersion(version);
  r.setIndex(index);
  r.setPart(part);
  r.setOffset(offset);
  r.setData(kj::arrayPtr(reinterpret_cast<const kj::byte*>(values.data()), values.size_bytes()));
  return frame(b);
}

expected<piece_header> decode_piece(std::string_view v, const std::string& what, std::vector<float>& out) {
  return unframe<wire_snapshot::FragmentPiece>(v, what, [&out](wire_snapshot::FragmentPiece::Reader r) {
    out = floats_of(r.getData());
    return piece_header{r.getFragment(), r.getIndex(), r.getVersion(), r.getOffset(), r.getPart()};
  });
}

/// A format 1 fragment state (every float inline): still read, written by tests and fuzzers only.
std::string encode(const fragment_state& f) {
  capnp::MallocMessageBuilder b = builder_for(
      4 * (f.theta.size() + f.momentum.size() + f.adam_m.size() + f.adam_v.size()));
  auto r = b.initRoot<wire_snapshot::FragmentState>();
  r.setFragment(f.fragment);
  r.setVersion(f.version);
  r.setRound(f.round);
  r.setTimeNs(f.time_ns);
  r.setTheta(bytes_of(f.theta));
  r.setMomentum(bytes_of(f.momentum));
  r.setAdamM(bytes_of(f.adam_m));
  r.setAdamV(bytes_of(f.adam_v));
  r.setAdamSteps(f.adam_steps);
  r.setThetaChecksum(theta_checksum(f.theta));
  return frame(b);
}
/// A fragment state record as stored: format 1 with its floats, or a format 2
/// head (piece_floats > 0) whose parts' lengths are in `floats` and whose floats
/// are in the pieces column.
struct fragment_head {
  fragment_state state;
  std::uint64_t theta_sum = 0;
  std::uint64_t piece_floats = 0;
  std::uint64_t floats[4] = {};
};

expected<fragment_head> decode_head(std::string_view v, const std::string& what) {
  auto decoded = unframe<wire_snapshot::FragmentState>(v, what, [](wire_snapshot::FragmentState::Reader r) {
    fragment_head h;
    fragment_state& f = h.state;
    f.fragment = r.getFragment();
    f.version = r.getVersion();
    f.round = r.getRound();
    f.time_ns = r.getTimeNs();
    f.theta = floats_of(r.getTheta());
    f.momentum = floats_of(r.getMomentum());
    f.adam_m = floats_of(r.getAdamM());
    f.adam_v = floats_of(r.getAdamV());
    f.adam_steps = r.getAdamSteps();
    h.theta_sum = r.getThetaChecksum();
    h.piece_floats = r.getPieceFloats();
    h.floats[0] = r.getThetaFloats();
    h.floats[1] = r.getMomentumFloats();
    h.floats[2] = r.getAdamMFloats();
    h.floats[3] = r.getAdamVFloats();
    return h;
  });
  if (!decoded) return decoded.err();
  const fragment_head& h = *decoded;
  if (h.piece_floats == 0) {
    if (theta_checksum(h.state.theta) != h.theta_sum)
      return make_error(errc::corrupt_data, what + ": parameter checksum mismatch");
  } else if (h.piece_floats > max_piece_floats || !h.state.theta.empty() || !h.state.momentum.empty() ||
             !h.state.adam_m.empty() || !h.state.adam_v.empty()) {
    return make_error(errc::corrupt_data, what + ": a pieced record (" + std::to_string(h.piece_floats) +
                                              " floats per piece) with floats inline, or pieces too large");
  }
  return decoded;
}

expected<fragment_state> decode_fragment(std::string_view v, const std::string& what) {
  auto head = decode_head(v, what);
  if (!head) return head.err();
  if (head->piece_floats != 0)
    return make_error(errc::unsupported, what + ": its floats are in pieces, read it from its store");
  return std::move(head->state);
}

std::string encode(const manifest& m) {
  capnp::MallocMessageBuilder b;
  auto r = b.initRoot<wire_snapshot::Manifest>();
  r.setMeshVersion(m.mesh_version);
  r.setTimeNs(m.time_ns);
  r.setMeshHash(m.mesh_hash);
  auto entries = r.initEntries(static_cast<unsigned>(m.entries.size()));
  for (unsigned i = 0; i < m.entries.size(); ++i) {
    entries[i].setFragment(m.entries[i].fragment);
    entries[i].setVersion(m.entries[i].version);
    entries[i].setRound(m.entries[i].round);
    entries[i].setThetaChecksum(m.entries[i].theta_checksum);
    entries[i].setStateBytes(m.entries[i].state_bytes);
  }
  set_ledger(r.initLedger(), m.ledger);
  r.setLearnerSteps(m.learner_steps);
  return frame(b);
}
expected<manifest> decode_manifest(std::string_view v, const std::string& what) {
  return unframe<wire_snapshot::Manifest>(v, what, [](wire_snapshot::Manifest::Reader r) {
    manifest m;
    m.mesh_version = r.getMeshVersion();
    m.time_ns = r.getTimeNs();
    m.mesh_hash = r.getMeshHash();
    for (auto e : r.getEntries())
      m.entries.push_back({e.getFragment(), e.getVersion(), e.getRound(), e.getThetaChecksum(), e.getStateBytes()});
    m.ledger = get_ledger(r.getLedger());
    m.learner_steps = r.getLearnerSteps();
    return m;
  });
}

std::string encode(const merge_record& m) {
  capnp::MallocMessageBuilder b;
  auto r = b.initRoot<wire_snapshot::MergeRecord>();
  r.setFragment(m.fragment);
  r.setVersion(m.version);
  r.setRound(m.round);
  auto list = r.initContributions(static_cast<unsigned>(m.contributions.size()));
  for (unsigned i = 0; i < m.contributions.size(); ++i) {
    const auto& c = m.contributions[i];
    list[i].setLearner(c.learner);
    list[i].setIncarnation(c.incarnation);
    list[i].setSteps(c.steps);
    list[i].setTokens(c.tokens);
    list[i].setDelta(bytes_of(c.delta));
  }
  return frame(b);
}
expected<merge_record> decode_merge(std::string_view v, const std::string& what) {
  return unframe<wire_snapshot::MergeRecord>(v, what, [](wire_snapshot::MergeRecord::Reader r) {
    merge_record m;
    m.fragment = r.getFragment();
    m.version = r.getVersion();
    m.round = r.getRound();
    for (auto c : r.getContributions())
      m.contributions.push_back({c.getLearner(), c.getIncarnation(), c.getSteps(), c.getTokens(), floats_of(c.getDelta())});
    return m;
  });
}

void set_members(capnp::List<wire_snapshot::TapeMember>::Builder list, const std::vector<tape_member>& members) {
  for (unsigned i = 0; i < members.size(); ++i) {
    list[i].setLearner(members[i].learner);
    list[i].setIncarnation(members[i].incarnation);
    list[i].setWeight(members[i].weight);
    list[i].setTokens(members[i].tokens);
    list[i].setSteps(members[i].steps);
  }
}
std::vector<tape_member> get_members(capnp::List<wire_snapshot::TapeMember>::Reader list) {
  std::vector<tape_member> out;
  for (auto m : list) out.push_back({m.getLearner(), m.getIncarnation(), m.getWeight(), m.getTokens(), m.getSteps()});
  return out;
}

std::string encode(const tape_record& t) {
  capnp::MallocMessageBuilder b;
  auto r = b.initRoot<wire_snapshot::TapeRecord>();
  r.setRound(t.round);
  r.setFragment(t.fragment);
  r.setOpenedNs(t.opened_ns);
  r.setQuorumNs(t.quorum_ns);
  r.setGraceNs(t.grace_ns);
  r.setClosedNs(t.closed_ns);
  r.setReason(t.reason);
  set_members(r.initMembers(static_cast<unsigned>(t.members.size())), t.members);
  set_members(r.initLate(static_cast<unsigned>(t.late.size())), t.late);
  set_members(r.initScreenedOut(static_cast<unsigned>(t.screened_out.size())), t.screened_out);
  r.setVersion(t.version);
  r.setCommittedNs(t.committed_ns);
  r.setBrokerEpoch(t.broker_epoch);
  r.setSettings(t.settings);
  return frame(b);
}
expected<tape_record> decode_tape(std::string_view v, std::uint64_t sequence) {
  return unframe<wire_snapshot::TapeRecord>(v, "tape record " + std::to_string(sequence),
                                            [sequence](wire_snapshot::TapeRecord::Reader r) {
    tape_record t;
    t.sequence = sequence;
    t.round = r.getRound();
    t.fragment = r.getFragment();
    t.opened_ns = r.getOpenedNs();
    t.quorum_ns = r.getQuorumNs();
    t.grace_ns = r.getGraceNs();
    t.closed_ns = r.getClosedNs();
    t.reason = r.getReason().cStr();
    t.members = get_members(r.getMembers());
    t.late = get_members(r.getLate());
    t.screened_out = get_members(r.getScreenedOut());
    t.version = r.getVersion();
    t.committed_ns = r.getCommittedNs();
    t.broker_epoch = r.getBrokerEpoch();
    t.settings = r.getSettings().cStr();
    return t;
  });
}

std::string encode(const learner_ledger& l) {
  capnp::MallocMessageBuilder b;
  auto r = b.initRoot<wire_snapshot::LearnerLedger>();
  r.setLearner(l.learner);
  r.setIncarnation(l.incarnation);
  set_ledger(r.initTotals(), l.totals);
  r.setSteps(l.steps);
  r.setStepTimeS(l.step_time_s);
  r.setMergedStepTimeS(l.merged_step_time_s);
  r.setEndpoint(l.endpoint);
  auto fragments = r.initFragments(static_cast<unsigned>(l.fragments.size()));
  for (unsigned p = 0; p < fragments.size(); ++p) set_ledger(fragments[p], l.fragments[p]);
  auto tokens = r.initTailTokens(static_cast<unsigned>(l.tail_tokens.size()));
  for (unsigned i = 0; i < tokens.size(); ++i) tokens.set(i, l.tail_tokens[i]);
  auto times = r.initTailTimeUs(static_cast<unsigned>(l.tail_time_us.size()));
  for (unsigned i = 0; i < times.size(); ++i) times.set(i, l.tail_time_us[i]);
  r.setTailBuckets(kj::arrayPtr(l.tail_buckets.data(), l.tail_buckets.size()));
  return frame(b);
}

expected<learner_ledger> decode_ledger(std::string_view value) {
  return unframe<wire_snapshot::LearnerLedger>(value, "ledger record", [](wire_snapshot::LearnerLedger::Reader r) {
    learner_ledger l{r.getLearner(),   r.getIncarnation(),       get_ledger(r.getTotals()), r.getSteps(),
                     r.getStepTimeS(), r.getMergedStepTimeS(), r.getEndpoint().cStr(),    {}, {}, {}, {}};
    for (auto f : r.getFragments()) l.fragments.push_back(get_ledger(f));
    for (auto t : r.getTailTokens()) l.tail_tokens.push_back(t);
    for (auto t : r.getTailTimeUs()) l.tail_time_us.push_back(t);
    const auto buckets = r.getTailBuckets();
    l.tail_buckets.assign(buckets.begin(), buckets.end());
    return l;
  });
}

std::string encode(const round_lease& l) {
  capnp::MallocMessageBuilder b;
  auto r = b.initRoot<wire_snapshot::RoundLease>();
  r.setRoundsBelow(l.rounds_below);
  r.setIncarnation(l.incarnation);
  r.setTimeNs(l.time_ns);
  return frame(b);
}
expected<round_lease> decode_lease(std::string_view v) {
  return unframe<wire_snapshot::RoundLease>(v, "round lease", [](wire_snapshot::RoundLease::Reader r) {
    return round_lease{r.getRoundsBelow(), r.getIncarnation(), r.getTimeNs()};
  });
}
expected<std::optional<round_lease>> decode_round_lease(const kv_store& kv) {
  auto raw = kv.get(column::meta, round_lease_key);
  if (!raw) return raw.err();
  if (!raw->has_value()) return std::optional<round_lease>{};
  auto lease = decode_lease(**raw);
  if (!lease) return lease.err();
  return std::optional<round_lease>(*lease);
}

std::string encode(const eval_record& e) {
  capnp::MallocMessageBuilder b;
  auto r = b.initRoot<wire_snapshot::EvalRecord>();
  r.setMeshVersion(e.mesh_version);
  r.setTimeNs(e.time_ns);
  r.setEvalLoss(e.eval_loss);
  r.setTokens(e.tokens);
  return frame(b);
}
expected<eval_record> decode_eval(std::string_view v, const std::string& what) {
  return unframe<wire_snapshot::EvalRecord>(v, what, [](wire_snapshot::EvalRecord::Reader r) {
    return eval_record{r.getMeshVersion(), r.getTimeNs(), r.getEvalLoss(), r.getTokens()};
  });
}

std::string fragment_name(std::uint32_t fragment, std::uint64_t version) {
  return "fragment " + std::to_string(fragment) + " version " + std::to_string(version);
}

/// Visits every record of a column, decoded; the first undecodable one ends the scan as its error.
template <class Decode, class Visit>
status scan_records(const kv_store& kv, column c, Decode&& decode, Visit&& visit) {
  std::optional<error> failure;
  auto scanned = kv.scan(c, {}, {}, [&](std::string_view key, std::string_view value) {
    auto record = decode(key, value);
    if (!record) {
      failure = record.err();
      return false;
    }
    return visit(std::move(*record));
  });
  if (!scanned) return scanned;
  if (failure) return *failure;
  return {};
}

}  // namespace

const manifest_entry* manifest::find(std::uint32_t fragment) const {
  for (const auto& e : entries)
    if (e.fragment == fragment) return &e;
  return nullptr;
}

fragment_write owned_write(fragment_state state) {
  auto owned = std::make_shared<const fragment_state>(std::move(state));
  const fragment_state& f = *owned;
  return {f.fragment, f.version, f.round, f.time_ns, f.theta, f.momentum, f.adam_m, f.adam_v, f.adam_steps,
          owned, false};
}

fragment_write borrowed_write(const fragment_state& f) {
  return {f.fragment, f.version, f.round, f.time_ns, f.theta, f.momentum, f.adam_m, f.adam_v, f.adam_steps, {}, true};
}

snapshot_store::snapshot_store(std::shared_ptr<kv_store> kv, store_info info, retention keep, write_tuning tuning)
    : kv_(std::move(kv)), info_(std::move(info)), keep_(keep), tuning_(tuning) {
  tuning_.piece_floats = std::clamp<std::size_t>(tuning_.piece_floats, 1, max_piece_floats);
}

expected<std::shared_ptr<snapshot_store>> snapshot_store::create(std::shared_ptr<kv_store> kv, store_info info,
                                                                 retention keep, write_tuning tuning) {
  auto existing = kv->get(column::meta, store_key);
  if (!existing) return existing.err();
  if (!existing->has_value()) {
    // A foreign store with data but no info must not be adopted.
    auto any = kv->last(column::manifests);
    if (!any) return any.err();
    if (any->has_value()) return make_error(errc::corrupt_data, "the store has manifests but no store info");
    info.format = format_version;
    write_batch batch;
    batch.put(column::meta, std::string(store_key), encode(info));
    if (auto ok = kv->write(batch); !ok) return ok.err();
    return std::shared_ptr<snapshot_store>(new snapshot_store(std::move(kv), std::move(info), keep, tuning));
  }
  auto opened = open(std::move(kv), keep, tuning);
  if (!opened) return opened.err();
  const store_info& have = (*opened)->info();
  if (have.layout_fingerprint != info.layout_fingerprint || have.param_floats != info.param_floats)
    return make_error(errc::invalid_input, "the store holds another model (layout fingerprint " +
                                               std::to_string(have.layout_fingerprint) + ", this run " +
                                               std::to_string(info.layout_fingerprint) + ")");
  if (have.mesh_hash != info.mesh_hash)
    return make_error(errc::invalid_input,
                      "the store was written by a mesh with another policy (mode, fragments, shards or H differ)");
  return opened;
}

expected<std::shared_ptr<snapshot_store>> snapshot_store::open(std::shared_ptr<kv_store> kv, retention keep,
                                                               write_tuning tuning) {
  auto raw = kv->get(column::meta, store_key);
  if (!raw) return raw.err();
  if (!raw->has_value()) return make_error(errc::corrupt_data, "not an archipelago snapshot store (no store info)");
  auto info = decode_info(**raw);
  if (!info) return info.err();
  if (info->format < oldest_format_version || info->format > format_version)
    return make_error(errc::unsupported, "store format version " + std::to_string(info->format) +
                                             (info->format > format_version ? " (written by a newer build)" : "") +
                                             "; this build reads versions " + std::to_string(oldest_format_version) +
                                             " to " + std::to_string(format_version));
  auto store = std::shared_ptr<snapshot_store>(new snapshot_store(std::move(kv), std::move(*info), keep, tuning));
  if (auto ok = store->load_manifests(); !ok) return ok.err();
  return store;
}

status snapshot_store::raise_format() {
  if (info_.format >= format_version) return {};
  store_info raised = info_;
  raised.format = format_version;
  write_batch batch;
  batch.put(column::meta, std::string(store_key), encode(raised));
  if (auto ok = kv_->write(batch); !ok) return ok;
  info_ = std::move(raised);
  return {};
}

void snapshot_store::reference(const manifest& m) {
  auto& refs = retained_[m.mesh_version];
  for (const auto& e : m.entries) {
    refs.emplace_back(e.fragment, e.version);
    if (references_[{e.fragment, e.version}]++ == 0) {
      state_bytes_[{e.fragment, e.version}] = e.state_bytes;
      retained_bytes_ += e.state_bytes;
    }
  }
}

void snapshot_store::release(std::uint64_t mesh_version) {
  auto it = retained_.find(mesh_version);
  if (it == retained_.end()) return;
  for (const auto& ref : it->second)
    if (--references_[ref] == 0) {
      references_.erase(ref);
      retained_bytes_ -= state_bytes_[ref];
      state_bytes_.erase(ref);
    }
  retained_.erase(it);
}

std::uint64_t snapshot_store::retained_bytes() const {
  std::lock_guard lock(write_mutex_);
  return retained_bytes_;
}

status snapshot_store::load_manifests() {
  std::lock_guard lock(write_mutex_);
  std::optional<error> failure;
  auto scanned = kv_->scan(column::manifests, {}, {}, [&](std::string_view key, std::string_view value) {
    auto m = decode_manifest(value, "manifest " + std::to_string(read_be64(key)));
    if (!m) {  // a torn manifest is skipped here; latest_valid_manifest reports it
      if (m.err().code != errc::corrupt_data) failure = m.err();
      return !failure;
    }
    reference(*m);
    last_mesh_version_ = std::max(last_mesh_version_, m->mesh_version);
    cut_.clear();
    for (const auto& e : m->entries) cut_[e.fragment] = e;
    return true;
  });
  if (!scanned) return scanned;
  if (failure) return *failure;
  auto tape = kv_->last(column::tape);
  if (!tape) return tape.err();
  if (tape->has_value()) next_tape_ = read_be64((*tape)->first) + 1;
  return {};
}

std::vector<std::uint64_t> snapshot_store::leaving_for(const manifest& m) {
  // Manifests leaving the count window go (mesh version 1, every keep_every-th and
  // those with an eval record stay).
  std::vector<std::uint64_t> leaving;
  for (const auto& [v, refs] : retained_) {
    if (v + keep_.keep_last > m.mesh_version) break;  // ascending: the rest are in the window
    if (v == 1 || (keep_.keep_every && v % keep_.keep_every == 0) || pinned_.count(v)) continue;
    if (auto eval = kv_->get(column::evals, be64(v)); eval && eval->has_value()) {
      pinned_.insert(v);  // a version with a measured eval loss stays (list shows the curve)
      continue;
    }
    leaving.push_back(v);
  }
  if (keep_.keep_bytes == 0) return leaving;
  // Then, while the states the rest and `m` name hold more than keep_bytes, the oldest of the rest.
  std::map<std::pair<std::uint32_t, std::uint64_t>, std::uint32_t> references = references_;
  std::uint64_t bytes = retained_bytes_;
  for (const auto& e : m.entries)
    if (references[{e.fragment, e.version}]++ == 0) bytes += e.state_bytes;
  auto drop = [&](std::uint64_t v) {
    for (const auto& ref : retained_.at(v))
      if (--references[ref] == 0) bytes -= state_bytes_.at(ref);
  };
  for (std::uint64_t v : leaving) drop(v);
  const std::set<std::uint64_t> counted(leaving.begin(), leaving.end());
  for (const auto& [v, refs] : retained_) {
    if (bytes <= keep_.keep_bytes) break;
    if (counted.count(v)) continue;
    drop(v);
    leaving.push_back(v);
  }
  return leaving;
}

expected<std::uint64_t> snapshot_store::commit(const commit_job& job) {
  std::lock_guard lock(write_mutex_);
  if (auto ok = raise_format(); !ok) return ok.err();
  std::uint64_t payload = 0;
  for (const auto& f : job.fragments) payload += f.bytes();
  for (const auto& m : job.merges)
    for (const auto& c : m.contributions) payload += 4 * c.delta.size();
  // A large commit's floats bypass RocksDB's log: written once (to table
  // files), flushed to disk before the batch that names them. A small one goes
  // whole into that one batch, as atomic as ever.
  const bool unlogged = payload >= tuning_.unlogged_from_bytes;
  write_batch batch, bulk;
  auto put_bulk = [&](column c, std::string key, std::string value) -> status {
    write_batch& into = unlogged ? bulk : batch;
    into.put(c, std::move(key), std::move(value));
    if (!unlogged || bulk.bytes() < tuning_.batch_bytes) return {};
    status ok = kv_->write_unlogged(bulk);
    bulk.ops.clear();
    return ok;
  };
  std::map<std::uint32_t, manifest_entry> cut = cut_;
  const std::size_t per = tuning_.piece_floats;
  for (const auto& f : job.fragments) {
    std::uint32_t index = 0;
    const std::span<const float> parts[] = {f.theta, f.momentum, f.adam_m, f.adam_v};
    for (std::uint8_t part = 0; part < 4; ++part)
      for (std::size_t at = 0; at < parts[part].size(); at += per, ++index) {
        const auto values = parts[part].subspan(at, std::min(per, parts[part].size() - at));
        if (auto ok = put_bulk(column::pieces, piece_key(f.fragment, f.version, index),
                               encode_piece(f.fragment, f.version, index, part, at, values));
            !ok)
          return ok.err();
      }
    const std::uint64_t sum = checksum64(f.theta.data(), f.theta.size_bytes());
    batch.put(column::fragments, fragment_key(f.fragment, f.version), encode_head(f, per, sum));
    cut[f.fragment] = {f.fragment, f.version, f.round, sum, f.bytes()};
  }
  for (const auto& m : job.merges)
    if (auto ok = put_bulk(column::contributions, fragment_key(m.fragment, m.version), encode(m)); !ok) return ok.err();
  if (unlogged) {
    if (!bulk.ops.empty())
      if (auto ok = kv_->write_unlogged(bulk); !ok) return ok.err();
    if (auto ok = kv_->flush_memtables(); !ok) return ok.err();
  }

  manifest m;
  m.mesh_version = last_mesh_version_ + 1;
  m.time_ns = job.time_ns;
  m.mesh_hash = info_.mesh_hash;
  for (const auto& [p, e] : cut) m.entries.push_back(e);
  m.ledger = job.ledger;
  m.learner_steps = job.learner_steps;

  // Retention: manifests leaving go, and with them every fragment state no
  // surviving manifest (nor the new one) names. The bookkeeping changes only once
  // the batch is written.
  const std::vector<std::uint64_t> leaving = leaving_for(m);
  std::map<std::pair<std::uint32_t, std::uint64_t>, std::uint32_t> released;  // references the leavers hold
  for (std::uint64_t v : leaving) {
    batch.del(column::manifests, be64(v));
    for (const auto& ref : retained_.at(v)) ++released[ref];
  }
  for (const auto& [ref, count] : released) {
    const manifest_entry* named = m.find(ref.first);
    if (references_.at(ref) != count || (named && named->version == ref.second)) continue;
    batch.del(column::fragments, fragment_key(ref.first, ref.second));
    if (state_bytes_.at(ref) > 0)  // a format 2 state: its pieces too
      batch.del_range(column::pieces, piece_key(ref.first, ref.second, 0), pieces_end(ref.first, ref.second));
  }
  batch.put(column::manifests, be64(m.mesh_version), encode(m));  // last: a torn batch leaves no manifest
  if (auto ok = kv_->write(batch); !ok) return ok.err();
  for (std::uint64_t v : leaving) release(v);
  reference(m);
  cut_ = std::move(cut);
  last_mesh_version_ = m.mesh_version;
  return m.mesh_version;
}

status snapshot_store::put_tape(tape_record record) {
  std::lock_guard lock(write_mutex_);
  write_batch batch;
  batch.put(column::tape, be64(next_tape_), encode(record));
  if (auto ok = kv_->write(batch); !ok) return ok;
  ++next_tape_;
  return {};
}

status snapshot_store::put_ledger(const std::vector<learner_ledger>& ledgers) {
  write_batch batch;
  for (const auto& l : ledgers) batch.put(column::ledger, be32(l.learner) + be64(l.incarnation), encode(l));
  return kv_->write(batch);
}

status snapshot_store::put_round_lease(const round_lease& lease) {
  std::lock_guard lock(write_mutex_);
  auto have = decode_round_lease(*kv_);
  if (have && *have && (*have)->rounds_below >= lease.rounds_below) return {};  // never lowered
  write_batch batch;
  batch.put(column::meta, std::string(round_lease_key), encode(lease));
  return kv_->write(batch);
}

expected<std::optional<round_lease>> snapshot_store::read_round_lease() const { return decode_round_lease(*kv_); }

status snapshot_store::put_eval(const eval_record& record) {
  write_batch batch;
  batch.put(column::evals, be64(record.mesh_version), encode(record));
  return kv_->write(batch);
}

std::uint64_t snapshot_store::last_mesh_version() const {
  std::lock_guard lock(write_mutex_);
  return last_mesh_version_;
}

expected<std::optional<manifest>> snapshot_store::recover(std::vector<std::string>* dropped,
                                                          std::vector<fragment_state>* head_states) {
  std::vector<std::string> skipped;
  auto head = latest_valid_manifest(&skipped, head_states);
  if (!head) return head.err();
  std::lock_guard lock(write_mutex_);
  const std::uint64_t head_version = *head ? (*head)->mesh_version : 0;
  std::map<std::uint32_t, manifest_entry> cut;
  if (*head)
    for (const auto& e : (*head)->entries) cut[e.fragment] = e;
  write_batch batch;
  auto manifests = kv_->scan(column::manifests, be64(head_version + 1), {}, [&](std::string_view key, std::string_view) {
    batch.del(column::manifests, std::string(key));
    return true;
  });
  if (!manifests) return manifests.err();
  std::size_t debris = 0;
  auto fragments = kv_->scan(column::fragments, {}, {}, [&](std::string_view key, std::string_view) {
    auto it = cut.find(read_be32(key));
    if (it == cut.end() || read_be64(key, 4) > it->second.version) {
      batch.del(column::fragments, std::string(key));
      ++debris;
    }
    return true;
  });
  if (!fragments) return fragments.err();
  auto merges = kv_->scan(column::contributions, {}, {}, [&](std::string_view key, std::string_view) {
    auto it = cut.find(read_be32(key));
    if (it == cut.end() || read_be64(key, 4) > it->second.version) {
      batch.del(column::contributions, std::string(key));
      ++debris;
    }
    return true;
  });
  if (!merges) return merges.err();
  // Pieces are not scanned (that would read every float in the store): every
  // range outside what the head can name goes — fragment p's versions above the
  // head's, and fragments the head does not hold.
  std::string from;  // the start of the next range to delete
  for (const auto& [p, e] : cut) {
    batch.del_range(column::pieces, from, be32(p));
    from = fragment_key(p, e.version + 1);
  }
  batch.del_range(column::pieces, from, std::string(5, '\xff'));
  if (auto ok = kv_->write(batch); !ok) return ok.err();
  if (dropped) {
    *dropped = std::move(skipped);
    if (debris) dropped->push_back(std::to_string(debris) + " uncommitted record(s) removed");
  }
  // The writer continues from the head.
  while (!retained_.empty() && retained_.rbegin()->first > head_version) release(retained_.rbegin()->first);
  cut_ = std::move(cut);
  last_mesh_version_ = head_version;
  return head;
}

expected<std::optional<manifest>> snapshot_store::latest_manifest() const {
  auto last = kv_->last(column::manifests);
  if (!last) return last.err();
  if (!last->has_value()) return std::optional<manifest>{};
  auto m = decode_manifest((*last)->second, "manifest " + std::to_string(read_be64((*last)->first)));
  if (!m) return m.err();
  return std::optional<manifest>(std::move(*m));
}

expected<manifest> snapshot_store::read_manifest(std::uint64_t mesh_version) const {
  auto raw = kv_->get(column::manifests, be64(mesh_version));
  if (!raw) return raw.err();
  if (!raw->has_value())
    return make_error(errc::not_found, "no version " + std::to_string(mesh_version) +
                                           " in the store (see `replay list`; retention may have removed it)");
  return decode_manifest(**raw, "manifest " + std::to_string(mesh_version));
}

expected<std::optional<manifest>> snapshot_store::latest_valid_manifest(std::vector<std::string>* skipped,
                                                                       std::vector<fragment_state>* states) const {
  std::vector<std::uint64_t> versions;
  auto scanned = kv_->scan(column::manifests, {}, {}, [&](std::string_view key, std::string_view) {
    versions.push_back(read_be64(key));
    return true;
  });
  if (!scanned) return scanned.err();
  for (auto it = versions.rbegin(); it != versions.rend(); ++it) {
    auto m = read_manifest(*it);
    std::optional<error> bad = m ? std::nullopt : std::optional<error>(m.err());
    std::vector<fragment_state> read;
    if (m)
      for (const auto& e : m->entries) {
        auto f = read_fragment(e.fragment, e.version);
        if (!f) bad = f.err();
        else if (theta_checksum(f->theta) != e.theta_checksum)
          bad = make_error(errc::corrupt_data, fragment_name(e.fragment, e.version) + " differs from its manifest");
        if (bad) break;
        if (states) read.push_back(std::move(*f));
      }
    if (!bad) {
      if (states) *states = std::move(read);
      return std::optional<manifest>(std::move(*m));
    }
    if (bad->code != errc::corrupt_data && bad->code != errc::not_found) return *bad;
    if (skipped) skipped->push_back("version " + std::to_string(*it) + ": " + bad->message);
  }
  return std::optional<manifest>{};
}

status snapshot_store::for_each_manifest(const std::function<bool(const manifest&)>& visit) const {
  return scan_records(
      *kv_, column::manifests,
      [](std::string_view key, std::string_view value) {
        return decode_manifest(value, "manifest " + std::to_string(read_be64(key)));
      },
      visit);
}

expected<fragment_state> snapshot_store::read_fragment(std::uint32_t fragment, std::uint64_t version) const {
  const std::string name = fragment_name(fragment, version);
  auto raw = kv_->get(column::fragments, fragment_key(fragment, version));
  if (!raw) return raw.err();
  if (!raw->has_value()) return make_error(errc::not_found, name + " is not in the store");
  auto head = decode_head(**raw, name);
  if (!head) return head.err();
  fragment_state& f = head->state;
  if (f.fragment != fragment || f.version != version)
    return make_error(errc::corrupt_data, name + " holds another fragment's record");
  if (head->piece_floats == 0) return std::move(f);  // format 1: inline
  // A part longer than the whole model is a corrupt head: never allocated.
  std::vector<float>* parts[] = {&f.theta, &f.momentum, &f.adam_m, &f.adam_v};
  for (int k = 0; k < 4; ++k) {
    if (head->floats[k] > info_.param_floats)
      return make_error(errc::corrupt_data, name + ": " + part_names[k] + " of " + std::to_string(head->floats[k]) +
                                                " floats, the model has " + std::to_string(info_.param_floats));
    parts[k]->resize(head->floats[k]);
  }
  if (auto ok = read_pieces(f, head->piece_floats); !ok) return ok.err();
  if (checksum64(f.theta.data(), f.theta.size() * sizeof(float)) != head->theta_sum)
    return make_error(errc::corrupt_data, name + ": parameter checksum mismatch");
  return std::move(f);
}

status snapshot_store::read_pieces(fragment_state& f, std::uint64_t piece_floats) const {
  const std::string name = fragment_name(f.fragment, f.version);
  std::vector<float>* parts[] = {&f.theta, &f.momentum, &f.adam_m, &f.adam_v};
  // The pieces expected, in key order: each part's, `piece_floats` at a time.
  std::uint8_t part = 0;
  std::uint64_t offset = 0, index = 0;
  auto settle = [&] {  // past the parts that are empty or done
    while (part < 4 && offset >= parts[part]->size()) {
      ++part;
      offset = 0;
    }
  };
  settle();
  std::vector<float> values;
  std::optional<error> failure;
  auto scanned = kv_->scan(column::pieces, piece_key(f.fragment, f.version, 0), pieces_end(f.fragment, f.version),
                           [&](std::string_view key, std::string_view value) {
    const std::string what = name + " piece " + std::to_string(index);
    auto piece = decode_piece(value, what, values);
    if (!piece) {
      failure = piece.err();
      return false;
    }
    const std::uint64_t expected_floats = part < 4 ? std::min(piece_floats, parts[part]->size() - offset) : 0;
    if (part >= 4 || key.size() != 16 || read_be32(key, 12) != index || piece->fragment != f.fragment || piece->version != f.version ||
        piece->index != index || piece->part != part || piece->offset != offset || values.size() != expected_floats) {
      failure = make_error(errc::corrupt_data, what + ": not the piece its head describes (" +
                                                   (part < 4 ? std::string(part_names[part]) : "none expected") +
                                                   " at " + std::to_string(offset) + ")");
      return false;
    }
    std::copy(values.begin(), values.end(), parts[part]->begin() + static_cast<std::ptrdiff_t>(offset));
    offset += values.size();
    ++index;
    settle();
    return true;
  });
  if (!scanned) return scanned;
  if (failure) return *failure;
  if (part < 4)
    return make_error(errc::corrupt_data, name + ": piece " + std::to_string(index) + " is missing (" +
                                              part_names[part] + " at " + std::to_string(offset) + ")");
  return {};
}

expected<merge_record> snapshot_store::read_merge(std::uint32_t fragment, std::uint64_t version) const {
  auto raw = kv_->get(column::contributions, fragment_key(fragment, version));
  if (!raw) return raw.err();
  if (!raw->has_value())
    return make_error(errc::not_found, "no recorded contributions for " + fragment_name(fragment, version));
  return decode_merge(**raw, "contributions of " + fragment_name(fragment, version));
}

expected<std::vector<std::uint64_t>> snapshot_store::merge_versions(std::uint32_t fragment) const {
  std::vector<std::uint64_t> out;
  auto scanned = kv_->scan(column::contributions, be32(fragment), be32(fragment + 1),
                           [&](std::string_view key, std::string_view) {
                             out.push_back(read_be64(key, 4));
                             return true;
                           });
  if (!scanned) return scanned.err();
  return out;
}

status snapshot_store::for_each_tape(const std::function<bool(const tape_record&)>& visit) const {
  return scan_records(
      *kv_, column::tape,
      [](std::string_view key, std::string_view value) { return decode_tape(value, read_be64(key)); }, visit);
}

expected<std::optional<tape_record>> snapshot_store::last_tape() const {
  auto last = kv_->last(column::tape);
  if (!last) return last.err();
  if (!last->has_value()) return std::optional<tape_record>{};
  auto t = decode_tape((*last)->second, read_be64((*last)->first));
  if (!t) return t.err();
  return std::optional<tape_record>(std::move(*t));
}

status snapshot_store::for_each_eval(const std::function<bool(const eval_record&)>& visit) const {
  return scan_records(
      *kv_, column::evals,
      [](std::string_view key, std::string_view value) {
        return decode_eval(value, "eval record " + std::to_string(read_be64(key)));
      },
      visit);
}

expected<std::vector<learner_ledger>> snapshot_store::ledgers() const {
  std::vector<learner_ledger> out;
  auto ok = scan_records(
      *kv_, column::ledger,
      [](std::string_view, std::string_view value) { return decode_ledger(value); },
      [&](learner_ledger l) {
        out.push_back(std::move(l));
        return true;
      });
  if (!ok) return ok.err();
  return out;
}

expected<std::vector<std::pair<std::uint32_t, std::uint64_t>>> snapshot_store::fragment_versions() const {
  std::vector<std::pair<std::uint32_t, std::uint64_t>> out;
  auto scanned = kv_->scan(column::fragments, {}, {}, [&](std::string_view key, std::string_view) {
    out.emplace_back(read_be32(key), read_be64(key, 4));
    return true;
  });
  if (!scanned) return scanned.err();
  return out;
}

expected<std::vector<float>> snapshot_store::read_params(const manifest& m, const param_layout& layout,
                                                         const fragment_plan& plan) const {
  std::vector<fragment_state> states;
  if (m.entries.size() == plan.fragments.size())  // else params_from says what is wrong
    for (const auto& e : m.entries) {
      auto f = read_fragment(e.fragment, e.version);
      if (!f) return f.err();
      states.push_back(std::move(*f));
    }
  return params_from(m, states, layout, plan);
}

expected<std::vector<float>> snapshot_store::params_from(const manifest& m, const std::vector<fragment_state>& states,
                                                         const param_layout& layout, const fragment_plan& plan) {
  if (m.entries.size() != plan.fragments.size())
    return make_error(errc::invalid_input, "version " + std::to_string(m.mesh_version) + " holds " +
                                               std::to_string(m.entries.size()) + " fragments, the model has " +
                                               std::to_string(plan.fragments.size()) +
                                               " (a store of one shard holds only its own fragments)");
  if (states.size() != m.entries.size())
    return make_error(errc::internal, "version " + std::to_string(m.mesh_version) + ": " +
                                          std::to_string(states.size()) + " fragment states for " +
                                          std::to_string(m.entries.size()) + " entries");
  std::vector<float> params(layout.total_floats, 0.f);
  for (std::size_t i = 0; i < m.entries.size(); ++i) {
    const manifest_entry& e = m.entries[i];
    const fragment_state& f = states[i];
    if (e.fragment >= plan.fragments.size())
      return make_error(errc::corrupt_data, "manifest names fragment " + std::to_string(e.fragment));
    if (f.fragment != e.fragment || f.version != e.version)
      return make_error(errc::internal, fragment_name(e.fragment, e.version) + ": handed another fragment's state");
    if (f.theta.size() != plan.fragments[e.fragment].floats)
      return make_error(errc::corrupt_data, fragment_name(e.fragment, e.version) + " has " +
                                                std::to_string(f.theta.size()) + " values, the model's fragment " +
                                                std::to_string(plan.fragments[e.fragment].floats));
    scatter_fragment(layout, plan.fragments[e.fragment], f.theta.data(), params.data());
  }
  return params;
}

void gather_fragment(const param_layout& layout, const fragment_spec& spec, const float* params, float* out) {
  for (std::size_t t : spec.tensors) {
    const tensor_spec& ts = layout.tensors[t];
    out = std::copy(params + ts.offset, params + ts.offset + ts.size(), out);
  }
}

void scatter_fragment(const param_layout& layout, const fragment_spec& spec, const float* in, float* params) {
  for (std::size_t t : spec.tensors) {
    const tensor_spec& ts = layout.tensors[t];
    std::copy(in, in + ts.size(), params + ts.offset);
    in += ts.size();
  }
}

std::string encode_record(const learner_ledger& l) { return encode(l); }
std::string encode_record(const tape_record& t) { return encode(t); }
expected<learner_ledger> decode_ledger_record(std::string_view v) { return decode_ledger(v); }
expected<tape_record> decode_tape_record(std::string_view v) { return decode_tape(v, 0); }
std::string encode_record(const store_info& s) { return encode(s); }
std::string encode_record(const fragment_state& f) { return encode(f); }
std::string encode_record(const manifest& m) { return encode(m); }
std::string encode_record(const merge_record& m) { return encode(m); }
std::string encode_record(const round_lease& l) { return encode(l); }
std::string encode_record(const eval_record& e) { return encode(e); }
std::string encode_piece_record(std::uint32_t fragment, std::uint64_t version, std::uint32_t index, std::uint8_t part,
                                std::uint64_t offset, std::span<const float> values) {
  return encode_piece(fragment, version, index, part, offset, values);
}
expected<piece_header> decode_piece_record(std::string_view v, const std::string& what, std::vector<float>& out) {
  return decode_piece(v, what, out);
}
expected<store_info> decode_store_info_record(std::string_view v) { return decode_info(v); }
expected<fragment_state> decode_fragment_record(std::string_view v, const std::string& what) {
  return decode_fragment(v, what);
}
expected<manifest> decode_manifest_record(std::string_view v, const std::string& what) {
  return decode_manifest(v, what);
}
expected<merge_record> decode_merge_record(std::string_view v, const std::string& what) { return decode_merge(v, what); }
expected<round_lease> decode_round_lease_record(std::string_view v) { return decode_lease(v); }
expected<eval_record> decode_eval_record(std::string_view v, const std::string& what) { return decode_eval(v, what); }

}  // namespace archipelago::storage
