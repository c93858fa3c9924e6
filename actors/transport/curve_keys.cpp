#include "transport/curve_keys.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <utility>
#include <vector>
#include <zmq.hpp>

namespace archipelago::transport {
namespace {

constexpr std::string_view z85_alphabet =
    "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#";

// Key files are a few hundred bytes; anything much larger is the wrong file.
constexpr std::size_t max_key_file_bytes = 64 * 1024;
// An allow-list may name every node of a large mesh.
constexpr std::size_t max_list_file_bytes = 16 * 1024 * 1024;

std::string in_quotes(const std::string& s) { return "'" + s + "'"; }

std::string_view trim(std::string_view s) {
  const auto space = [](char c) { return c == ' ' || c == '\t' || c == '\r'; };
  while (!s.empty() && space(s.front())) s.remove_prefix(1);
  while (!s.empty() && space(s.back())) s.remove_suffix(1);
  return s;
}

std::vector<std::string_view> split_words(std::string_view line) {
  std::vector<std::string_view> words;
  std::size_t i = 0;
  while (i < line.size()) {
    while (i < line.size() && (line[i] == ' ' || line[i] == '\t')) ++i;
    const std::size_t start = i;
    while (i < line.size() && line[i] != ' ' && line[i] != '\t') ++i;
    if (i > start) words.push_back(line.substr(start, i - start));
  }
  return words;
}

// The caller's fix for EACCES, EROFS or a missing path is a different path,
// so those are input errors (exit 2); anything else is the system's fault.
error os_error(int err, const std::string& what) {
  errc code = errc::io_error;
  if (err == ENOENT || err == ENOTDIR)
    code = errc::not_found;
  else if (err == EACCES || err == EPERM || err == EROFS)
    code = errc::invalid_input;
  return make_error(code, what + ": " + std::strerror(err));
}

class fd_guard {
 public:
  explicit fd_guard(int fd) : fd_(fd) {}
  fd_guard(const fd_guard&) = delete;
  fd_guard& operator=(const fd_guard&) = delete;
  ~fd_guard() {
    if (fd_ >= 0) ::close(fd_);
  }
  int get() const { return fd_; }
  int release() { return std::exchange(fd_, -1); }

 private:
  int fd_;
};

expected<std::string> read_small_file(const std::string& path, const char* what,
                                      std::size_t max_bytes) {
  fd_guard fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) {
    const int err = errno;
    if (err == ENOENT)
      return make_error(errc::not_found,
                        std::string(what) + " " + in_quotes(path) + " does not exist");
    return os_error(err, "cannot read " + std::string(what) + " " + in_quotes(path));
  }
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0)
    return os_error(errno, "cannot read " + std::string(what) + " " + in_quotes(path));
  if (!S_ISREG(st.st_mode))
    return make_error(errc::invalid_input,
                      std::string(what) + " " + in_quotes(path) + " is not a regular file");
  if (static_cast<std::uint64_t>(st.st_size) > max_bytes)
    return make_error(errc::invalid_input, std::string(what) + " " + in_quotes(path) +
                                               " is too large (" + std::to_string(st.st_size) +
                                               " bytes)");
  std::string text;
  char buffer[4096];
  for (;;) {
    const ssize_t got = ::read(fd.get(), buffer, sizeof buffer);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) return os_error(errno, "cannot read " + std::string(what) + " " + in_quotes(path));
    if (got == 0) break;
    text.append(buffer, static_cast<std::size_t>(got));
    if (text.size() > max_bytes)
      return make_error(errc::invalid_input,
                        std::string(what) + " " + in_quotes(path) + " is too large");
  }
  return text;
}

// Calls fn(line_number, trimmed_line) for each line; stops at the first error.
template <class Fn>
status for_each_line(std::string_view text, Fn&& fn) {
  int number = 0;
  while (!text.empty()) {
    const std::size_t end = text.find('\n');
    const std::string_view line = trim(text.substr(0, end));
    text = end == std::string_view::npos ? std::string_view{} : text.substr(end + 1);
    ++number;
    if (auto ok = fn(number, line); !ok) return ok;
  }
  return status::ok();
}

