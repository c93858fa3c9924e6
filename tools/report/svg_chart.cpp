#include "report/svg_chart.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace archipelago {

const char* series_color(std::size_t i) {
  static const char* palette[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b"};
  return palette[i % std::size(palette)];
}

std::string num(double v, const char* format) {
  if (!std::isfinite(v)) return "null";
  char text[48];
  std::snprintf(text, sizeof text, format, v);
  return text;
}

std::string html_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '<') out += "&lt;";
    else if (c == '>') out += "&gt;";
    else if (c == '&') out += "&amp;";
    else if (c == '"') out += "&quot;";
    else out += c;
  }
  return out;
}

/// A line chart; bands shade time ranges (the faults).
std::string chart(const std::string& title, const std::string& x_label, const std::string& y_label,
                  const std::vector<series>& lines, const std::vector<band>& bands, double x_max,
                  const std::vector<std::pair<double, std::string>>& x_ticks, double x_min,
                  double y_min) {
  constexpr double w = 860, h = 260, left = 60, right = 20, bottom = 40;
  // The legend sits right-aligned on the title's line, or on a line of its own when both do not fit.
  double legend_width = 0;
  for (const auto& s : lines)
    if (!s.name.empty()) legend_width += 12 + 7.0 * static_cast<double>(s.name.size());
  const bool legend_below_title = left + 7.5 * static_cast<double>(title.size()) + 20 > w - right - legend_width;
  const double top = legend_below_title ? 44 : 28, legend_y = legend_below_title ? 36 : 18;
  double x0 = x_min, x1 = x_max, y0 = y_min, y1 = 0;
  for (const auto& s : lines)
    for (const auto* points : {&s.points, &s.area})
      for (const auto& [x, y] : *points) {
        if (x_max < 0) x1 = std::max(x1, x);
        if (std::isfinite(y)) y1 = std::max(y1, y);
      }
  if (x1 <= x0) x1 = x0 + 1;
  if (y1 <= y0) y1 = y0 + 1;
  // Four y ticks at round numbers: a step of 1, 1.5, 2, 2.5, 3, 4, 5, 6 or 8 times a power of ten.
  auto tick_step = [](double span) {
    const double raw_step = span / 4, decade = std::pow(10, std::floor(std::log10(raw_step)));
    for (double m : {1.0, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0})
      if (m * decade >= raw_step) return m * decade;
    return 10 * decade;
  };
  double y_step = tick_step(y1 - y0);
  y0 = std::floor(y0 / y_step) * y_step;
  if (y0 + 4 * y_step < y1) y_step = tick_step(y1 - y0);
  y1 = y0 + 4 * y_step;
  auto X = [&](double x) { return left + (x - x0) / (x1 - x0) * (w - left - right); };
  auto Y = [&](double y) { return top + (1 - (y - y0) / (y1 - y0)) * (h - top - bottom); };
  std::string out = "<svg width=\"" + num(w) + "\" height=\"" + num(h) + "\" xmlns=\"http://www.w3.org/2000/svg\">";
  out += "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>";  // readable on a dark page too
  out += "<text x=\"" + num(left) + "\" y=\"18\" font-weight=\"bold\" font-size=\"13\">" + html_escape(title) + "</text>";
  for (const auto& b : bands)
    out += "<rect x=\"" + num(X(b.from)) + "\" y=\"" + num(top) + "\" width=\"" + num(std::max(1.0, X(b.to) - X(b.from))) +
           "\" height=\"" + num(h - top - bottom) + "\" fill=\"" + b.color + "\" opacity=\"0.15\"><title>" +
           html_escape(b.label) + "</title></rect>";
  out += "<rect x=\"" + num(left) + "\" y=\"" + num(top) + "\" width=\"" + num(w - left - right) + "\" height=\"" +
         num(h - top - bottom) + "\" fill=\"none\" stroke=\"#999\"/>";
  auto x_tick = [&](double xv, const std::string& label) {
    out += "<text x=\"" + num(X(xv)) + "\" y=\"" + num(h - bottom + 16) + "\" font-size=\"11\" text-anchor=\"middle\">" +
           html_escape(label) + "</text>";
  };
  for (int i = 0; i <= 4; ++i) {
    const double yv = y0 + (y1 - y0) * i / 4, xv = x0 + (x1 - x0) * i / 4;
    out += "<text x=\"" + num(left - 6) + "\" y=\"" + num(Y(yv) + 4) + "\" font-size=\"11\" text-anchor=\"end\">" +
           num(yv, "%.3g") + "</text>";
    if (x_ticks.empty())  // large counts (tokens) as 1.23M, 456k
      x_tick(xv, xv >= 1e6 ? num(xv / 1e6, "%.3g") + "M" : xv >= 1e4 ? num(xv / 1e3, "%.3g") + "k"
                 : num(xv, xv >= 100 ? "%.0f" : "%.3g"));
  }
  for (const auto& [xv, label] : x_ticks) x_tick(xv, label);
  out += "<text x=\"" + num((left + w - right) / 2) + "\" y=\"" + num(h - 6) +
         "\" font-size=\"12\" text-anchor=\"middle\">" + html_escape(x_label) + "</text>";
  out += "<text x=\"14\" y=\"" + num((top + h - bottom) / 2) + "\" font-size=\"12\" text-anchor=\"middle\" transform=\"rotate(-90 14 " +
         num((top + h - bottom) / 2) + ")\">" + html_escape(y_label) + "</text>";
  for (const auto& s : lines) {  // areas under every line
    if (s.area.empty()) continue;
    std::string path;
    for (const auto& [x, y] : s.area)
      if (std::isfinite(y)) path += (path.empty() ? "M" : " L") + num(X(x), "%.1f") + "," + num(Y(y), "%.1f");
    out += "<path d=\"" + path + " Z\" fill=\"" + s.color + "\" opacity=\"0.18\" stroke=\"none\"/>";
  }
  double legend_x = w - right - legend_width;
  for (const auto& s : lines) {
    if (s.points.empty() && s.name.empty()) continue;  // an area alone
    std::string path;
    bool pen_down = false;  // a non-finite value breaks the line
    for (const auto& [x, y] : s.points) {
      if (!std::isfinite(y)) {
        pen_down = false;
        continue;
      }
      path += (pen_down ? " L" : " M") + num(X(x), "%.1f") + "," + num(Y(y), "%.1f");
      pen_down = true;
      if (s.dashed)
        out += "<circle cx=\"" + num(X(x), "%.1f") + "\" cy=\"" + num(Y(y), "%.1f") + "\" r=\"2.5\" fill=\"" + s.color + "\"/>";
    }
    out += "<path d=\"" + path + "\" fill=\"none\" stroke=\"" + s.color + "\" stroke-width=\"1.5\"" +
           (s.dashed ? " stroke-dasharray=\"5,4\"" : "") + "/>";
    if (s.name.empty()) continue;
    out += "<text x=\"" + num(legend_x) + "\" y=\"" + num(legend_y) + "\" font-size=\"12\" fill=\"" + s.color + "\">" + html_escape(s.name) + "</text>";
    legend_x += 12 + 7.0 * static_cast<double>(s.name.size());
  }
  return out + "</svg>";
}

