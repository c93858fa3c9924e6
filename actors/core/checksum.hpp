#pragma once
// Checksums for everything that crosses a process boundary or touches disk
// (xxHash XXH3-64, from Debian's libxxhash).

#include <cstddef>
#include <cstdint>

namespace archipelago {

std::uint64_t checksum64(const void* data, std::size_t bytes, std::uint64_t seed = 0);

}  // namespace archipelago