// `name = "value"` with an optional trailing '#' comment (a TOML subset).
struct assignment {
  std::string_view name;
  std::string_view value;
};

// Messages quote only the two known names: anything else on a line of a key
// file may be a piece of a secret key.
std::string entry_label(std::string_view name) {
  return name == "public" || name == "secret" ? "'" + std::string(name) + "'"
                                              : std::string("the entry");
}

expected<assignment> parse_assignment(std::string_view line) {
  const std::size_t eq = line.find('=');
  if (eq == std::string_view::npos)
    return make_error(errc::invalid_input, "expected name = \"value\"");
  assignment a{trim(line.substr(0, eq)), {}};
  const bool identifier = !a.name.empty() && std::all_of(a.name.begin(), a.name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
           c == '-';
  });
  if (!identifier) return make_error(errc::invalid_input, "expected name = \"value\"");
  std::string_view rest = trim(line.substr(eq + 1));
  if (rest.size() < 2 || rest.front() != '"')
    return make_error(errc::invalid_input,
                      "the value of " + entry_label(a.name) + " must be a quoted string");
  const std::size_t close = rest.find('"', 1);
  if (close == std::string_view::npos)
    return make_error(errc::invalid_input, "unterminated string in " + entry_label(a.name));
  a.value = rest.substr(1, close - 1);
  const std::string_view after = trim(rest.substr(close + 1));
  if (!after.empty() && after.front() != '#')
    return make_error(errc::invalid_input,
                      "unexpected text after the value of " + entry_label(a.name));
  return a;
}

bool valid_key_name(const std::string& name) {
  if (name.empty() || name.size() > 200 || name.front() == '.') return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
           c == '_' || c == '-';
  });
}

struct key_file_content {
  std::string public_z85, secret_z85;
  int public_line = 0, secret_line = 0;  // 0 = absent
};

// Parses the key-file format; `where` prefixes every error ("key file 'x'").
expected<key_file_content> parse_key_file(const std::string& text, const std::string& where) {
  key_file_content c;
  auto ok = for_each_line(text, [&](int number, std::string_view line) -> status {
    if (line.empty() || line.front() == '#') return status::ok();
    const std::string at = where + ", line " + std::to_string(number) + ": ";
    auto a = parse_assignment(line);
    if (!a) return make_error(errc::invalid_input, at + a.err().message);
    const bool is_secret = a->name == "secret";
    if (!is_secret && a->name != "public")
      return make_error(errc::invalid_input, at + "unknown entry (expected 'public' or 'secret')");
    int& seen = is_secret ? c.secret_line : c.public_line;
    if (seen != 0)
      return make_error(errc::invalid_input, at + "second '" + std::string(a->name) +
                                                 "' entry (first on line " + std::to_string(seen) +
                                                 ")");
    if (auto valid = validate_z85_key(a->value); !valid)
      return make_error(errc::invalid_input,
                        at + std::string(a->name) + " key " + valid.err().message);
    seen = number;
    (is_secret ? c.secret_z85 : c.public_z85) = std::string(a->value);
    return status::ok();
  });
  if (!ok) return ok.err();
  return c;
}

std::string join_path(const std::string& dir, const std::string& file) {
  if (dir.empty()) return file;
  return dir.back() == '/' ? dir + file : dir + "/" + file;
}