std::string stack_charts(const std::vector<std::string>& charts) {
  // Every chart is 860 wide; its height is read back from its own header.
  double y = 0;
  std::string body;
  for (const auto& c : charts) {
    const auto at = c.find("height=\"");
    const double h = at == std::string::npos ? 0 : std::atof(c.c_str() + at + 8);
    body += "<g transform=\"translate(0," + num(y) + ")\">" + c + "</g>";
    y += h;
  }
  return "<svg width=\"860\" height=\"" + num(y) + "\" xmlns=\"http://www.w3.org/2000/svg\">" + body + "</svg>";
}

std::string activity_strips(const std::string& title, const std::vector<std::vector<std::pair<double, double>>>& rates,
                            const std::vector<band>& marks, double x_max) {
  const int rows = static_cast<int>(rates.size());
  constexpr double w = 860, left = 80, right = 20, top = 28, row_h = 22;
  const double h = top + rows * row_h + 30;
  const double x1 = std::max(1.0, x_max);
  auto X = [&](double x) { return left + x / x1 * (w - left - right); };
  std::string out = "<svg width=\"" + num(w) + "\" height=\"" + num(h) + "\" xmlns=\"http://www.w3.org/2000/svg\">";
  out += "<text x=\"" + num(left) + "\" y=\"18\" font-weight=\"bold\">" + html_escape(title) + "</text>";
  double peak = 0;
  for (const auto& row : rates)
    for (const auto& [t, v] : row) peak = std::max(peak, v);
  for (int l = 0; l < rows; ++l) {
    const double y = top + l * row_h;
    out += "<text x=\"" + num(left - 6) + "\" y=\"" + num(y + 13) + "\" font-size=\"11\" text-anchor=\"end\">learner/" +
           std::to_string(l) + "</text>";
    double prev_t = 0;
    for (const auto& [t, v] : rates[static_cast<std::size_t>(l)]) {
      const double shade = peak > 0 ? v / peak : 0;
      out += "<rect x=\"" + num(X(prev_t), "%.1f") + "\" y=\"" + num(y) + "\" width=\"" +
             num(std::max(0.5, X(t) - X(prev_t)), "%.1f") + "\" height=\"" + num(row_h - 8) + "\" fill=\"#1f77b4\" opacity=\"" +
             num(shade, "%.2f") + "\"/>";
      prev_t = t;
    }
  }
  for (const auto& b : marks) {
    if (b.row < 0 || b.row >= rows) continue;
    const double y = top + b.row * row_h + row_h - 7;
    out += "<rect x=\"" + num(X(b.from), "%.1f") + "\" y=\"" + num(y) + "\" width=\"" +
           num(std::max(1.5, X(b.to) - X(b.from)), "%.1f") + "\" height=\"4\" fill=\"" + b.color + "\"><title>" +
           html_escape(b.label) + "</title></rect>";
  }
  for (int i = 0; i <= 4; ++i)
    out += "<text x=\"" + num(X(x1 * i / 4)) + "\" y=\"" + num(h - 12) + "\" font-size=\"11\" text-anchor=\"middle\">" +
           num(x1 * i / 4, "%.4g") + " s</text>";
  return out + "</svg>";
}

}  // namespace archipelago
