#pragma once
// Prometheus text exposition format (version 0.0.4): what a node's /metrics
// serves. Samples are grouped by family, each family written once with its
// HELP and TYPE lines, so several actors of one process can add to the same
// family (each with its own labels) and the page still parses.

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace archipelago {

using metric_labels = std::vector<std::pair<std::string, std::string>>;

class prometheus_text {
 public:
  enum class kind { counter, gauge };

  /// Adds one sample. `name` must be a valid metric name ([a-zA-Z_:][a-zA-Z0-9_:]*);
  /// counters end in _total by convention (asserted). The first sample of a
  /// family fixes its kind and help; a later one with another kind is a programmer error.
  prometheus_text& add(const std::string& name, kind k, const std::string& help, double value,
                       const metric_labels& labels = {});
  prometheus_text& counter(const std::string& name, const std::string& help, double value,
                           const metric_labels& labels = {}) {
    return add(name, kind::counter, help, value, labels);
  }
  prometheus_text& gauge(const std::string& name, const std::string& help, double value,
                         const metric_labels& labels = {}) {
    return add(name, kind::gauge, help, value, labels);
  }

  /// The page: families in the order they were first added.
  std::string str() const;
  bool empty() const { return families_.empty(); }

  /// A label value escaped for the text format (backslash, quote, newline).
  static std::string escape_label(const std::string& value);
  static bool valid_name(const std::string& name);

 private:
  struct family {
    std::string name, help;
    kind k;
    std::vector<std::pair<metric_labels, double>> samples;
  };
  std::vector<family> families_;
};

}  // namespace archipelago