// Writes `content` to a fresh temporary file next to its final place and
// returns the temporary's path. Mode 0600 for secrets; otherwise 0644 minus umask.
expected<std::string> write_temp_file(const std::string& dir, const std::string& final_name,
                                      const std::string& content, bool secret) {
  static std::atomic<unsigned> counter{0};
  const mode_t mode = secret ? 0600 : 0644;
  std::string tmp;
  int raw_fd = -1;
  for (int attempt = 0; attempt < 100 && raw_fd < 0; ++attempt) {
    tmp = join_path(dir, "." + final_name + ".tmp-" + std::to_string(::getpid()) + "-" +
                             std::to_string(counter++));
    raw_fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode);
    if (raw_fd < 0 && errno != EEXIST)
      return os_error(errno, "cannot write in directory " + in_quotes(dir));
  }
  if (raw_fd < 0)
    return make_error(errc::io_error, "cannot create a temporary file in " + in_quotes(dir));
  fd_guard fd(raw_fd);
  const auto fail = [&](const std::string& what) {
    const int err = errno;
    ::unlink(tmp.c_str());
    return os_error(err, what);
  };
  // The umask can only narrow 0600, but a umask of 0400 would leave the owner unable to read.
  if (secret && ::fchmod(fd.get(), 0600) != 0)
    return fail("cannot set mode 0600 on " + in_quotes(tmp));
  std::size_t done = 0;
  while (done < content.size()) {
    const ssize_t n = ::write(fd.get(), content.data() + done, content.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return fail("cannot write " + in_quotes(tmp));
    done += static_cast<std::size_t>(n);
  }
  if (::fsync(fd.get()) != 0) return fail("cannot write " + in_quotes(tmp));
  if (::close(fd.release()) != 0) return fail("cannot write " + in_quotes(tmp));
  return tmp;
}

// Renames tmp to path; without overwrite, atomically fails if path exists.
status place_file(const std::string& tmp, const std::string& path, bool overwrite) {
  const auto exists = [&] {
    return make_error(errc::invalid_input,
                      in_quotes(path) + " already exists; refusing to overwrite it");
  };
  if (overwrite) {
    if (std::rename(tmp.c_str(), path.c_str()) != 0)
      return os_error(errno, "cannot write " + in_quotes(path));
    return status::ok();
  }
  if (::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, path.c_str(), RENAME_NOREPLACE) == 0)
    return status::ok();
  if (errno == EEXIST) return exists();
  if (errno != EINVAL && errno != ENOSYS) return os_error(errno, "cannot write " + in_quotes(path));
  // The filesystem lacks RENAME_NOREPLACE: link() also refuses an existing target.
  if (::link(tmp.c_str(), path.c_str()) != 0)
    return errno == EEXIST ? exists() : os_error(errno, "cannot write " + in_quotes(path));
  ::unlink(tmp.c_str());
  return status::ok();
}

}  // namespace

bool curve_available() { return zmq_has("curve") != 0; }

expected<curve_keypair> generate_keypair() {
  if (!curve_available())
    return make_error(errc::unsupported,
                      "this libzmq was built without CURVE support (needs libsodium)");
  char pub[curve_z85_chars + 1] = {};
  char sec[curve_z85_chars + 1] = {};
  if (zmq_curve_keypair(pub, sec) != 0)
    return make_error(errc::internal,
                      std::string("zmq_curve_keypair failed: ") + zmq_strerror(zmq_errno()));
  curve_keypair keys{pub, sec};
  std::memset(sec, 0, sizeof sec);
  return keys;
}

status validate_z85_key(std::string_view z85) {
  if (z85.size() != curve_z85_chars)
    return make_error(errc::invalid_input, "must be " + std::to_string(curve_z85_chars) +
                                               " Z85 characters, not " +
                                               std::to_string(z85.size()));
  if (const std::size_t bad = z85.find_first_not_of(z85_alphabet); bad != std::string_view::npos)
    return make_error(errc::invalid_input, "has a character outside the Z85 alphabet at position " +
                                               std::to_string(bad + 1));
  const std::string text(z85);
  std::uint8_t key[curve_key_bytes];
  if (zmq_z85_decode(key, text.c_str()) == nullptr)
    return make_error(errc::invalid_input,
                      "is not valid Z85 (a 5-character group exceeds 32 bits)");
  return status::ok();
}

expected<std::string> decode_z85_key(std::string_view z85) {
  if (auto ok = validate_z85_key(z85); !ok)
    return make_error(errc::invalid_input, "key " + ok.err().message);
  const std::string text(z85);
  std::string key(curve_key_bytes, '\0');
  zmq_z85_decode(reinterpret_cast<std::uint8_t*>(key.data()), text.c_str());
  return key;
}

std::string encode_z85_key(const std::uint8_t key32[curve_key_bytes]) {
  char text[curve_z85_chars + 1] = {};
  zmq_z85_encode(text, key32, curve_key_bytes);
  return text;
}

