#include "transport/curve_keys.hpp"
#include "temp_dir.hpp"

#include <doctest/doctest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>
#include <zmq.hpp>

using namespace archipelago;
using namespace archipelago::transport;
namespace fs = std::filesystem;

using archipelago::testing::temp_dir;

namespace {


void write_file(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  REQUIRE(out.good());
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

curve_keypair fresh_keys() {
  auto keys = generate_keypair();
  REQUIRE(keys.has_value());
  return *keys;
}

std::string binary_key(const std::string& z85) {
  auto key = decode_z85_key(z85);
  REQUIRE(key.has_value());
  return *key;
}

const std::uint8_t* bytes(const std::string& binary) {
  return reinterpret_cast<const std::uint8_t*>(binary.data());
}

// The example keypair from the libzmq CURVE documentation and tests.
constexpr const char* doc_public = "Yne@$w-vo<fVvi]a<NY6T1ed:M$fCG*[IaLV{hID";
constexpr const char* doc_secret = "D:)Q[IlAW!ahhC2ac:9*A}h:p?([4%wOTJ%JR%cs";

}  // namespace

TEST_CASE("curve_keys: Z85 keys are validated and derived like libzmq does") {
  REQUIRE(curve_available());
  CHECK(validate_z85_key(doc_public).has_value());
  auto pub = public_key_of(doc_secret);
  REQUIRE(pub.has_value());
  CHECK(*pub == doc_public);
  CHECK(encode_z85_key(bytes(binary_key(doc_public))) == doc_public);

  const auto message_of = [](std::string_view z85) {
    auto ok = validate_z85_key(z85);
    REQUIRE_FALSE(ok.has_value());
    CHECK(ok.err().code == errc::invalid_input);
    return ok.err().message;
  };
  CHECK(contains(message_of("abc"), "40 Z85 characters, not 3"));
  CHECK(contains(message_of(std::string(doc_public) + "x"), "not 41"));
  std::string bad_char = doc_public;
  bad_char[6] = '~';
  CHECK(contains(message_of(bad_char), "outside the Z85 alphabet at position 7"));
  // Every character is Z85, but "#####" is 85^5 - 1 > 2^32 - 1.
  CHECK(contains(message_of("#####" + std::string(doc_public).substr(5)), "exceeds 32 bits"));
  CHECK_FALSE(decode_z85_key("abc").has_value());
  CHECK_FALSE(public_key_of("abc").has_value());
}

TEST_CASE("curve_keys: generate, save and load round trip") {
  temp_dir dir;
  const curve_keypair keys = fresh_keys();
  CHECK(keys.public_z85.size() == curve_z85_chars);
  CHECK(keys.secret_z85.size() == curve_z85_chars);
  CHECK(keys.public_z85 != keys.secret_z85);
  CHECK(fresh_keys().public_z85 != keys.public_z85);

  REQUIRE(save_keypair(dir.path(), "learner-0", keys).has_value());

  auto loaded = load_keypair(dir.file("learner-0.key"));
  REQUIRE(loaded.has_value());
  CHECK(loaded->public_z85 == keys.public_z85);
  CHECK(loaded->secret_z85 == keys.secret_z85);
  auto pub = load_public_key(dir.file("learner-0.pub"));
  REQUIRE(pub.has_value());
  CHECK(*pub == keys.public_z85);

  const std::string key_text = read_file(dir.file("learner-0.key"));
  const std::string pub_text = read_file(dir.file("learner-0.pub"));
  CHECK(key_text.rfind("# ", 0) == 0);
  CHECK(contains(key_text, "public = \"" + keys.public_z85 + "\"\n"));
  CHECK(contains(key_text, "secret = \"" + keys.secret_z85 + "\"\n"));
  CHECK(pub_text.rfind("# ", 0) == 0);
  CHECK(contains(pub_text, "public = \"" + keys.public_z85 + "\"\n"));
  CHECK_FALSE(contains(pub_text, keys.secret_z85));
  CHECK_FALSE(contains(pub_text, "secret ="));

  struct stat st {};
  REQUIRE(::stat(dir.file("learner-0.key").c_str(), &st) == 0);
  CHECK((st.st_mode & 07777) == 0600);
  REQUIRE(::stat(dir.file("learner-0.pub").c_str(), &st) == 0);
  CHECK((st.st_mode & 0600) == 0600);

  // Exactly the two files: no temporaries left behind.
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(dir.path()))
    names.push_back(entry.path().filename().string());
  std::sort(names.begin(), names.end());
  CHECK(names == std::vector<std::string>{"learner-0.key", "learner-0.pub"});

