#include "bench/reference_script.hpp"

#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>

namespace archipelago {

expected<std::string> last_json_line(const std::string& command, const std::string& program, const std::string& what,
                                     std::size_t tail_chars) {
  FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  if (pipe == nullptr) return make_error(errc::internal, "cannot start " + program);
  std::string output, line, last;
  std::array<char, 8192> buf{};
  // fgets splits a line longer than the buffer: pieces are joined until the newline.
  while (std::fgets(buf.data(), buf.size(), pipe) != nullptr) {
    output += buf.data();
    line += buf.data();
    if (line.back() != '\n') continue;
    if (line.front() == '{') last = line;
    line.clear();
  }
  if (!line.empty() && line.front() == '{') last = line;
  const int rc = pclose(pipe);
  if (rc != 0 || last.empty())
    return make_error(errc::internal, what + " failed (exit " + std::to_string(rc) + "): " +
                                          output.substr(output.size() > tail_chars ? output.size() - tail_chars : 0));
  return last;
}

double json_number(const std::string& line, const std::string& key) {
  const std::string needle = "\"" + key + "\":";
  const auto at = line.find(needle);
  if (at == std::string::npos) return std::nan("");
  return std::strtod(line.c_str() + at + needle.size(), nullptr);
}

std::string json_string(const std::string& line, const std::string& key) {
  const std::string needle = "\"" + key + "\": \"";
  auto at = line.find(needle);
  std::size_t skip = needle.size();
  if (at == std::string::npos) {
    at = line.find("\"" + key + "\":\"");
    skip = key.size() + 4;
  }
  if (at == std::string::npos) return "";
  const auto end = line.find('"', at + skip);
  return line.substr(at + skip, end - at - skip);
}

status require_openblas(const std::string& blas, const std::string& who) {
  std::error_code ec;
  const std::string resolved = std::filesystem::canonical(blas, ec).string();
  if (!ec && resolved.find("openblas") != std::string::npos) return {};
  return make_error(errc::not_found, who + " runs on OpenBLAS, and '" + blas + "' is " +
                                         (ec ? "not there" : "not OpenBLAS (it resolves to '" + resolved + "')") +
                                         ": install libopenblas0-openmp (WITH_TORCH=1 tools/setup.sh). Without it "
                                         "PyTorch runs the reference BLAS and every ratio would overstate the engine");
}

}  // namespace archipelago
