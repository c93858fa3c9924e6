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

std::string frame(capnp::MessageBuilder& builder) {
  const kj::Array<capnp::word> flat = capnp::messageToFlatArray(builder);
  const auto bytes = flat.asBytes();
  std::string out(reinterpret_cast<const char*>(bytes.begin()), bytes.size());
  const std::uint64_t sum = checksum64(bytes.begin(), bytes.size());
  char trailer[8];
  for (int i = 0; i < 8; ++i) trailer[i] = static_cast<char>(sum >> (8 * i));
  out.append(trailer, 8);
  return out;
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

std::string encode(const fragment_state& f) {
  capnp::MallocMessageBuilder b;
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
expected<fragment_state> decode_fragment(std::string_view v, const std::string& what) {
  auto decoded = unframe<wire_snapshot::FragmentState>(v, what, [](wire_snapshot::FragmentState::Reader r) {
    fragment_state f;
    f.fragment = r.getFragment();
    f.version = r.getVersion();
    f.round = r.getRound();
    f.time_ns = r.getTimeNs();
    f.theta = floats_of(r.getTheta());
    f.momentum = floats_of(r.getMomentum());
    f.adam_m = floats_of(r.getAdamM());
    f.adam_v = floats_of(r.getAdamV());
    f.adam_steps = r.getAdamSteps();
    return std::make_pair(std::move(f), r.getThetaChecksum());
  });
  if (!decoded) return decoded.err();
  if (theta_checksum(decoded->first.theta) != decoded->second)
    return make_error(errc::corrupt_data, what + ": parameter checksum mismatch");
  return std::move(decoded->first);
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
    for (auto e : r.getEntries()) m.entries.push_back({e.getFragment(), e.getVersion(), e.getRound(), e.getThetaChecksum()});
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

snapshot_store::snapshot_store(std::shared_ptr<kv_store> kv, store_info info, retention keep)
    : kv_(std::move(kv)), info_(std::move(info)), keep_(keep) {}

expected<std::shared_ptr<snapshot_store>> snapshot_store::create(std::shared_ptr<kv_store> kv, store_info info,
                                                                 retention keep) {
  auto existing = kv->get(column::meta, store_key);
  if (!existing) return existing.err();
  if (!existing->has_value()) {
    // A foreign store with data but no info must not be adopted.
    auto any = kv->last(column::manifests);
    if (!any) return any.err();
    if (any->has_value()) return make_error(errc::corrupt_data, "the store has manifests but no store info");
    write_batch batch;
    batch.put(column::meta, std::string(store_key), encode(info));
    if (auto ok = kv->write(batch); !ok) return ok.err();
    return std::shared_ptr<snapshot_store>(new snapshot_store(std::move(kv), std::move(info), keep));
  }
  auto opened = open(std::move(kv), keep);
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

expected<std::shared_ptr<snapshot_store>> snapshot_store::open(std::shared_ptr<kv_store> kv, retention keep) {
  auto raw = kv->get(column::meta, store_key);
  if (!raw) return raw.err();
  if (!raw->has_value()) return make_error(errc::corrupt_data, "not an archipelago snapshot store (no store info)");
  auto info = decode_info(**raw);
  if (!info) return info.err();
  if (info->format != format_version)
    return make_error(errc::unsupported, "store format version " + std::to_string(info->format) +
                                             ", this build reads version " + std::to_string(format_version));
  auto store = std::shared_ptr<snapshot_store>(new snapshot_store(std::move(kv), std::move(*info), keep));
  if (auto ok = store->load_manifests(); !ok) return ok.err();
  return store;
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
    auto& refs = retained_[m->mesh_version];
    for (const auto& e : m->entries) {
      refs.emplace_back(e.fragment, e.version);
      ++references_[{e.fragment, e.version}];
    }
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

expected<std::uint64_t> snapshot_store::commit(const commit_job& job) {
  std::lock_guard lock(write_mutex_);
  write_batch batch;
  std::map<std::uint32_t, manifest_entry> cut = cut_;
  for (const auto& f : job.fragments) {
    batch.put(column::fragments, fragment_key(f.fragment, f.version), encode(f));
    cut[f.fragment] = {f.fragment, f.version, f.round, theta_checksum(f.theta)};
  }
  for (const auto& m : job.merges) batch.put(column::contributions, fragment_key(m.fragment, m.version), encode(m));

  manifest m;
  m.mesh_version = last_mesh_version_ + 1;
  m.time_ns = job.time_ns;
  m.mesh_hash = info_.mesh_hash;
  for (const auto& [p, e] : cut) m.entries.push_back(e);
  m.ledger = job.ledger;
  m.learner_steps = job.learner_steps;

  // Retention: manifests leaving the window go, and with them every fragment
  // state no surviving manifest (nor the new one) names. Mesh version 1, the
  // initial model, always stays. The bookkeeping changes only once the batch is written.
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
  std::map<std::pair<std::uint32_t, std::uint64_t>, std::uint32_t> released;  // references the leavers hold
  for (std::uint64_t v : leaving) {
    batch.del(column::manifests, be64(v));
    for (const auto& ref : retained_.at(v)) ++released[ref];
  }
  for (const auto& [ref, count] : released) {
    const manifest_entry* named = m.find(ref.first);
    if (references_.at(ref) == count && !(named && named->version == ref.second))
      batch.del(column::fragments, fragment_key(ref.first, ref.second));
  }
  batch.put(column::manifests, be64(m.mesh_version), encode(m));  // last: a torn batch leaves no manifest
  if (auto ok = kv_->write(batch); !ok) return ok.err();
  for (const auto& [ref, count] : released)
    if ((references_[ref] -= count) == 0) references_.erase(ref);
  for (std::uint64_t v : leaving) retained_.erase(v);
  auto& refs = retained_[m.mesh_version];
  for (const auto& e : m.entries) {
    refs.emplace_back(e.fragment, e.version);
    ++references_[{e.fragment, e.version}];
  }
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
  if (!batch.ops.empty()) {
    if (auto ok = kv_->write(batch); !ok) return ok.err();
  }
  if (dropped) {
    *dropped = std::move(skipped);
    if (debris) dropped->push_back(std::to_string(debris) + " uncommitted record(s) removed");
  }
  // The writer continues from the head.
  for (auto it = retained_.upper_bound(head_version); it != retained_.end(); it = retained_.erase(it))
    for (const auto& ref : it->second)
      if (--references_[ref] == 0) references_.erase(ref);
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
  auto raw = kv_->get(column::fragments, fragment_key(fragment, version));
  if (!raw) return raw.err();
  if (!raw->has_value()) return make_error(errc::not_found, fragment_name(fragment, version) + " is not in the store");
  auto f = decode_fragment(**raw, fragment_name(fragment, version));
  if (!f) return f.err();
  if (f->fragment != fragment || f->version != version)
    return make_error(errc::corrupt_data, fragment_name(fragment, version) + " holds another fragment's record");
  return f;
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