expected<std::string> public_key_of(std::string_view secret_z85) {
  if (auto ok = validate_z85_key(secret_z85); !ok)
    return make_error(errc::invalid_input, "secret key " + ok.err().message);
  if (!curve_available())
    return make_error(errc::unsupported,
                      "this libzmq was built without CURVE support (needs libsodium)");
  const std::string secret(secret_z85);
  char pub[curve_z85_chars + 1] = {};
  if (zmq_curve_public(pub, secret.c_str()) != 0)
    return make_error(errc::internal,
                      std::string("zmq_curve_public failed: ") + zmq_strerror(zmq_errno()));
  return std::string(pub);
}

status save_keypair(const std::string& dir_in, const std::string& name, const curve_keypair& keys,
                    bool overwrite) {
  if (!valid_key_name(name))
    return make_error(errc::invalid_input,
                      "key name " + in_quotes(name) +
                          " must be 1-200 characters of A-Z a-z 0-9 . _ - not starting with '.'");
  if (auto ok = validate_z85_key(keys.public_z85); !ok)
    return make_error(errc::invalid_input, "public key " + ok.err().message);
  auto derived = public_key_of(keys.secret_z85);
  if (!derived) return derived.err();
  if (*derived != keys.public_z85)
    return make_error(errc::invalid_input, "the public key does not belong to the secret key");

  const std::string dir = dir_in.empty() ? "." : dir_in;
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) {
    if (errno == ENOENT)
      return make_error(errc::not_found, "key directory " + in_quotes(dir) + " does not exist");
    return os_error(errno, "cannot use key directory " + in_quotes(dir));
  }
  if (!S_ISDIR(st.st_mode))
    return make_error(errc::invalid_input, in_quotes(dir) + " is not a directory");

  const std::string key_path = join_path(dir, name + ".key");
  const std::string pub_path = join_path(dir, name + ".pub");
  if (!overwrite)
    for (const std::string* path : {&key_path, &pub_path})
      if (::lstat(path->c_str(), &st) == 0)
        return make_error(errc::invalid_input,
                          in_quotes(*path) + " already exists; refusing to overwrite it");

  const std::string header = "# archipelago CURVE ";
  auto key_tmp = write_temp_file(dir, name + ".key",
                                 header + "secret key of node '" + name +
                                     "': keep it on this machine, mode 0600.\n" +
                                     "# Peers need only " + name + ".pub.\npublic = \"" +
                                     keys.public_z85 + "\"\nsecret = \"" + keys.secret_z85 + "\"\n",
                                 true);
  if (!key_tmp) return key_tmp.err();
  auto pub_tmp = write_temp_file(
      dir, name + ".pub",
      header + "public key of node '" + name +
          "': share it; peers list it in their allow-list.\npublic = \"" + keys.public_z85 + "\"\n",
      false);
  if (!pub_tmp) {
    ::unlink(key_tmp->c_str());
    return pub_tmp.err();
  }
  if (auto ok = place_file(*key_tmp, key_path, overwrite); !ok) {
    ::unlink(key_tmp->c_str());
    ::unlink(pub_tmp->c_str());
    return ok;
  }
  if (auto ok = place_file(*pub_tmp, pub_path, overwrite); !ok) {
    ::unlink(pub_tmp->c_str());
    // Without overwrite the .key is ours and useless alone; with it, the old pair is gone either
    // way.
    if (!overwrite) ::unlink(key_path.c_str());
    return ok;
  }
  // Make the renames durable, so a crash cannot leave a node without its key.
  if (fd_guard dfd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC)); dfd.get() >= 0)
    ::fsync(dfd.get());
  return status::ok();
}

expected<curve_keypair> load_keypair(const std::string& key_file) {
  auto text = read_small_file(key_file, "key file", max_key_file_bytes);
  if (!text) return text.err();
  const std::string where = "key file " + in_quotes(key_file);
  auto c = parse_key_file(*text, where);
  if (!c) return c.err();
  if (c->secret_line == 0) return make_error(errc::invalid_input, where + " has no 'secret' entry");
  if (c->public_line == 0) return make_error(errc::invalid_input, where + " has no 'public' entry");
  auto derived = public_key_of(c->secret_z85);
  if (!derived) return make_error(derived.err().code, where + ": " + derived.err().message);
  if (*derived != c->public_z85)
    return make_error(errc::invalid_input,
                      where + ", line " + std::to_string(c->public_line) +
                          ": the public key does not belong to the secret key");
  return curve_keypair{std::move(c->public_z85), std::move(c->secret_z85)};
}