  // A .key file keeps working as the only input (whitespace, comments, CRLF).
  write_file(dir.file("hand.key"), "# by hand\r\n\r\n  secret=\"" + keys.secret_z85 +
                                       "\"   # mine\r\npublic = \"" + keys.public_z85 + "\"\r\n");
  auto hand = load_keypair(dir.file("hand.key"));
  REQUIRE(hand.has_value());
  CHECK(hand->public_z85 == keys.public_z85);
}

TEST_CASE("curve_keys: existing files are not overwritten without overwrite") {
  temp_dir dir;
  const curve_keypair first = fresh_keys();
  const curve_keypair second = fresh_keys();
  REQUIRE(save_keypair(dir.path(), "node", first).has_value());

  auto again = save_keypair(dir.path(), "node", second);
  REQUIRE_FALSE(again.has_value());
  CHECK(again.err().code == errc::invalid_input);
  CHECK(contains(again.err().message, "node.key' already exists"));
  CHECK(load_keypair(dir.file("node.key"))->public_z85 == first.public_z85);

  REQUIRE(save_keypair(dir.path(), "node", second, /*overwrite=*/true).has_value());
  CHECK(load_keypair(dir.file("node.key"))->public_z85 == second.public_z85);
  CHECK(*load_public_key(dir.file("node.pub")) == second.public_z85);
  struct stat st {};
  REQUIRE(::stat(dir.file("node.key").c_str(), &st) == 0);
  CHECK((st.st_mode & 07777) == 0600);

  // A lone .pub also blocks the pair, and nothing is written.
  write_file(dir.file("lone.pub"), "public = \"" + first.public_z85 + "\"\n");
  auto lone = save_keypair(dir.path(), "lone", second);
  REQUIRE_FALSE(lone.has_value());
  CHECK(contains(lone.err().message, "lone.pub' already exists"));
  CHECK_FALSE(fs::exists(dir.file("lone.key")));
}

TEST_CASE("curve_keys: save rejects bad names, directories and key pairs") {
  temp_dir dir;
  const curve_keypair keys = fresh_keys();
  for (const char* name : {"", "../up", "a/b", ".hidden", "sp ace"}) {
    auto ok = save_keypair(dir.path(), name, keys);
    REQUIRE_FALSE(ok.has_value());
    CHECK(ok.err().code == errc::invalid_input);
  }
  auto missing = save_keypair(dir.file("no-such-dir"), "n", keys);
  REQUIRE_FALSE(missing.has_value());
  CHECK(missing.err().code == errc::not_found);
  CHECK(contains(missing.err().message, "does not exist"));

  write_file(dir.file("plain"), "x");
  auto not_dir = save_keypair(dir.file("plain"), "n", keys);
  REQUIRE_FALSE(not_dir.has_value());
  CHECK(not_dir.err().code == errc::invalid_input);

  curve_keypair mismatched{fresh_keys().public_z85, keys.secret_z85};
  auto bad = save_keypair(dir.path(), "n", mismatched);
  REQUIRE_FALSE(bad.has_value());
  CHECK(contains(bad.err().message, "does not belong"));
  CHECK_FALSE(fs::exists(dir.file("n.key")));
}

