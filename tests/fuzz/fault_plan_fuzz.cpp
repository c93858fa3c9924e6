// Fuzz target for the fault-plan reader (deploy/drills/*.toml): parsed and
// checked against a mesh, then expanded into the chaos monkey's timeline.
// Input: byte 0 = learners - 1 (low 3 bits), byte 1 = shards - 1 (low 2 bits),
// the rest the plan's text. A plan that parses must expand within its bounds.

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <string_view>

#include "chaos_monkey/fault_plan.hpp"
#include "fuzz_target.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace archipelago;
  if (size < 2) return 0;
  const int learners = 1 + (data[0] & 7), shards = 1 + (data[1] & 3);
  auto plan = parse_fault_plan(std::string_view(reinterpret_cast<const char*>(data + 2), size - 2), "fuzz.toml",
                               learners, shards);
  if (!plan) return 0;
  const auto timeline = expand_fault_plan(*plan, learners);
  FUZZ_CHECK(timeline.size() >= plan->schedule.size());
  for (std::size_t i = 1; i < timeline.size(); ++i) FUZZ_CHECK(timeline[i - 1].at_ns <= timeline[i].at_ns);
  return 0;
}

std::vector<std::vector<std::uint8_t>> fuzz_seeds() {
  const std::vector<std::string> plans = {
      "seed = 1\nduration = \"60s\"\n\n[[fault]]\nat = \"10s\"\nkind = \"crash\"\ntarget = \"learner/0\"\n"
      "for = \"5s\"\n\n[[fault]]\nat = \"20s\"\nkind = \"partition\"\ntarget = \"learner/1\"\nfor = \"3s\"\n",
      "seed = 7\nduration = \"2m\"\n\n[rates]\nkinds = [\"crash\", \"pause\"]\nlearner_mtbf = \"30s\"\n"
      "repair_min = \"1s\"\nrepair_max = \"4s\"\n",
      "seed = 2\nduration = \"30s\"\nstandbys = 1\n\n[[fault]]\nat = \"5s\"\nkind = \"crash\"\n"
      "target = \"broker/0\"\nfor = \"2s\"\n\n[[fault]]\nat = \"12s\"\nkind = \"link\"\ntarget = \"shard/0\"\n"
      "for = \"4s\"\nlatency = \"50ms\"\nloss = 0.1\n",
  };
  std::vector<std::string> texts = plans;
  // The drill battery's plans, as shipped.
  std::vector<std::filesystem::path> files;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(ARCHIPELAGO_SOURCE_DIR "/deploy/drills", ec))
    if (e.path().extension() == ".toml") files.push_back(e.path());
  std::sort(files.begin(), files.end());
  for (const auto& f : files) {
    std::ifstream in(f);
    texts.emplace_back((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  }
  std::vector<std::vector<std::uint8_t>> out;
  for (const auto& p : texts) {
    std::vector<std::uint8_t> in{3, 1};  // 4 learners, 2 shards
    in.insert(in.end(), p.begin(), p.end());
    out.push_back(std::move(in));
  }
  return out;
}