expected<std::string> load_public_key(const std::string& pub_file) {
  auto text = read_small_file(pub_file, "public key file", max_key_file_bytes);
  if (!text) return text.err();
  const std::string where = "public key file " + in_quotes(pub_file);
  auto c = parse_key_file(*text, where);
  if (!c) return c.err();
  if (c->secret_line != 0)
    return make_error(errc::invalid_input, where + ", line " + std::to_string(c->secret_line) +
                                               ": holds a secret key; use the .pub file");
  if (c->public_line == 0) return make_error(errc::invalid_input, where + " has no 'public' entry");
  return std::move(c->public_z85);
}

status key_allow_list::add(std::string_view public_z85, std::string name) {
  auto key = decode_z85_key(public_z85);
  if (!key) return key.err();
  const auto [it, inserted] = names_.try_emplace(std::move(*key), std::move(name));
  if (!inserted)
    return make_error(errc::invalid_input,
                      "duplicate key" + (it->second.empty() ? std::string()
                                                            : " (already listed as " +
                                                                  in_quotes(it->second) + ")"));
  return status::ok();
}

expected<key_allow_list> key_allow_list::load(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (st.type() == fs::file_type::not_found)
    return make_error(errc::not_found, "allow-list " + in_quotes(path) + " does not exist");
  if (ec)
    return make_error(errc::io_error,
                      "cannot read allow-list " + in_quotes(path) + ": " + ec.message());

  key_allow_list list;
  if (fs::is_directory(st)) {
    std::vector<fs::path> files;
    for (fs::directory_iterator it(path, ec), end; !ec && it != end; it.increment(ec)) {
      std::error_code type_ec;
      if (it->path().extension() == ".pub" && it->is_regular_file(type_ec))
        files.push_back(it->path());
    }
    if (ec) return os_error(ec.value(), "cannot list allow-list directory " + in_quotes(path));
    std::sort(files.begin(), files.end());
    for (const fs::path& file : files) {
      auto key = load_public_key(file.string());
      if (!key) return key.err();
      if (auto ok = list.add(*key, file.stem().string()); !ok)
        return make_error(errc::invalid_input,
                          "public key file " + in_quotes(file.string()) + ": " + ok.err().message);
    }
    if (list.empty())
      return make_error(errc::invalid_input,
                        "allow-list directory " + in_quotes(path) + " has no *.pub files");
    return list;
  }

  auto text = read_small_file(path, "allow-list file", max_list_file_bytes);
  if (!text) return text.err();
  const std::string where = "allow-list file " + in_quotes(path);
  auto ok = for_each_line(*text, [&](int number, std::string_view line) -> status {
    const std::string at = where + ", line " + std::to_string(number) + ": ";
    const auto words = split_words(line);
    if (words.empty() || words[0].front() == '#') return status::ok();
    if (words[0].substr(0, 6) == "public" || words[0].substr(0, 6) == "secret") {
      // A line copied from a .pub file; a secret must never be pasted here.
      if (auto a = parse_assignment(line); a && (a->name == "public" || a->name == "secret")) {
        if (a->name == "secret")
          return make_error(errc::invalid_input,
                            at + "a secret key does not belong in an allow-list");
        if (auto added = list.add(a->value); !added)
          return make_error(errc::invalid_input, at + added.err().message);
        return status::ok();
      }
    }
    // "<key> [# comment]" or "<name> <key> [# comment]".
    const bool bare = words.size() == 1 || words[1].front() == '#';
    const std::string_view name = bare ? std::string_view{} : words[0];
    const std::string_view key = bare ? words[0] : words[1];
    const std::size_t rest = bare ? 1 : 2;
    if (rest < words.size() && words[rest].front() != '#')
      return make_error(errc::invalid_input,
                        at + "unexpected text after the key (expected '<name> <key>' or '<key>')");
    if (auto added = list.add(key, std::string(name)); !added)
      return make_error(errc::invalid_input, at + added.err().message);
    return status::ok();
  });
  if (!ok) return ok.err();
  if (list.empty()) return make_error(errc::invalid_input, where + " lists no keys");
  return list;
}