TEST_CASE("curve_keys: load reports missing files and bad content with file and line") {
  temp_dir dir;
  const curve_keypair keys = fresh_keys();
  const curve_keypair other = fresh_keys();

  auto missing = load_keypair(dir.file("nope.key"));
  REQUIRE_FALSE(missing.has_value());
  CHECK(missing.err().code == errc::not_found);
  CHECK(contains(missing.err().message, "nope.key' does not exist"));
  CHECK(load_public_key(dir.file("nope.pub")).err().code == errc::not_found);

  const auto failure = [&](const std::string& name, const std::string& text, bool pub = false) {
    write_file(dir.file(name), text);
    error err;
    if (pub) {
      auto r = load_public_key(dir.file(name));
      REQUIRE_FALSE(r.has_value());
      err = r.err();
    } else {
      auto r = load_keypair(dir.file(name));
      REQUIRE_FALSE(r.has_value());
      err = r.err();
    }
    CHECK(err.code == errc::invalid_input);
    CHECK(contains(err.message, name));  // every message names the file
    CHECK_FALSE(contains(err.message, keys.secret_z85));
    return err.message;
  };

  const std::string pub_line = "public = \"" + keys.public_z85 + "\"\n";
  const std::string sec_line = "secret = \"" + keys.secret_z85 + "\"\n";
  CHECK(contains(failure("mismatch.key", "public = \"" + other.public_z85 + "\"\n" + sec_line),
                 "line 1: the public key does not belong"));
  CHECK(contains(failure("short.key", "# c\n\n" + sec_line.substr(0, 20) + "\"\n" + pub_line),
                 "line 3: secret key must be 40 Z85 characters"));
  std::string bad_alpha = pub_line;
  bad_alpha[12] = '~';
  CHECK(contains(failure("alpha.key", sec_line + bad_alpha),
                 "line 2: public key has a character outside the Z85 alphabet"));
  CHECK(contains(
      failure("overflow.key", sec_line + "public = \"#####" + keys.public_z85.substr(5) + "\"\n"),
      "line 2: public key is not valid Z85"));
  CHECK(contains(failure("nosecret.key", pub_line), "has no 'secret' entry"));
  CHECK(contains(failure("nopublic.key", sec_line), "has no 'public' entry"));
  CHECK(contains(failure("unknown.key", pub_line + sec_line + "colour = \"red\"\n"),
                 "line 3: unknown entry (expected 'public' or 'secret')"));
  CHECK(contains(failure("twice.key", pub_line + pub_line + sec_line),
                 "line 2: second 'public' entry"));
  CHECK(contains(failure("unquoted.key", "public = " + keys.public_z85 + "\n" + sec_line),
                 "line 1: the value of 'public' must be a quoted string"));
  CHECK(contains(
      failure("trailing.key", pub_line.substr(0, pub_line.size() - 1) + " junk\n" + sec_line),
      "line 1: unexpected text"));
  CHECK(contains(failure("noequals.key", "just words\n"), "line 1: expected name = \"value\""));
  // A bare key pasted into the file may contain '=' (a Z85 digit): no piece of it is quoted back.
  for (const std::string line :
       {"Kx7Sec=ret+rest-of-a-key\n", "Kx7Sec = \"unterminated\n", "Kx7Sec = \"v\" more\n"}) {
    const std::string message = failure("bare.key", line);
    CHECK_FALSE(contains(message, "Kx7Sec"));
    CHECK(contains(message, "line 1: "));
  }
  CHECK(contains(failure("empty.key", ""), "has no 'secret' entry"));
  CHECK(contains(failure("secret.pub", pub_line + sec_line, true), "line 2: holds a secret key"));
  CHECK(contains(failure("bad.pub", "public = \"" + keys.public_z85.substr(1) + "\"\n", true),
                 "line 1: public key must be 40"));
  CHECK(contains(failure("nopublic.pub", "# nothing\n", true), "has no 'public' entry"));

  fs::create_directory(dir.file("adir.key"));
  auto is_dir = load_keypair(dir.file("adir.key"));
  REQUIRE_FALSE(is_dir.has_value());
  CHECK(contains(is_dir.err().message, "is not a regular file"));
}

