// archipelago keygen: create a node's CURVE keypair (NAME.key, NAME.pub).

#include "cmd_keygen.hpp"

#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>

#include "cli_common.hpp"
#include "transport/curve_keys.hpp"

namespace archipelago::cli {
namespace {

struct keygen_cli {
  std::string name;
  std::string dir = ".";
  bool force = false;
  bool json = false;
};

int run_keygen(const keygen_cli& k) {
  auto keys = transport::generate_keypair();
  if (!keys) return report(keys.err());
  // A new key directory is made, readable by its owner only (it holds secret keys).
  std::error_code ec;
  if (!k.dir.empty() && !std::filesystem::exists(k.dir, ec)) {
    if (!std::filesystem::create_directories(k.dir, ec) || ec)
      return report(make_error(errc::io_error, "cannot create the key directory '" + k.dir + "': " + ec.message()));
    std::filesystem::permissions(k.dir, std::filesystem::perms::owner_all, ec);
  }
  if (auto ok = transport::save_keypair(k.dir, k.name, *keys, k.force); !ok) {
    error err = ok.err();
    if (!k.force && err.message.find("already exists") != std::string::npos)
      err.message += " (pass --force to replace the keypair)";
    return report(err);
  }
  const std::filesystem::path dir = k.dir.empty() ? "." : k.dir;
  const std::string key_file = (dir / (k.name + ".key")).string();
  const std::string pub_file = (dir / (k.name + ".pub")).string();
  std::printf("secret key: %s (mode 0600; keep it on this node)\n", key_file.c_str());
  std::printf("public key: %s (give it to peers for their allow-lists)\n", pub_file.c_str());
  // Last plain line: the allow-list entry for this node, ready to append.
  std::printf("%s %s\n", k.name.c_str(), keys->public_z85.c_str());
  if (k.json) {
    json_line j;
    j.add("command", "keygen")
        .add("name", k.name)
        .add("public", keys->public_z85)
        .add("key_file", key_file)
        .add("pub_file", pub_file);
    std::printf("%s\n", j.str().c_str());
  }
  return exit_ok;
}

}  // namespace

runner add_keygen_command(CLI::App& app) {
  auto k = std::make_shared<keygen_cli>();
  CLI::App* cmd =
      app.add_subcommand("keygen", "Create a node's CURVE keypair: NAME.key (secret) and NAME.pub");
  cmd->add_option("--name", k->name, "Node name: the file stem and the name on peers' allow-lists")
      ->required();
  cmd->add_option("--dir", k->dir, "Directory to write the key files into (default .)");
  cmd->add_flag("--force", k->force, "Replace an existing NAME.key / NAME.pub");
  cmd->add_flag("--json", k->json, "Print a one-line JSON summary last");
  return [k](logger&) { return run_keygen(*k); };
}

}  // namespace archipelago::cli
