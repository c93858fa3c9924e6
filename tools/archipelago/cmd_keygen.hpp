#pragma once
// archipelago keygen: create a node's CURVE keypair files. Declared apart from
// commands.hpp until the command is wired into main.cpp.

#include <CLI/CLI.hpp>

#include "commands.hpp"

namespace archipelago::cli {

/// `keygen --name NAME [--dir DIR] [--force] [--json]`: writes DIR/NAME.key
/// (secret, mode 0600) and DIR/NAME.pub, then prints "NAME <public key>", the
/// allow-list line for this node.
runner add_keygen_command(CLI::App& app);

}  // namespace archipelago::cli
