#include "core/prometheus_text.hpp"

#include <cmath>
#include <cstdio>

#include "core/invariant.hpp"

namespace archipelago {

bool prometheus_text::valid_name(const std::string& name) {
  if (name.empty()) return false;
  for (std::size_t i = 0; i < name.size(); ++i) {
    const char c = name[i];
    const bool letter = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':';
    if (!letter && !(i > 0 && c >= '0' && c <= '9')) return false;
  }
  return true;
}

std::string prometheus_text::escape_label(const std::string& value) {
  std::string out;
  out.reserve(value.size());
  for (char c : value) {
    if (c == '\\') out += "\\\\";
    else if (c == '"') out += "\\\"";
    else if (c == '\n') out += "\\n";
    else out += c;
  }
  return out;
}

prometheus_text& prometheus_text::add(const std::string& name, kind k, const std::string& help, double value,
                                      const metric_labels& labels) {
  ARCHIPELAGO_INVARIANT(valid_name(name), "metrics: a valid metric name");
  ARCHIPELAGO_INVARIANT(k != kind::counter || (name.size() > 6 && name.compare(name.size() - 6, 6, "_total") == 0),
                        "metrics: a counter's name ends in _total");
  for (auto& f : families_)
    if (f.name == name) {
      ARCHIPELAGO_INVARIANT(f.k == k, "metrics: one kind per family");
      f.samples.emplace_back(labels, value);
      return *this;
    }
  families_.push_back({name, help, k, {{labels, value}}});
  return *this;
}

namespace {

// Help text escapes only backslash and newline.
std::string escape_help(const std::string& help) {
  std::string out;
  for (char c : help) {
    if (c == '\\') out += "\\\\";
    else if (c == '\n') out += "\\n";
    else out += c;
  }
  return out;
}

std::string format_value(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  char buf[40];
  // Integers (counts, bytes) print exactly; the rest with full precision.
  if (v == std::floor(v) && std::fabs(v) < 9.007199254740992e15)
    std::snprintf(buf, sizeof buf, "%.0f", v);
  else
    std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

}  // namespace

std::string prometheus_text::str() const {
  std::string out;
  for (const auto& f : families_) {
    out += "# HELP " + f.name + " " + escape_help(f.help) + "\n";
    out += "# TYPE " + f.name + (f.k == kind::counter ? " counter\n" : " gauge\n");
    for (const auto& [labels, value] : f.samples) {
      out += f.name;
      if (!labels.empty()) {
        out += '{';
        for (std::size_t i = 0; i < labels.size(); ++i) {
          ARCHIPELAGO_INVARIANT(valid_name(labels[i].first) && labels[i].first.find(':') == std::string::npos,
                                "metrics: a valid label name");
          out += (i ? "," : "") + labels[i].first + "=\"" + escape_label(labels[i].second) + "\"";
        }
        out += '}';
      }
      out += ' ' + format_value(value) + '\n';
    }
  }
  return out;
}

}  // namespace archipelago
