#pragma once
// Self-contained SVG charts for the HTML reports of `run` and `drill`: line
// charts with shaded time bands, and per-learner activity strips.

#include <cstddef>
#include <string>
#include <utility>
#include <vector>


namespace archipelago {

/// The colour of a chart's i-th series: one palette for every chart (Tableau's first six), so
/// the same series order gives the same colours everywhere; it repeats after six.
const char* series_color(std::size_t i);

/// A number for SVG and JSON; non-finite values become "null".
std::string num(double v, const char* format = "%.4g");
std::string html_escape(const std::string& s);

struct series {
  std::string name, color;  // an empty name stays out of the legend
  std::vector<std::pair<double, double>> points;
  bool dashed = false;  // with a dot at every point (a reference beside a measurement)
  /// A polygon shaded in the series' colour (a band: the upper edge, then the lower one reversed).
  std::vector<std::pair<double, double>> area = {};
};
struct band {
  double from, to;
  std::string color, label;
  int row = -1;  // -1: the whole height; otherwise the row of a strip chart
};

/// A line chart; bands shade time ranges (faults). x_max < 0: the data's largest x.
/// x_ticks: labels at chosen x positions instead of five evenly spaced numbers. The
/// axes start at x_min and y_min (y_min rounded down to a tick).
std::string chart(const std::string& title, const std::string& x_label, const std::string& y_label,
                  const std::vector<series>& lines, const std::vector<band>& bands, double x_max = -1,
                  const std::vector<std::pair<double, std::string>>& x_ticks = {}, double x_min = 0,
                  double y_min = 0);

/// Charts one above the other in one standalone SVG document (the benchmarks' plots).
std::string stack_charts(const std::vector<std::string>& charts);


/// One strip per learner over time, shaded by its rate (darker = faster); bands
/// with a row mark something that happened to that learner below its strip.
std::string activity_strips(const std::string& title, const std::vector<std::vector<std::pair<double, double>>>& rates,
                            const std::vector<band>& marks, double x_max);

/// Rate of a counter over a sliding window of `window_s`, per sample (samples have a t_s).
template <class Sample, class F>
std::vector<std::pair<double, double>> rate(const std::vector<Sample>& samples, double window_s, F value) {
  std::vector<std::pair<double, double>> out;
  std::size_t j = 0;
  for (std::size_t i = 0; i < samples.size(); ++i) {
    while (j < i && samples[i].t_s - samples[j].t_s > window_s) ++j;
    const double dt = samples[i].t_s - samples[j].t_s;
    if (dt <= 0) continue;
    out.emplace_back(samples[i].t_s, (value(samples[i]) - value(samples[j])) / dt);
  }
  return out;
}

}  // namespace archipelago
