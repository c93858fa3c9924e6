// simulate wan's plan: a round's path and the bandwidth floors against their
// closed forms, the least P that hides, and bench scale's JSON read by name.

#include "simulate/wan_plan.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <fstream>
#include <string>

#include "temp_dir.hpp"

using namespace archipelago::wan;

namespace {

inputs example() {
  inputs in;
  in.params = 12e9;
  in.fragments = 24;
  in.tau = 2;
  in.learners = 4;
  in.gbit = {2, 5};
  in.latency_ms = 20;
  in.step_s = 1.5;
  in.up_bytes_per_param = 2;
  in.down_bytes_per_param = 4;
  in.dp_bytes_per_param = 2;
  in.c = {0.05, 0.1, 0.01, 1.05};
  return in;
}

}  // namespace

TEST_CASE("wan plan: a round's path, the link's busy share and dp's exchange, in closed form") {
  const inputs in = example();
  REQUIRE(validate(in));
  const result r = plan(in);
  const double n = 12e9 / 24;
  CHECK(r.fragment_params == doctest::Approx(n));
  CHECK(r.up_bytes == doctest::Approx(n * 2 * 1.05));
  CHECK(r.down_bytes == doctest::Approx(n * 4 * 1.05));
  CHECK(r.after_step_s == doctest::Approx(0.01 * 48));  // per GB of the model, 48 GB
  CHECK(r.period_s == doctest::Approx(1.5 + 0.48));
  const double merge = 0.05 * 4 * n * 4 / 1e9, commit = 0.1 * n * 8 / 1e9;
  CHECK(r.fixed_path_s == doctest::Approx(merge + commit + 0.04));
  REQUIRE(r.links.size() == 2);
  const link_result& l = r.links[1];  // 5 Gbit/s
  CHECK(l.up_s == doctest::Approx(r.up_bytes / 625e6));
  CHECK(l.down_s == doctest::Approx(r.down_bytes / 625e6));
  CHECK(l.path_s == doctest::Approx(l.up_s + l.down_s + merge + commit + 0.04));
  CHECK(l.budget_s == doctest::Approx(2 * r.period_s));
  CHECK(l.utilisation_down == doctest::Approx(l.down_s / r.period_s));
  CHECK(l.hidden == (l.path_s <= l.budget_s && l.utilisation_up <= 1 && l.utilisation_down <= 1));
  // dp: a ring all-reduce of bf16 gradients among 4 sites, 2·3/4 of the model each way.
  CHECK(r.dp_bytes_per_step == doctest::Approx(1.5 * 12e9 * 2));
  CHECK(l.dp_step_s == doctest::Approx(1.5 + 1.5 * 24e9 / 625e6));
  CHECK(l.speedup == doctest::Approx(l.dp_step_s / r.period_s));
  CHECK(r.dp_floor_gbit == doctest::Approx(1.5 * 24e9 * 8 / 1e9 / 1.5));
  // The reference step: 6 N tokens on the reference chips.
  inputs ref = in;
  ref.step_s = 0;
  const result rr = plan(ref);
  CHECK(rr.step_from_reference);
  CHECK(rr.step_s == doctest::Approx(6 * 12e9 * 1048576 / (256 * 200e12)));
}

TEST_CASE("wan plan: at the floor every round hides, just below it not, and the least P that hides") {
  for (int tau : {1, 2, 4}) {
    for (double latency_ms : {0.0, 20.0, 200.0}) {
      inputs in = example();
      in.tau = tau;
      in.latency_ms = latency_ms;
      const result r = plan(in);
      INFO("tau " << tau << ", latency " << latency_ms << " ms: floor " << r.floor_gbit
                  << " Gbit/s");
      REQUIRE(std::isfinite(r.floor_gbit));
      CHECK(r.floor_gbit == doctest::Approx(std::max(r.floor_throughput_gbit, r.floor_path_gbit)));
      in.gbit = {r.floor_gbit * 1.0001, r.floor_gbit * 0.999};
      const result at = plan(in);
      CHECK(at.links[0].hidden);
      CHECK_FALSE(at.links[1].hidden);
      CHECK(at.links[0].sync_every_steps == doctest::Approx(24));
      CHECK(at.links[1].sync_every_steps > 24);
      // The least P that hides at 2 Gbit/s: it hides, one fewer does not.
      in.gbit = {2};
      const int need = plan(in).links[0].fragments_needed;
      REQUIRE(need > 1);
      in.fragments = need;
      CHECK(plan(in).links[0].hidden);
      in.fragments = need - 1;
      CHECK_FALSE(plan(in).links[0].hidden);
    }
  }
  // A fixed part (merge, commit, latency) longer than tau steps: no bandwidth hides it.
  inputs slow = example();
  slow.latency_ms = 5000;
  slow.tau = 1;
  const result r = plan(slow);
  CHECK(std::isinf(r.floor_gbit));
  CHECK_FALSE(r.links[0].hidden);
}

