// Fault plans: every mistake refused before anything starts, with the line;
// a valid plan expanded into the same timeline for the same seed; the chaos
// core walking a timeline (inject, skip a down target, repair, heal).

#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "chaos_monkey/chaos_core.hpp"
#include "chaos_monkey/fault_plan.hpp"

using namespace archipelago;

namespace {

constexpr nanos s = 1'000'000'000;

/// The error of parsing `text` as plan.toml for 4 learners and 2 shards ("" when it parses).
std::string error_of(const std::string& text) {
  auto plan = parse_fault_plan(text, "plan.toml", 4, 2);
  return plan ? "" : plan.err().message;
}

}  // namespace

TEST_CASE("fault plan: a schedule and rates parse into the plan") {
  const std::string text = R"(seed = 7
duration = "2m"
liveness = "30s"

[[fault]]
at = "10s"
kind = "crash"
target = "learner/1"
for = "5s"

[[fault]]
at = "1500ms"
kind = "link"
target = "learner/2"
for = "20s"
loss = 0.1
delay_ms = 50

[[fault]]
at = "30s"
kind = "partition"
for = "10s"
groups = [["learner/0", "learner/1"], ["learner/2", "learner/3", "shard/0", "shard/1", "broker"]]

[[fault]]
at = "40s"
kind = "shard_crash"
target = "shard/1"

[rates]
kinds = ["crash", "pause"]
learner_mtbf = "20s"
repair_min = "1s"
repair_max = "3s"
)";
  auto plan = parse_fault_plan(text, "plan.toml", 4, 2);
  REQUIRE_MESSAGE(plan, plan.err().message);
  CHECK(plan->seed == 7);
  CHECK(plan->duration_ns == 120 * s);
  CHECK(plan->liveness_ns == 30 * s);
  REQUIRE(plan->schedule.size() == 4);
  CHECK(plan->schedule[0].kind == fault_kind::crash);
  CHECK(plan->schedule[0].targets[0].to_string() == "learner/1");
  CHECK(plan->schedule[0].for_ns == 5 * s);
  CHECK(plan->schedule[0].line == 5);
  CHECK(plan->schedule[1].at_ns == 1'500'000'000);
  CHECK(plan->schedule[1].link.loss == doctest::Approx(0.1));
  CHECK(plan->schedule[1].link.delay_ms == doctest::Approx(50));
  REQUIRE(plan->schedule[2].groups.size() == 2);
  CHECK(plan->schedule[2].groups[1].back().to_string() == "broker");
  CHECK(plan->schedule[3].for_ns == 0);  // restarted as soon as it is down
  CHECK(plan->rates.learner_mtbf_ns == 20 * s);
  CHECK(plan->rates.kinds.size() == 2);

  // Expanded: the schedule plus the drawn faults, sorted; the same seed, the same timeline.
  const auto timeline = expand_fault_plan(*plan, 4);
  CHECK(timeline.size() > 4 + 4);  // 4 learners × about 120 s / 22 s each
  for (std::size_t i = 1; i < timeline.size(); ++i) CHECK(timeline[i - 1].at_ns <= timeline[i].at_ns);
  for (const auto& f : timeline) {
    CHECK(f.at_ns <= plan->duration_ns);
    if (f.line == 0) CHECK((f.for_ns >= 1 * s && f.for_ns <= 3 * s));
  }
  const auto again = expand_fault_plan(*plan, 4);
  REQUIRE(again.size() == timeline.size());
  for (std::size_t i = 0; i < again.size(); ++i) {
    CHECK(again[i].at_ns == timeline[i].at_ns);
    CHECK(again[i].kind == timeline[i].kind);
  }
  plan->seed = 8;
  const auto other = expand_fault_plan(*plan, 4);
  bool differs = other.size() != timeline.size();
  for (std::size_t i = 0; !differs && i < other.size(); ++i) differs = other[i].at_ns != timeline[i].at_ns;
  CHECK(differs);
}

