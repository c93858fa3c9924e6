#include <doctest/doctest.h>

#include <cmath>
#include <limits>

#include "core/prometheus_text.hpp"

using namespace archipelago;

TEST_CASE("prometheus text: one HELP and TYPE per family, samples grouped under it") {
  prometheus_text page;
  page.counter("archipelago_steps_total", "Inner steps.", 10, {{"role", "learner"}, {"index", "0"}});
  page.gauge("archipelago_up", "1 while the node runs.", 1);
  page.counter("archipelago_steps_total", "Inner steps.", 12, {{"role", "learner"}, {"index", "1"}});
  CHECK(page.str() ==
        "# HELP archipelago_steps_total Inner steps.\n"
        "# TYPE archipelago_steps_total counter\n"
        "archipelago_steps_total{role=\"learner\",index=\"0\"} 10\n"
        "archipelago_steps_total{role=\"learner\",index=\"1\"} 12\n"
        "# HELP archipelago_up 1 while the node runs.\n"
        "# TYPE archipelago_up gauge\n"
        "archipelago_up 1\n");
}

TEST_CASE("prometheus text: values and label escaping") {
  prometheus_text page;
  page.gauge("g", "help with \\ and\nnewline", 0.25, {{"path", "a\"b\\c\nd"}});
  page.gauge("g", "", std::numeric_limits<double>::quiet_NaN(), {{"path", "nan"}});
  page.gauge("g", "", std::numeric_limits<double>::infinity(), {{"path", "inf"}});
  page.gauge("g", "", 1e20, {{"path", "big"}});
  page.gauge("g", "", -3, {{"path", "neg"}});
  const std::string s = page.str();
  CHECK(s.find("# HELP g help with \\\\ and\\nnewline\n") != std::string::npos);
  CHECK(s.find("g{path=\"a\\\"b\\\\c\\nd\"} 0.25\n") != std::string::npos);
  CHECK(s.find("g{path=\"nan\"} NaN\n") != std::string::npos);
  CHECK(s.find("g{path=\"inf\"} +Inf\n") != std::string::npos);
  CHECK(s.find("g{path=\"big\"} 1e+20\n") != std::string::npos);
  CHECK(s.find("g{path=\"neg\"} -3\n") != std::string::npos);
}

TEST_CASE("prometheus text: metric names") {
  CHECK(prometheus_text::valid_name("archipelago_rounds_total"));
  CHECK(prometheus_text::valid_name("a:b_c9"));
  CHECK_FALSE(prometheus_text::valid_name(""));
  CHECK_FALSE(prometheus_text::valid_name("9abc"));
  CHECK_FALSE(prometheus_text::valid_name("a-b"));
  CHECK(prometheus_text{}.empty());
}
