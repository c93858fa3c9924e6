// Fuzz target for the snapshot store's record decoders (storage/FORMAT.md):
// what a damaged or hostile store directory feeds `replay`, a restarting node
// and a standby (BrokerState carries ledger and tape records).
//
// Input: byte 0 picks the record (low 4 bits: store info, fragment state,
// manifest, merge record, tape record, learner ledger, round lease, eval
// record, fragment piece; above 8 the eval record); 0x80 re-seals the XXH3 trailer so mutations reach the Cap'n Proto
// decoding behind it. The rest is the record. A record that decodes must encode
// again and decode to the same bytes (the round trip is exact).

#include <cstring>
#include <string>
#include <string_view>

#include "core/checksum.hpp"
#include "fuzz_target.hpp"
#include "storage/snapshot_store.hpp"

namespace {

using namespace archipelago::storage;

/// Decodes, and checks that encode(decode(x)) decodes to the same bytes again.
template <class Decode>
void round_trip(std::string_view bytes, Decode&& decode) {
  auto first = decode(bytes);
  if (!first) return;
  const std::string again = encode_record(*first);
  auto second = decode(again);
  FUZZ_CHECK(second.has_value());
  FUZZ_CHECK(encode_record(*second) == again);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const int kind = data[0] & 15;
  std::string record(reinterpret_cast<const char*>(data + 1), size - 1);
  if ((data[0] & 0x80) != 0 && record.size() >= 16) {
    record.resize(record.size() / 8 * 8);
    const std::size_t body = record.size() - 8;
    const std::uint64_t sum = archipelago::checksum64(record.data(), body);
    for (int i = 0; i < 8; ++i) record[body + i] = static_cast<char>(sum >> (8 * i));
  }
  const std::string what = "fuzzed record";
  switch (kind) {
    case 0: round_trip(record, [](std::string_view v) { return decode_store_info_record(v); }); break;
    case 1: round_trip(record, [&](std::string_view v) { return decode_fragment_record(v, what); }); break;
    case 2: round_trip(record, [&](std::string_view v) { return decode_manifest_record(v, what); }); break;
    case 3: round_trip(record, [&](std::string_view v) { return decode_merge_record(v, what); }); break;
    case 4: round_trip(record, [](std::string_view v) { return decode_tape_record(v); }); break;
    case 5: round_trip(record, [](std::string_view v) { return decode_ledger_record(v); }); break;
    case 6: round_trip(record, [](std::string_view v) { return decode_round_lease_record(v); }); break;
    case 8: {
      std::vector<float> values;
      auto piece = decode_piece_record(record, what, values);
      if (!piece) break;
      const std::string again = encode_piece_record(piece->fragment, piece->version, piece->index, piece->part,
                                                    piece->offset, values);
      std::vector<float> values_again;
      auto second = decode_piece_record(again, what, values_again);
      FUZZ_CHECK(second.has_value() && second->offset == piece->offset && values_again.size() == values.size());
      FUZZ_CHECK(values.empty() || std::memcmp(values_again.data(), values.data(), values.size() * sizeof(float)) == 0);
      break;
    }
    default: round_trip(record, [&](std::string_view v) { return decode_eval_record(v, what); }); break;
  }
  return 0;
}

std::vector<std::vector<std::uint8_t>> fuzz_seeds() {
  std::vector<std::string> records;
  store_info info;
  info.config_toml = "[mesh]\nlearners = 4\n";
  info.layout_fingerprint = 0x1234;
  info.param_floats = 96;
  records.push_back(encode_record(info));
  fragment_state f;
  f.fragment = 3;
  f.version = 7;
  f.theta = {1.f, -2.f, 0.5f};
  f.momentum = {0.1f, 0.2f, 0.3f};
  records.push_back(encode_record(f));
  manifest m;
  m.mesh_version = 9;
  m.entries = {{0, 4, 3, 11}, {1, 5, 4, 12}};
  m.ledger = {100, 5, 1, 2, 110, 2};
  records.push_back(encode_record(m));
  merge_record mr;
  mr.fragment = 1;
  mr.version = 5;
  mr.contributions = {{0, 1, 10, 4096, {0.5f, -0.5f}}, {2, 1, 9, 2048, {1.f, 2.f}}};
  records.push_back(encode_record(mr));
  tape_record t;
  t.round = 12;
  t.reason = "quorum";
  t.members = {{0, 1, 0.5, 4096, 10}, {1, 1, 0.5, 4096, 10}};
  t.late = {{2, 3, 0, 100, 1}};
  t.screened_out = {{3, 1, 0.5, 4096, 10}};
  t.broker_epoch = 1 << 8;
  records.push_back(encode_record(t));
  learner_ledger l;
  l.learner = 2;
  l.endpoint = "tcp://127.0.0.1:7002";
  l.fragments = {{1, 2, 3, 4, 5, 6}};
  l.tail_tokens = {10, 20};
  l.tail_time_us = {30, 40};
  l.tail_buckets = {1, 2, 3, 4};
  records.push_back(encode_record(l));
  records.push_back(encode_record(round_lease{4096, 3, 77}));
  records.push_back(encode_record(eval_record{9, 100, 2.5, 4096}));
  const std::vector<float> piece = {1.f, -2.f, 0.5f, 4.f};
  records.push_back(encode_piece_record(3, 7, 1, 1, 4, piece));
  std::vector<std::vector<std::uint8_t>> out;
  for (std::size_t k = 0; k < records.size(); ++k) {
    std::vector<std::uint8_t> in{static_cast<std::uint8_t>(k | 0x80)};
    in.insert(in.end(), records[k].begin(), records[k].end());
    out.push_back(std::move(in));
  }
  return out;
}