TEST_CASE("fault plan: 'learners' expands into one fault per learner") {
  auto plan = parse_fault_plan("duration = \"10s\"\n[[fault]]\nat = \"1s\"\nkind = \"slow\"\ntarget = \"learners\"\n"
                               "for = \"2s\"\nfactor = 3.0\n",
                               "plan.toml", 3, 1);
  REQUIRE_MESSAGE(plan, plan.err().message);
  const auto timeline = expand_fault_plan(*plan, 3);
  REQUIRE(timeline.size() == 3);
  for (std::uint32_t i = 0; i < 3; ++i) {
    CHECK(timeline[i].targets[0].to_string() == "learner/" + std::to_string(i));
    CHECK(timeline[i].factor == doctest::Approx(3));
  }
}

TEST_CASE("fault plan: a fault with every repeats within the safety phase") {
  auto plan = parse_fault_plan("duration = \"10s\"\n[[fault]]\nat = \"1s\"\nkind = \"shard_crash\"\n"
                               "target = \"shard/1\"\nevery = \"4s\"\n",
                               "plan.toml", 2, 2);
  REQUIRE_MESSAGE(plan, plan.err().message);
  const auto timeline = expand_fault_plan(*plan, 2);
  REQUIRE(timeline.size() == 3);  // at 1, 5 and 9 s; 13 s is past the 10 s safety phase
  CHECK(timeline[0].at_ns == 1 * s);
  CHECK(timeline[1].at_ns == 5 * s);
  CHECK(timeline[2].at_ns == 9 * s);
  CHECK(error_of("duration = \"60s\"\n[[fault]]\nat = \"1s\"\nkind = \"pause\"\ntarget = \"learner/0\"\n"
                 "for = \"5s\"\nevery = \"2s\"\n") ==
        "plan.toml:7: every must be longer than the fault's for (a fault repeats only after its repair)");
}

