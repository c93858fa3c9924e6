#pragma once
// The PyTorch references (torch_reference.py, ddp_reference.py) run as child
// processes; each prints one JSON object as its last stdout line. Reading that
// line back, and two figures out of it, is all the benches need.

#include <cstddef>
#include <string>

#include "core/error.hpp"

namespace archipelago {

/// Runs `command` with the shell (stderr joined to stdout) and returns the last
/// line of its output that starts with '{'. A failed start is "cannot start
/// <program>"; a non-zero exit or no such line is "<what> failed (exit N): "
/// and the last `tail_chars` characters of the output. Both errc::internal.
expected<std::string> last_json_line(const std::string& command, const std::string& program, const std::string& what,
                                     std::size_t tail_chars);

/// The number after "key": in a one-line JSON object (enough for the
/// references' output); NaN when the key is missing.
double json_number(const std::string& line, const std::string& key);

/// The string after "key": (with or without a space after the colon); empty
/// when the key is missing. No escapes: the references print plain names.
std::string json_string(const std::string& line, const std::string& key);

/// Ok when `blas` (a directory, or a library through its symlinks) is an OpenBLAS
/// build; else errc::not_found naming the package to install. Without OpenBLAS,
/// Debian's PyTorch runs the reference BLAS, tens of times slower, and a ratio
/// against it would overstate the engine. `who`: the reference, for the message.
status require_openblas(const std::string& blas, const std::string& who);

}  // namespace archipelago