TEST_CASE("curve_keys: allow-list from a directory of .pub files") {
  temp_dir dir;
  const curve_keypair a = fresh_keys(), b = fresh_keys(), stranger = fresh_keys();
  REQUIRE(save_keypair(dir.path(), "alice", a).has_value());  // alice.key must be ignored
  REQUIRE(save_keypair(dir.path(), "bob", b).has_value());
  write_file(dir.file("notes.txt"), "not a key\n");

  auto list = key_allow_list::load(dir.path());
  REQUIRE(list.has_value());
  CHECK(list->size() == 2);
  CHECK(list->allows(bytes(binary_key(a.public_z85))));
  CHECK(list->allows(bytes(binary_key(b.public_z85))));
  CHECK_FALSE(list->allows(bytes(binary_key(stranger.public_z85))));
  CHECK(list->allows_z85(a.public_z85));
  CHECK_FALSE(list->allows_z85(stranger.public_z85));
  CHECK_FALSE(list->allows_z85(a.secret_z85));
  CHECK_FALSE(list->allows_z85("not a key"));
  CHECK(list->name_of(bytes(binary_key(a.public_z85))) == "alice");
  CHECK(list->name_of_z85(b.public_z85) == "bob");
  CHECK(list->name_of_z85(stranger.public_z85) == stranger.public_z85);

  // The same key under two names is a copy-paste mistake.
  fs::copy_file(dir.file("bob.pub"), dir.file("carol.pub"));
  auto dup = key_allow_list::load(dir.path());
  REQUIRE_FALSE(dup.has_value());
  CHECK(contains(dup.err().message, "carol.pub"));
  CHECK(contains(dup.err().message, "already listed as 'bob'"));
  fs::remove(dir.file("carol.pub"));

  write_file(dir.file("broken.pub"), "# x\npublic = \"short\"\n");
  auto broken = key_allow_list::load(dir.path());
  REQUIRE_FALSE(broken.has_value());
  CHECK(broken.err().code == errc::invalid_input);
  CHECK(contains(broken.err().message, "broken.pub', line 2: public key must be 40"));

  temp_dir empty;
  auto none = key_allow_list::load(empty.path());
  REQUIRE_FALSE(none.has_value());
  CHECK(contains(none.err().message, "has no *.pub files"));
  auto missing = key_allow_list::load(empty.file("nowhere"));
  REQUIRE_FALSE(missing.has_value());
  CHECK(missing.err().code == errc::not_found);
}