TEST_CASE("fault plan: an unknown fault, target, negative duration or malformed time names its line") {
  const std::string head = "duration = \"60s\"\n[[fault]]\n";  // the fault's keys start on line 3
  CHECK(error_of(head + "at = \"1s\"\nkind = \"explode\"\ntarget = \"learner/0\"\nfor = \"1s\"\n") ==
        "plan.toml:4: unknown fault kind 'explode' (crash, pause, slow, partition, link, shard_crash, broker_crash, "
        "storage_errors, broker_host_lost, impersonate, lie_tokens, attack_scaled, attack_sign_flip, attack_random, attack_stale, attack_sideways)");
  CHECK(error_of(head + "at = \"1s\"\nkind = \"crash\"\ntarget = \"learner/9\"\nfor = \"1s\"\n") ==
        "plan.toml:5: unknown target 'learner/9': the mesh has 4 learners");
  CHECK(error_of(head + "at = \"1s\"\nkind = \"shard_crash\"\ntarget = \"shard/2\"\nfor = \"1s\"\n") ==
        "plan.toml:5: unknown target 'shard/2': the mesh has 2 shards");
  // dp and the synchronous modes run one shard: a plan written for two names the count right.
  const auto one_shard = parse_fault_plan(head + "at = \"1s\"\nkind = \"shard_crash\"\ntarget = \"shard/1\"\nfor = \"1s\"\n",
                                          "plan.toml", 4, 1);
  REQUIRE_FALSE(one_shard);
  CHECK(one_shard.err().message == "plan.toml:5: unknown target 'shard/1': the mesh has 1 shard");
  CHECK(error_of(head + "at = \"1s\"\nkind = \"crash\"\ntarget = \"robot/1\"\nfor = \"1s\"\n") ==
        "plan.toml:5: unknown target 'robot/1' (learner/N, shard/N, storage/N, broker, broker/N or learners)");
  CHECK(error_of(head + "at = \"1s\"\nkind = \"crash\"\ntarget = \"shard/0\"\nfor = \"1s\"\n") ==
        "plan.toml:5: a crash fault cannot target 'shard/0'");
  CHECK(error_of(head + "at = \"1s\"\nkind = \"crash\"\ntarget = \"learner/0\"\nfor = \"-3s\"\n") ==
        "plan.toml:6: for: negative time '-3s'");
  CHECK(error_of(head + "at = \"ten seconds\"\nkind = \"crash\"\ntarget = \"learner/0\"\nfor = \"1s\"\n") ==
        "plan.toml:3: at: malformed time 'ten seconds' (a number and a unit: ms, s, m or h, e.g. \"1.5s\")");
  CHECK(error_of(head + "at = 10\nkind = \"crash\"\ntarget = \"learner/0\"\nfor = \"1s\"\n") ==
        "plan.toml:3: at must be a duration in quotes, e.g. \"10s\" or \"500ms\"");
  CHECK(error_of(head + "at = \"1s\"\nkind = \"crash\"\ntarget = \"learner/0\"\n") ==
        "plan.toml:2: a crash fault needs for = \"...\" (when it is repaired)");
  CHECK(error_of(head + "at = \"1s\"\nkind = \"crash\"\ntarget = \"learner/0\"\nfor = \"1s\"\nfactor = 2.0\n") ==
        "plan.toml:7: 'factor' is not a setting of a crash fault");
  CHECK(error_of(head + "at = \"2m\"\nkind = \"crash\"\ntarget = \"learner/0\"\nfor = \"1s\"\n") ==
        "plan.toml:2: the fault starts after the plan's duration");
  CHECK(error_of("duration = \"60s\"\n[rates]\nkinds = [\"partition\"]\n") ==
        "plan.toml:3: unknown or unsupported random fault kind 'partition' (rates draw crash, pause or slow)");
  CHECK(error_of("duration = \"60s\"\nspeed = 3\n") ==
        "plan.toml:2: unknown plan key 'speed' (seed, duration, liveness, standbys, [[fault]], [rates], [pass])");
  CHECK(error_of("[[fault]]\nat = \"1s\"\nkind = \"crash\"\ntarget = \"learner/0\"\nfor = \"1s\"\n") ==
        "plan.toml: the plan needs duration = \"...\" > 0");
  CHECK(error_of("duration = \"60s\"\n[[fault]\n").rfind("plan.toml:2: ", 0) == 0);  // TOML syntax
}