TEST_CASE("wan plan: the kernels' costs, and the inputs refused with their name") {
  const kernel_figures k{8.0, 0.5, 0.3, 0.125, 1.0};
  const costs c = costs_from(k, 24);
  CHECK(c.merge_s_per_gb == 0.5);
  CHECK(c.commit_s_per_gb == 1.0);
  CHECK(c.after_step_s_per_gb == doctest::Approx((0.3 + 0.125) / 24));
  CHECK(c.wire_ratio == doctest::Approx(1538.0 / 1448.0));
  const kernel_figures rec = recorded_kernels();
  CHECK(rec.copy_gb_per_s > 0);
  CHECK(rec.merge_s_per_gb > 0);
  CHECK(rec.disk_s_per_gb > 0);

  auto refused = [](inputs in, const char* word) {
    const auto st = validate(in);
    REQUIRE_FALSE(st);
    INFO(st.err().message);
    CHECK(st.err().message.find(word) != std::string::npos);
  };
  inputs in = example();
  in.fragments = 0;
  refused(in, "fragments");
  in = example();
  in.gbit = {2, -1};
  refused(in, "bandwidth");
  in = example();
  in.c.wire_ratio = 0.5;
  refused(in, "wire-ratio");
  in = example();
  in.c.merge_s_per_gb = std::nan("");
  refused(in, "merge");
  in = example();
  in.step_s = 0;
  in.chips = 0;
  refused(in, "chips");
}

TEST_CASE("wan plan: bench scale's JSON, read by name") {
  archipelago::testing::temp_dir dir("wan-costs");
  auto file = [&](const std::string& name, const std::string& text) {
    const std::string path = dir.file(name);
    std::ofstream(path) << text;
    return path;
  };
  // Top level, the last JSON line of the output.
  auto c = read_costs_file(
      file("flat.json",
           "bench scale: ...\n{\"command\":\"x\"}\n{\"command\":\"bench scale\",\"merge_s_per_gb\":"
           "0.4,\"commit_s_per_gb\":2,\"after_step_s_per_gb\":0.05,\"wire_ratio\":1.1}\n"));
  REQUIRE(c);
  CHECK(c->merge_s_per_gb == 0.4);
  CHECK(c->commit_s_per_gb == 2);
  CHECK(c->after_step_s_per_gb == 0.05);
  CHECK(c->wire_ratio == 1.1);
  // Per size: the largest model's.
  c = read_costs_file(
      file("sizes.json",
           "{\"sizes\":[{\"params\":1e9,\"merge_s_per_gb\":0.5,\"commit_s_per_gb\":3,"
           "\"after_step_s_per_gb\":0.1,\"wire_ratio\":1.2},{\"params\":1e7,\"merge_s_per_gb\":9,"
           "\"commit_s_per_gb\":9,\"after_step_s_per_gb\":9,\"wire_ratio\":9}]}\n"));
  REQUIRE(c);
  CHECK(c->merge_s_per_gb == 0.5);
  CHECK(c->wire_ratio == 1.2);
  auto refused = [](const archipelago::expected<costs>& got, const char* words) {
    REQUIRE_FALSE(got);
    INFO(got.err().message);
    CHECK(got.err().message.find(words) != std::string::npos);
  };
  refused(read_costs_file(file(
              "missing.json", "{\"merge_s_per_gb\":0.4,\"commit_s_per_gb\":2,\"wire_ratio\":1}\n")),
          "no numeric field \"after_step_s_per_gb\"");
  refused(read_costs_file(file("text.json", "not json\n")), "no line holds a JSON object");
  refused(read_costs_file(dir.file("absent.json")), "cannot be read");
  refused(
      read_costs_file(file("wire.json",
                           "{\"merge_s_per_gb\":0.4,\"commit_s_per_gb\":2,\"after_step_s_per_gb\":"
                           "0.1,\"wire_ratio\":0.9}\n")),
      "wire ratio >= 1");
}
