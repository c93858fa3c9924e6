#pragma once
// What every fuzz target file defines: the libFuzzer entry point, and the valid
// inputs its smoke run (fuzz_smoke.cpp) starts mutating from — also written out
// as a libFuzzer starting corpus (--write-seeds).

#include <cstddef>
#include <cstdint>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size);
std::vector<std::vector<std::uint8_t>> fuzz_seeds();

/// A broken property of a decoded value (a round trip that differs): a crash, so
/// that libFuzzer keeps the input and the smoke run fails.
#define FUZZ_CHECK(cond)   \
  do {                     \
    if (!(cond)) __builtin_trap(); \
  } while (0)