TEST_CASE("fault plan: standby brokers, a lost host and a partitioned primary") {
  const std::string lost = "[[fault]]\nat = \"20s\"\nkind = \"broker_host_lost\"\ntarget = \"broker\"\n";  // line 4 on
  auto plan = parse_fault_plan("duration = \"60s\"\nstandbys = 1\n\n" + lost +
                                   "[[fault]]\nat = \"30s\"\nkind = \"partition\"\nfor = \"5s\"\n"
                                   "groups = [[\"broker/1\"], [\"shard/0\", \"shard/1\", \"learners\"]]\n",
                               "plan.toml", 4, 2);
  REQUIRE_MESSAGE(plan, plan.err().message);
  CHECK(plan->standbys == 1);
  REQUIRE(plan->schedule.size() == 2);
  CHECK(plan->schedule[0].kind == fault_kind::broker_host_lost);
  CHECK(plan->schedule[0].for_ns == 0);
  CHECK(plan->schedule[1].groups[0][0].kind == role::sync_broker);
  CHECK(plan->schedule[1].groups[0][0].index == 1);
  CHECK(plan->schedule[1].groups[0][0].to_string() == "broker/1");

  // Refused, each with its line: no standby to take over; a lost host restarted, repeated or
  // crashed again; a standby the plan does not have; a standby's process faults; a bad count.
  CHECK(error_of("duration = \"60s\"\n" + lost) ==
        "plan.toml:2: a broker_host_lost fault needs a standby to take over: set standbys = 1 (or more) at the top of "
        "the plan");
  CHECK(error_of("duration = \"60s\"\nstandbys = 1\n" + lost + "for = \"5s\"\n") ==
        "plan.toml:7: a broker_host_lost fault has no for: its host is gone and the primary is never restarted (a "
        "standby takes over)");
  CHECK(error_of("duration = \"60s\"\nstandbys = 1\n" + lost + "every = \"30s\"\n") ==
        "plan.toml:7: a broker_host_lost fault cannot repeat (every): a host is lost once");
  CHECK(error_of("duration = \"60s\"\nstandbys = 1\n" + lost + "[[fault]]\nat = \"40s\"\nkind = \"broker_crash\"\n"
                 "target = \"broker\"\n") ==
        "plan.toml:7: a broker_crash of the primary at or after its host is lost (line 3): it is never restarted");
  CHECK(error_of("duration = \"60s\"\nstandbys = 1\n[[fault]]\nat = \"1s\"\nkind = \"partition\"\nfor = \"1s\"\n"
                 "groups = [[\"broker/2\"], [\"broker\"]]\n") ==
        "plan.toml:7: unknown target 'broker/2': the plan has 1 standby broker (broker/1)");
  CHECK(error_of("duration = \"60s\"\n[[fault]]\nat = \"1s\"\nkind = \"link\"\nfor = \"1s\"\ntarget = \"broker/1\"\n") ==
        "plan.toml:6: unknown target 'broker/1': the plan has no standby broker (standbys = 0)");
  CHECK(error_of("duration = \"60s\"\nstandbys = 1\n[[fault]]\nat = \"1s\"\nkind = \"broker_crash\"\n"
                 "target = \"broker/1\"\n") == "plan.toml:6: a broker_crash fault cannot target 'broker/1'");
  CHECK(error_of("duration = \"60s\"\nstandbys = 9\n") == "plan.toml:2: standbys must be an integer in [0, 7]");

  // The chaos core injects the lost host and never repairs it; the plan still heals.
  chaos_core core(expand_fault_plan(*plan, 4), plan->duration_ns);
  auto a = core.tick(25 * s);
  REQUIRE(a.size() == 1);
  CHECK(a[0].action == chaos_action::what::inject);
  CHECK(core.active() == 0);
  a = core.tick(60 * s);
  REQUIRE(a.size() == 2);  // the partition, injected and repaired
  CHECK(core.healed(60 * s));
  CHECK(core.injected() == 2);
}

