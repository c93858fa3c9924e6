#include <doctest/doctest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "learner/model/checkpoint.hpp"

using namespace archipelago;

namespace {

std::string temp_path(const char* name) {
  return (std::filesystem::temp_directory_path() / name).string();
}

checkpoint sample_checkpoint() {
  checkpoint c;
  c.shape = {256, 8, 16, 1, 2, false};
  c.params.resize(make_layout(c.shape).total_floats);
  for (std::size_t i = 0; i < c.params.size(); ++i) c.params[i] = static_cast<float>(i) * 0.5f;
  c.steps = 12;
  c.tokens = 3456;
  c.train_loss = 1.25;
  c.eval_loss = std::nan("");
  c.corpus = "synthetic";
  c.seed = 99;
  return c;
}

}  // namespace

TEST_CASE("checkpoints round-trip") {
  const std::string path = temp_path("archipelago_ckpt_roundtrip.bin");
  const checkpoint c = sample_checkpoint();
  REQUIRE(save_checkpoint(path, c));
  auto loaded = load_checkpoint(path);
  REQUIRE(loaded);
  CHECK(loaded->shape == c.shape);
  CHECK(loaded->params == c.params);
  CHECK(loaded->steps == 12);
  CHECK(loaded->tokens == 3456);
  CHECK(std::isnan(loaded->eval_loss));
  CHECK(loaded->corpus == "synthetic");
  std::filesystem::remove(path);
}

TEST_CASE("corrupt, truncated and missing checkpoints are typed errors") {
  const std::string path = temp_path("archipelago_ckpt_corrupt.bin");
  REQUIRE(save_checkpoint(path, sample_checkpoint()));
  const auto size = std::filesystem::file_size(path);
  {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(size - 5));
    f.put('\x7f');
  }
  auto flipped = load_checkpoint(path);
  REQUIRE_FALSE(flipped);
  CHECK(flipped.err().code == errc::corrupt_data);
  CHECK(flipped.err().message.find("checksum") != std::string::npos);

  std::filesystem::resize_file(path, size - 64);
  auto truncated = load_checkpoint(path);
  REQUIRE_FALSE(truncated);
  CHECK(truncated.err().code == errc::corrupt_data);

  {
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    f << "definitely not a checkpoint";
  }
  auto garbage = load_checkpoint(path);
  REQUIRE_FALSE(garbage);
  CHECK(garbage.err().message.find("bad magic") != std::string::npos);
  std::filesystem::remove(path);

  auto missing = load_checkpoint(temp_path("archipelago_no_such_checkpoint.bin"));
  REQUIRE_FALSE(missing);
  CHECK(missing.err().code == errc::not_found);
}