TEST_CASE("curve_keys: allow-list from a list file") {
  temp_dir dir;
  const curve_keypair a = fresh_keys(), b = fresh_keys(), c = fresh_keys(), d = fresh_keys(),
                      stranger = fresh_keys();
  const std::string path = dir.file("allowed.txt");
  write_file(path,
             "# mesh of site A\n"
             "\n"
             "learner-0 " +
                 a.public_z85 +
                 "\n"
                 "   " +
                 b.public_z85 +
                 "   # a bare key with a comment\r\n"
                 "broker\t" +
                 c.public_z85 +
                 "  # named, with a comment\n"
                 "  # indented comment\n"
                 "public = \"" +
                 d.public_z85 + "\"\n");
  auto list = key_allow_list::load(path);
  REQUIRE(list.has_value());
  CHECK(list->size() == 4);
  for (const auto* k : {&a, &b, &c, &d}) {
    CHECK(list->allows_z85(k->public_z85));
    CHECK(list->allows(bytes(binary_key(k->public_z85))));
  }
  CHECK_FALSE(list->allows_z85(stranger.public_z85));
  CHECK_FALSE(list->allows(bytes(binary_key(stranger.public_z85))));
  CHECK(list->name_of_z85(a.public_z85) == "learner-0");
  CHECK(list->name_of_z85(c.public_z85) == "broker");
  CHECK(list->name_of_z85(b.public_z85) == b.public_z85);  // listed without a name

  const auto failure = [&](const std::string& text) {
    write_file(path, text);
    auto r = key_allow_list::load(path);
    REQUIRE_FALSE(r.has_value());
    CHECK(r.err().code == errc::invalid_input);
    CHECK(contains(r.err().message, "allowed.txt"));
    return r.err().message;
  };
  CHECK(contains(failure("# ok\nx " + a.public_z85 + "\nbad " + a.public_z85.substr(0, 38) + "\n"),
                 "line 3: key must be 40 Z85 characters, not 38"));
  std::string bad_alpha = b.public_z85;
  bad_alpha[0] = '"';
  CHECK(contains(failure(a.public_z85 + "\n" + bad_alpha + "\n"),
                 "line 2: key has a character outside the Z85 alphabet at position 1"));
  CHECK(
      contains(failure("n " + a.public_z85 + " extra\n"), "line 1: unexpected text after the key"));
  CHECK(contains(failure("one " + a.public_z85 + "\ntwo " + a.public_z85 + "\n"),
                 "line 2: duplicate key (already listed as 'one')"));
  CHECK(contains(failure("secret = \"" + a.secret_z85 + "\"\n"),
                 "line 1: a secret key does not belong"));
  CHECK(contains(failure("# nothing here\n\n"), "lists no keys"));
  CHECK(contains(failure("lonely-name\n"), "line 1: key must be 40"));

  key_allow_list manual;
  CHECK(manual.empty());
  CHECK(manual.add(a.public_z85, "a").has_value());
  CHECK_FALSE(manual.add(a.public_z85, "again").has_value());
  CHECK_FALSE(manual.add("nonsense").has_value());
  CHECK(manual.size() == 1);
}

namespace {

// Sends one ZAP request frame by frame (REQ side) and returns the reply frames.
std::vector<std::string> zap_round_trip(zmq::socket_t& req, zmq::socket_t& rep,
                                        const key_allow_list& allowed,
                                        const std::vector<std::string>& request, bool* allowed_out,
                                        std::string* refused) {
  for (std::size_t i = 0; i < request.size(); ++i)
    REQUIRE(req.send(zmq::buffer(request[i]),
                     i + 1 < request.size() ? zmq::send_flags::sndmore : zmq::send_flags::none));
  zmq::pollitem_t item{rep.handle(), 0, ZMQ_POLLIN, 0};
  REQUIRE(zmq::poll(&item, 1, std::chrono::milliseconds(2000)) == 1);
  *allowed_out = handle_zap_request(rep, allowed, refused);
  std::vector<std::string> reply;
  for (bool more = true; more;) {
    zmq::pollitem_t in{req.handle(), 0, ZMQ_POLLIN, 0};
    REQUIRE(zmq::poll(&in, 1, std::chrono::milliseconds(2000)) == 1);
    zmq::message_t part;
    REQUIRE(req.recv(part));
    more = part.more();
    reply.push_back(part.to_string());
  }
  return reply;
}

}  // namespace

