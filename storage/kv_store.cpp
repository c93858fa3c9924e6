#include "storage/kv_store.hpp"

#include "core/invariant.hpp"

namespace archipelago::storage {

const char* to_string(column c) {
  // Also the RocksDB column family names; meta lives in RocksDB's "default" family.
  switch (c) {
    case column::meta: return "meta";
    case column::fragments: return "fragments";
    case column::manifests: return "manifests";
    case column::tape: return "tape";
    case column::ledger: return "ledger";
    case column::contributions: return "contributions";
    case column::evals: return "evals";
    case column::pieces: return "pieces";
  }
  return "unknown";
}

std::size_t write_batch::bytes() const {
  std::size_t total = 0;
  for (const op& o : ops) total += o.key.size() + (o.value ? o.value->size() : 0) + (o.range_end ? o.range_end->size() : 0);
  return total;
}

std::string be32(std::uint32_t v) {
  std::string s(4, '\0');
  for (int i = 3; i >= 0; --i, v >>= 8) s[static_cast<std::size_t>(i)] = static_cast<char>(v & 0xff);
  return s;
}

std::string be64(std::uint64_t v) {
  std::string s(8, '\0');
  for (int i = 7; i >= 0; --i, v >>= 8) s[static_cast<std::size_t>(i)] = static_cast<char>(v & 0xff);
  return s;
}

std::uint32_t read_be32(std::string_view s, std::size_t at) {
  ARCHIPELAGO_INVARIANT(at <= s.size() && s.size() - at >= 4, "kv key: 4 bytes to read (callers check lengths)");
  std::uint32_t v = 0;
  for (std::size_t i = 0; i < 4; ++i) v = (v << 8) | static_cast<unsigned char>(s[at + i]);
  return v;
}

std::uint64_t read_be64(std::string_view s, std::size_t at) {
  ARCHIPELAGO_INVARIANT(at <= s.size() && s.size() - at >= 8, "kv key: 8 bytes to read (callers check lengths)");
  std::uint64_t v = 0;
  for (std::size_t i = 0; i < 8; ++i) v = (v << 8) | static_cast<unsigned char>(s[at + i]);
  return v;
}

}  // namespace archipelago::storage
