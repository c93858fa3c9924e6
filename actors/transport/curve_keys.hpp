#pragma once
// CURVE keys for the transport: ZeroMQ CURVE encrypts every link and
// authenticates both ends by long-term curve25519 keys. A node owns one keypair
// (NAME.key, secret, mode 0600; NAME.pub, shareable) and accepts only peers whose
// public key is on its allow-list, checked by a ZAP handler (RFC 27) that the
// transport's I/O thread serves with handle_zap_request.
//
// Key file formats (TOML-compatible; '#' lines are comments):
//   NAME.key   public = "<40-char Z85>"
//              secret = "<40-char Z85>"
//   NAME.pub   public = "<40-char Z85>"
// Allow-list: a directory of *.pub files (a key's name is the file stem), or one
// text file with one key per line, "NAME <z85>" or just "<z85>", optionally
// followed by a '#' comment; blank lines and lines starting with '#' are ignored.
// '#' is a Z85 digit, but no valid key starts with it (that 5-char group would
// exceed 32 bits), so comments are unambiguous. Lines copied from .pub files
// (public = "<z85>") are accepted too, so `cat *.pub > allowed` works.

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>

#include "core/error.hpp"

namespace zmq {
class socket_t;
}

namespace archipelago::transport {

inline constexpr std::size_t curve_key_bytes = 32;  // binary key, as ZAP delivers it
inline constexpr std::size_t curve_z85_chars = 40;  // Z85 text form, as zmq sockopts take it

/// Both strings are 40-char Z85. The secret never appears in logs or error messages.
struct curve_keypair {
  std::string public_z85;
  std::string secret_z85;
};

/// Whether the linked libzmq was built with CURVE (libsodium or tweetnacl).
bool curve_available();

/// A fresh random keypair. unsupported when libzmq lacks CURVE.
expected<curve_keypair> generate_keypair();

/// Length 40, Z85 alphabet, decodes (each 5-char group fits 32 bits). The error
/// says what is wrong, without quoting the key.
status validate_z85_key(std::string_view z85);

/// The 32-byte binary form of a valid Z85 key; invalid_input otherwise.
expected<std::string> decode_z85_key(std::string_view z85);

/// The Z85 form of a 32-byte binary key.
std::string encode_z85_key(const std::uint8_t key32[curve_key_bytes]);

/// The public key belonging to `secret_z85`; invalid_input if it is not a valid key.
expected<std::string> public_key_of(std::string_view secret_z85);

/// Writes dir/name.key (mode 0600, public and secret lines) and dir/name.pub
/// (public line only), each through a temporary file renamed into place. Refuses
/// (invalid_input) if either file exists unless `overwrite`. `name` is one path
/// component of [A-Za-z0-9._-], not starting with '.'. A missing dir is not_found,
/// one we may not write is invalid_input: both are fixed by choosing another dir.
status save_keypair(const std::string& dir, const std::string& name, const curve_keypair& keys,
                    bool overwrite = false);

/// Reads a NAME.key file; both keys must be valid and the public key must be
/// the one derived from the secret. Missing file → not_found; bad content →
/// invalid_input naming the file and line.
expected<curve_keypair> load_keypair(const std::string& key_file);

/// Reads a NAME.pub file. A file with a secret line is refused so that .key
/// files are never mistaken for shareable ones.
expected<std::string> load_public_key(const std::string& pub_file);

/// The public keys a node accepts, each with an optional name for logs.
class key_allow_list {
 public:
  key_allow_list() = default;

  /// A directory of *.pub files or one list file (formats above). Malformed keys,
  /// duplicate keys and an empty list are invalid_input, naming file and line.
  static expected<key_allow_list> load(const std::string& path);

  /// Adds one key; invalid_input if it is malformed or already listed.
  status add(std::string_view public_z85, std::string name = {});

  bool allows(const std::uint8_t key32[curve_key_bytes]) const;
  bool allows_z85(std::string_view public_z85) const;

  /// The key's name if it was listed with one, otherwise its Z85 form.
  std::string name_of(const std::uint8_t key32[curve_key_bytes]) const;
  std::string name_of_z85(std::string_view public_z85) const;

  /// The Z85 key listed under `name`, or empty if no key has that name.
  std::string key_named(std::string_view name) const;

  std::size_t size() const { return names_.size(); }
  bool empty() const { return names_.empty(); }

 private:
  std::map<std::string, std::string> names_;  // 32-byte binary key → name ("" if none)
};

/// ZAP handlers bind a REP socket here, on the same context as the CURVE servers.
inline constexpr const char* zap_endpoint = "inproc://zeromq.zap.01";

/// Serves one RFC 27 ZAP request waiting on `zap_rep` (call it when the socket
/// polls readable; it never blocks): status 200 with the key's name as User-Id if
/// the mechanism is CURVE and the client key is on `allowed`, 400 otherwise, 500
/// for a malformed request. Returns whether the client was allowed. When it was
/// refused, `*refused_key_z85` (if given) is set to the client key for logging,
/// or left empty if the request carried none. Never throws.
bool handle_zap_request(zmq::socket_t& zap_rep, const key_allow_list& allowed,
                        std::string* refused_key_z85);

}  // namespace archipelago::transport