TEST_CASE("fault plan: durations") {
  CHECK(parse_duration("500ms").value() == 500'000'000);
  CHECK(parse_duration("1.5s").value() == 1'500'000'000);
  CHECK(parse_duration("2m").value() == 120 * s);
  CHECK(parse_duration("1h").value() == 3600 * s);
  CHECK(!parse_duration("5"));
  CHECK(!parse_duration("s"));
  CHECK(!parse_duration("5 s"));
  CHECK(!parse_duration("-1s"));
  CHECK(!parse_duration("1e30h"));
}

TEST_CASE("chaos core: injects and repairs in time order, skips a down target, heals at the end") {
  auto plan = parse_fault_plan(R"(duration = "30s"
[[fault]]
at = "2s"
kind = "crash"
target = "learner/0"
for = "5s"
[[fault]]
at = "4s"
kind = "pause"
target = "learner/0"
for = "1s"
[[fault]]
at = "5s"
kind = "link"
target = "learner/1"
for = "60s"
loss = 0.5
[[fault]]
at = "6s"
kind = "pause"
target = "learner/1"
for = "2s"
)",
                               "plan.toml", 2, 1);
  REQUIRE_MESSAGE(plan, plan.err().message);
  chaos_core core(expand_fault_plan(*plan, 2), plan->duration_ns);
  CHECK(core.next_due() == 2 * s);
  CHECK(core.tick(1 * s).empty());

  auto a = core.tick(4 * s);  // crash of learner 0; its pause while crashed is skipped
  REQUIRE(a.size() == 2);
  CHECK(a[0].action == chaos_action::what::inject);
  CHECK(a[0].fault == 0);
  CHECK(a[1].action == chaos_action::what::skip);
  CHECK(core.learners_down() == 1);

  a = core.tick(7 * s);  // the link fault at 5 s, the pause at 6 s, the crash repaired at 7 s
  REQUIRE(a.size() == 3);
  CHECK((a[0].action == chaos_action::what::inject && a[0].fault == 2));
  CHECK((a[1].action == chaos_action::what::inject && a[1].fault == 3));
  CHECK((a[2].action == chaos_action::what::repair && a[2].fault == 0 && a[2].at_ns == 7 * s));
  CHECK(core.learners_down() == 1);  // learner 1 paused

  a = core.tick(29 * s);
  REQUIRE(a.size() == 1);  // the pause ends; the link fault lasts beyond the safety phase
  CHECK(a[0].fault == 3);
  CHECK(!core.healed(29 * s));
  a = core.tick(30 * s);  // ... and is healed when it ends
  REQUIRE(a.size() == 1);
  CHECK((a[0].action == chaos_action::what::repair && a[0].fault == 2 && a[0].at_ns == 30 * s));
  CHECK(core.healed(30 * s));
  CHECK(core.injected() == 3);
  CHECK(core.record().size() == 7);
  CHECK(core.next_due() == -1);
}

TEST_CASE("chaos core: every plan of the battery (deploy/drills) parses for a mesh of 4 learners and 2 shards") {
  namespace fs = std::filesystem;
  const fs::path dir = fs::path(ARCHIPELAGO_SOURCE_DIR) / "deploy" / "drills";
  std::size_t plans = 0;
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (entry.path().extension() != ".toml") continue;
    CAPTURE(entry.path().string());
    std::ifstream in(entry.path());
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    auto plan = parse_fault_plan(text, entry.path().filename().string(), 4, 2);
    REQUIRE_MESSAGE(plan, plan.err().message);
    chaos_core core(expand_fault_plan(*plan, 4), plan->duration_ns);
    (void)core.tick(plan->duration_ns);
    CHECK(core.injected() > 0);
    CHECK(core.healed(plan->duration_ns));
    ++plans;
  }
  CHECK(plans >= 8);
}

// Regression (fuzzing, tests/fuzz/corpus/fault_plan/timeline-of-millions): a 124-byte
// plan of 46 days with a fault every 14 s per learner expanded into ~1.7 million faults.
TEST_CASE("fault plan: a plan whose timeline would pass max_plan_faults is refused by its count") {
  auto drawn = parse_fault_plan("seed = 3\nduration = \"66669m\"\n[rates]\nkinds = [\"crash\", \"pause\"]\n"
                                "learner_mtbf = \"14s\"\nrepair_min = \"1s\"\nrepair_max = \"3s\"\n",
                                "plan.toml", 6, 2);
  REQUIRE_FALSE(drawn);
  CHECK(drawn.err().code == errc::invalid_input);
  CHECK(drawn.err().message.find("plan.toml: the plan expands to about 1714346 faults") == 0);
  CHECK(drawn.err().message.find("at most 100000") != std::string::npos);
  auto repeated = parse_fault_plan("duration = \"1h\"\n[[fault]]\nat = \"1s\"\nkind = \"pause\"\ntarget = \"learners\"\n"
                                   "for = \"1ms\"\nevery = \"2ms\"\n",
                                   "plan.toml", 4, 2);
  REQUIRE_FALSE(repeated);
  CHECK(repeated.err().message.find("scheduled") != std::string::npos);
  // At the bound's scale a plan still parses and expands within it.
  auto soak = parse_fault_plan("duration = \"1800s\"\n[rates]\nlearner_mtbf = \"5s\"\n", "plan.toml", 8, 2);
  REQUIRE_MESSAGE(soak, soak.err().message);
  CHECK(expand_fault_plan(*soak, 8).size() <= max_plan_faults);
}