TEST_CASE("curve_keys: handle_zap_request answers RFC 27 requests") {
  const curve_keypair alice = fresh_keys(), stranger = fresh_keys();
  key_allow_list allowed;
  REQUIRE(allowed.add(alice.public_z85, "alice").has_value());

  zmq::context_t ctx;
  zmq::socket_t rep(ctx, zmq::socket_type::rep);
  zmq::socket_t req(ctx, zmq::socket_type::req);
  rep.set(zmq::sockopt::linger, 0);
  req.set(zmq::sockopt::linger, 0);
  rep.bind("inproc://zap-protocol-test");  // not the real ZAP endpoint: we play libzmq
  req.connect("inproc://zap-protocol-test");

  // Nothing waiting: returns at once, answers nothing.
  std::string refused = "stale";
  CHECK_FALSE(handle_zap_request(rep, allowed, &refused));
  CHECK(refused.empty());

  const auto request = [](const std::string& version, const std::string& mechanism,
                          const std::string& credential) {
    std::vector<std::string> r{version, "req-7", "archipelago", "127.0.0.1", "", mechanism};
    if (!credential.empty()) r.push_back(credential);
    return r;
  };
  bool ok = false;
  auto reply = zap_round_trip(req, rep, allowed,
                              request("1.0", "CURVE", binary_key(alice.public_z85)), &ok, &refused);
  CHECK(ok);
  CHECK(refused.empty());
  CHECK(reply == std::vector<std::string>{"1.0", "req-7", "200", "OK", "alice", ""});

  reply = zap_round_trip(req, rep, allowed,
                         request("1.0", "CURVE", binary_key(stranger.public_z85)), &ok, &refused);
  CHECK_FALSE(ok);
  CHECK(refused == stranger.public_z85);
  REQUIRE(reply.size() == 6);
  CHECK(reply[0] == "1.0");
  CHECK(reply[1] == "req-7");
  CHECK(reply[2] == "400");
  CHECK(reply[4].empty());

  reply = zap_round_trip(req, rep, allowed, request("1.0", "PLAIN", "user"), &ok, &refused);
  CHECK_FALSE(ok);
  CHECK(reply[2] == "400");
  CHECK(contains(reply[3], "CURVE is required"));

  reply = zap_round_trip(req, rep, allowed, request("1.0", "CURVE", "short"), &ok, &refused);
  CHECK_FALSE(ok);
  CHECK(reply[2] == "500");

  reply = zap_round_trip(req, rep, allowed, request("2.0", "CURVE", binary_key(alice.public_z85)),
                         &ok, &refused);
  CHECK_FALSE(ok);
  CHECK(reply[2] == "500");
  CHECK(reply[1] == "req-7");

  reply = zap_round_trip(req, rep, allowed, {"1.0"}, &ok, &refused);
  CHECK_FALSE(ok);
  CHECK(reply[2] == "500");
}

namespace {

// Serves the context's ZAP endpoint on a helper thread until destroyed, the
// way the transport's I/O thread will: poll, then handle_zap_request.
class zap_server {
 public:
  zap_server(zmq::context_t& ctx, const key_allow_list& allowed)
      : socket_(ctx, zmq::socket_type::rep), allowed_(allowed) {
    socket_.set(zmq::sockopt::linger, 0);
    socket_.bind(zap_endpoint);  // before any CURVE socket handshakes
    thread_ = std::thread([this] { run(); });
  }
  zap_server(const zap_server&) = delete;
  zap_server& operator=(const zap_server&) = delete;
  ~zap_server() {
    stop_ = true;
    thread_.join();
    socket_.close();
  }
  int allowed_count() const { return allowed_count_; }
  int refused_count() const { return refused_count_; }
  std::string last_refused() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return last_refused_;
  }

 private:
  void run() {
    while (!stop_) {
      zmq::pollitem_t item{socket_.handle(), 0, ZMQ_POLLIN, 0};
      try {
        if (zmq::poll(&item, 1, std::chrono::milliseconds(20)) == 0) continue;
      } catch (const zmq::error_t&) {
        return;
      }
      std::string refused;
      if (handle_zap_request(socket_, allowed_, &refused)) {
        ++allowed_count_;
      } else {
        std::lock_guard<std::mutex> lock(mutex_);
        last_refused_ = refused;
        ++refused_count_;
      }
    }
  }

  zmq::socket_t socket_;
  const key_allow_list& allowed_;
  std::atomic<bool> stop_{false};
  std::atomic<int> allowed_count_{0}, refused_count_{0};
  mutable std::mutex mutex_;
  std::string last_refused_;
  std::thread thread_;
};

