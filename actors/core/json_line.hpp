#pragma once
// One JSON object on one line: the summaries `--json` prints and the status a
// node serves. Numbers that are NaN or infinite become null.

#include <cstdint>
#include <string>

namespace archipelago {

/// Builds the one-line JSON summary. Numbers that are NaN become null.
class json_line {
 public:
  json_line& add(const std::string& key, const std::string& value);
  json_line& add(const std::string& key, const char* value) { return add(key, std::string(value)); }
  json_line& add(const std::string& key, double value);
  json_line& add(const std::string& key, std::int64_t value);
  json_line& add(const std::string& key, int value) { return add(key, static_cast<std::int64_t>(value)); }
  json_line& add(const std::string& key, std::uint64_t value);
  json_line& add(const std::string& key, bool value);
  json_line& add_raw(const std::string& key, const std::string& json);
  std::string str() const { return "{" + body_ + "}"; }

 private:
  void key(const std::string& k);
  std::string body_;
};

std::string json_escape(const std::string& s);

}  // namespace archipelago