bool key_allow_list::allows(const std::uint8_t key32[curve_key_bytes]) const {
  return names_.count(std::string(reinterpret_cast<const char*>(key32), curve_key_bytes)) != 0;
}

bool key_allow_list::allows_z85(std::string_view public_z85) const {
  auto key = decode_z85_key(public_z85);
  return key && names_.count(*key) != 0;
}

std::string key_allow_list::name_of(const std::uint8_t key32[curve_key_bytes]) const {
  const auto it = names_.find(std::string(reinterpret_cast<const char*>(key32), curve_key_bytes));
  if (it != names_.end() && !it->second.empty()) return it->second;
  return encode_z85_key(key32);
}

std::string key_allow_list::name_of_z85(std::string_view public_z85) const {
  auto key = decode_z85_key(public_z85);
  if (!key) return std::string(public_z85);
  return name_of(reinterpret_cast<const std::uint8_t*>(key->data()));
}

std::string key_allow_list::key_named(std::string_view name) const {
  for (const auto& [key, key_name] : names_)
    if (key_name == name) return encode_z85_key(reinterpret_cast<const std::uint8_t*>(key.data()));
  return {};
}

bool handle_zap_request(zmq::socket_t& zap_rep, const key_allow_list& allowed,
                        std::string* refused_key_z85) {
  if (refused_key_z85) refused_key_z85->clear();
  try {
    // RFC 27 request: version, request id, domain, address, routing id, mechanism, credentials...
    std::vector<zmq::message_t> request;
    zmq::message_t part;
    if (!zap_rep.recv(part, zmq::recv_flags::dontwait)) return false;  // nothing to answer
    for (;;) {
      // A REP socket delivers whole messages; parts beyond 16 are drained, not kept.
      const bool more = part.more();
      if (request.size() < 16) request.push_back(std::move(part));
      if (!more) break;
      part = zmq::message_t();
      if (!zap_rep.recv(part, zmq::recv_flags::dontwait)) break;
    }

    const auto text = [&](std::size_t i) {
      return i < request.size() ? request[i].to_string() : std::string();
    };
    std::string status_code = "200", status_text = "OK", user_id;
    bool allow = false;
    if (request.size() < 6 || text(0) != "1.0") {
      status_code = "500";
      status_text = "malformed ZAP request";
    } else if (text(5) != "CURVE") {
      status_code = "400";
      status_text = "mechanism " + text(5) + " is not accepted; CURVE is required";
    } else if (request.size() != 7 || request[6].size() != curve_key_bytes) {
      status_code = "500";
      status_text = "malformed CURVE credentials";
    } else {
      const auto* key = static_cast<const std::uint8_t*>(request[6].data());
      allow = allowed.allows(key);
      if (allow) {
        user_id = allowed.name_of(key);
      } else {
        status_code = "400";
        status_text = "client key is not on the allow-list";
        if (refused_key_z85) *refused_key_z85 = encode_z85_key(key);
      }
    }

    // Reply: version, request id (echoed verbatim), status code, status text, user id, metadata.
    const auto more = zmq::send_flags::sndmore | zmq::send_flags::dontwait;
    zmq::message_t request_id;
    if (request.size() > 1) request_id.copy(request[1]);
    const bool sent =
        zap_rep.send(zmq::str_buffer("1.0"), more) && zap_rep.send(request_id, more) &&
        zap_rep.send(zmq::buffer(status_code), more) &&
        zap_rep.send(zmq::buffer(status_text), more) && zap_rep.send(zmq::buffer(user_id), more) &&
        zap_rep.send(zmq::message_t(), zmq::send_flags::dontwait);
    if (!sent) return false;
    return allow;
  } catch (const std::exception&) {
    // zmq::error_t (e.g. ETERM on shutdown) or allocation failure: the client is not admitted.
    return false;
  }
}

}  // namespace archipelago::transport