zmq::socket_t curve_client(zmq::context_t& ctx, const curve_keypair& keys,
                           const std::string& server_public, const std::string& endpoint) {
  zmq::socket_t s(ctx, zmq::socket_type::dealer);
  s.set(zmq::sockopt::linger, 0);
  s.set(zmq::sockopt::curve_serverkey, server_public);
  s.set(zmq::sockopt::curve_publickey, keys.public_z85);
  s.set(zmq::sockopt::curve_secretkey, keys.secret_z85);
  s.connect(endpoint);
  return s;
}

bool readable(zmq::socket_t& s, int timeout_ms) {
  zmq::pollitem_t item{s.handle(), 0, ZMQ_POLLIN, 0};
  return zmq::poll(&item, 1, std::chrono::milliseconds(timeout_ms)) == 1;
}

}  // namespace

TEST_CASE("curve_keys: CURVE over TCP admits allow-listed keys only") {
  REQUIRE(curve_available());
  const curve_keypair server_keys = fresh_keys(), alice = fresh_keys(), mallory = fresh_keys();
  key_allow_list allowed;
  REQUIRE(allowed.add(alice.public_z85, "alice").has_value());

  zmq::context_t ctx;  // declared first: destroyed after every socket below
  zap_server zap(ctx, allowed);

  zmq::socket_t server(ctx, zmq::socket_type::router);
  server.set(zmq::sockopt::linger, 0);
  server.set(zmq::sockopt::curve_server, true);
  server.set(zmq::sockopt::curve_secretkey, server_keys.secret_z85);
  server.set(zmq::sockopt::zap_domain, "archipelago");
  server.bind("tcp://127.0.0.1:*");
  const std::string endpoint = server.get(zmq::sockopt::last_endpoint);

  SUBCASE("an allow-listed client gets through and hears back") {
    zmq::socket_t client = curve_client(ctx, alice, server_keys.public_z85, endpoint);
    REQUIRE(client.send(zmq::str_buffer("hello"), zmq::send_flags::dontwait));

    REQUIRE(readable(server, 2000));
    zmq::message_t routing_id, body;
    REQUIRE(server.recv(routing_id));
    REQUIRE(routing_id.more());
    REQUIRE(server.recv(body));
    CHECK(body.to_string() == "hello");
    CHECK(std::string(body.gets("User-Id")) == "alice");  // the ZAP reply's user id
    REQUIRE(server.send(routing_id, zmq::send_flags::sndmore));
    REQUIRE(server.send(zmq::str_buffer("welcome"), zmq::send_flags::none));

    REQUIRE(readable(client, 2000));
    zmq::message_t reply;
    REQUIRE(client.recv(reply));
    CHECK(reply.to_string() == "welcome");
    CHECK(zap.allowed_count() >= 1);
    CHECK(zap.refused_count() == 0);
  }

  SUBCASE("an unknown client never gets through") {
    zmq::socket_t intruder = curve_client(ctx, mallory, server_keys.public_z85, endpoint);
    REQUIRE(intruder.send(zmq::str_buffer("let me in"), zmq::send_flags::dontwait));

    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
    while (zap.refused_count() == 0 && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    REQUIRE(zap.refused_count() >= 1);
    CHECK(zap.last_refused() == mallory.public_z85);
    CHECK(zap.allowed_count() == 0);
    CHECK_FALSE(readable(server, 300));
    CHECK_FALSE(readable(intruder, 50));
  }

  SUBCASE("a client that does not know the server's key never gets through") {
    zmq::socket_t confused = curve_client(ctx, alice, fresh_keys().public_z85, endpoint);
    REQUIRE(confused.send(zmq::str_buffer("hello?"), zmq::send_flags::dontwait));
    CHECK_FALSE(readable(server, 300));
    CHECK(zap.allowed_count() == 0);  // the handshake fails before ZAP is asked
  }
}
