#include "core/checksum.hpp"

#include <xxhash.h>

namespace archipelago {

std::uint64_t checksum64(const void* data, std::size_t bytes, std::uint64_t seed) {
  return XXH3_64bits_withSeed(data, bytes, seed);
}

}  // namespace archipelago