TEST_CASE("fault plan: the attacker kinds impersonate and lie_tokens target one learner") {
  const std::string text = "seed = 1\nduration = \"30s\"\nliveness = \"5s\"\n"
                           "[[fault]]\nat = \"1s\"\nkind = \"impersonate\"\ntarget = \"learner/1\"\nas = \"shard/0\"\nfor = \"5s\"\n"
                           "[[fault]]\nat = \"2s\"\nkind = \"lie_tokens\"\ntarget = \"learner/2\"\nfactor = 100.0\nfor = \"5s\"\n";
  auto plan = parse_fault_plan(text, "plan.toml", 4, 2);
  REQUIRE_MESSAGE(plan, plan.err().message);
  REQUIRE(plan->schedule.size() == 2);
  CHECK(plan->schedule[0].kind == fault_kind::impersonate);
  CHECK(plan->schedule[0].as.kind == role::parameter_shard);
  CHECK(plan->schedule[0].as.index == 0);
  CHECK(plan->schedule[1].kind == fault_kind::lie_tokens);
  CHECK(plan->schedule[1].factor == 100.0);
  // Attackers are learners.
  CHECK_FALSE(parse_fault_plan("seed = 1\nduration = \"30s\"\nliveness = \"5s\"\n[[fault]]\nat = \"1s\"\nkind = "
                               "\"lie_tokens\"\ntarget = \"shard/0\"\nfor = \"5s\"\n",
                               "plan.toml", 4, 2));
}

TEST_CASE("fault plan: the attacker kinds target a learner, attack_scaled and attack_sideways take a factor") {
  const std::string head = "duration = \"60s\"\n[[fault]]\n";
  auto plan = parse_fault_plan(head + "at = \"1s\"\nkind = \"attack_scaled\"\ntarget = \"learner/3\"\nfor = \"5s\"\n",
                               "plan.toml", 4, 2);
  REQUIRE(plan.has_value());
  CHECK(plan->schedule[0].kind == fault_kind::attack_scaled);
  CHECK(plan->schedule[0].factor == 1000);
  CHECK(is_attack(plan->schedule[0].kind));
  plan = parse_fault_plan(head + "at = \"1s\"\nkind = \"attack_scaled\"\ntarget = \"learner/0\"\nfor = \"5s\"\n"
                                 "factor = -50.0\n", "plan.toml", 4, 2);
  REQUIRE(plan.has_value());
  CHECK(plan->schedule[0].factor == -50);
  CHECK(error_of(head + "at = \"1s\"\nkind = \"attack_stale\"\ntarget = \"shard/0\"\nfor = \"1s\"\n") ==
        "plan.toml:5: a attack_stale fault cannot target 'shard/0'");
  CHECK(error_of(head + "at = \"1s\"\nkind = \"attack_random\"\ntarget = \"learner/0\"\nfor = \"1s\"\n"
                        "factor = 2.0\n") == "plan.toml:7: 'factor' is not a setting of a attack_random fault");
  // sideways: the factor is its cosine with the honest delta, in [0, 1), 0.1 when not given
  plan = parse_fault_plan(head + "at = \"1s\"\nkind = \"attack_sideways\"\ntarget = \"learner/3\"\nfor = \"5s\"\n",
                          "plan.toml", 4, 2);
  REQUIRE(plan.has_value());
  CHECK(is_attack(plan->schedule[0].kind));
  CHECK(plan->schedule[0].factor == doctest::Approx(0.1));
  CHECK(error_of(head + "at = \"1s\"\nkind = \"attack_sideways\"\ntarget = \"learner/3\"\nfor = \"1s\"\n"
                        "factor = 1.0\n") == "plan.toml:7: factor (the cosine with the honest delta) must be in [0, 1)");
}
