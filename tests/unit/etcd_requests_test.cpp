#include <doctest/doctest.h>

#include <string>

#include "core/mesh_setup.hpp"
#include "sync_broker/broker_election.hpp"
#include "sync_broker/etcd_requests.hpp"

using namespace archipelago;
using namespace archipelago::etcd_requests;

TEST_CASE("etcd: keys and values travel as base64, the mesh's two keys as one range") {
  CHECK(base64("") == "");
  CHECK(base64("a") == "YQ==");
  CHECK(base64("archipelago/leader") == "YXJjaGlwZWxhZ28vbGVhZGVy");
  // [p/, p0): '0' is the byte after '/', so the range holds p/epoch and p/leader and nothing of a mesh "p2".
  CHECK(range_keys("p") == R"({"key":")" + base64("p/") + R"(","range_end":")" + base64("p0") + R"("})");
}

TEST_CASE("etcd: a range answer gives the leader's epoch, the newest epoch and its revision") {
  const std::string leader = base64("m/leader"), epoch = base64("m/epoch");
  const std::string body = R"({"header":{"revision":"9"},"kvs":[{"key":")" + epoch +
                           R"(","create_revision":"3","mod_revision":"7","version":"2","value":")" + base64("1281") +
                           R"("},{"key":")" + leader + R"(","create_revision":"7","mod_revision":"7","value":")" +
                           base64("1281") + R"(","lease":"42"}],"count":"2"})";
  auto seen = read_keys(body, "m");
  REQUIRE(seen);
  CHECK(seen->leader_epoch == 1281);
  CHECK(seen->epoch == 1281);
  CHECK(seen->epoch_mod_revision == 7);

  auto empty = read_keys(R"({"header":{"revision":"1"}})", "m");  // etcd leaves an empty list out
  REQUIRE(empty);
  CHECK(empty->leader_epoch == 0);
  CHECK(empty->epoch_mod_revision == 0);

  CHECK_FALSE(read_keys("not json", "m"));
  auto refused = read_keys(R"({"error":"etcdserver: request timed out","code":14,"message":"request timed out"})", "m");
  REQUIRE_FALSE(refused);
  CHECK(refused.err().message.find("request timed out") != std::string::npos);
}

TEST_CASE("etcd: a campaign is one transaction on both keys, its answer says whether it won") {
  const std::string body = campaign("m", 42, 1281, 7);
  CHECK(body.find(R"("create_revision":"0")") != std::string::npos);  // the leader key is absent
  CHECK(body.find(R"("mod_revision":"7")") != std::string::npos);     // the epoch is as read
  CHECK(body.find(R"("lease":"42")") != std::string::npos);           // only the leader key expires
  CHECK(body.find(base64("1281")) != std::string::npos);
  CHECK(read_campaign(R"({"header":{},"succeeded":true,"responses":[]})").value());
  CHECK_FALSE(read_campaign(R"({"header":{},"responses":[]})").value());  // false is left out
  CHECK(read_grant(R"({"header":{},"ID":"7587869254404417281","TTL":"3"})").value() == 7587869254404417281LL);
  CHECK_FALSE(read_grant(R"({"header":{},"TTL":"3"})"));
  CHECK(read_keepalive(R"({"result":{"header":{},"ID":"5","TTL":"3"}})").value() == 3);
  CHECK(read_keepalive(R"({"result":{"header":{},"ID":"5"}})").value() == 0);  // expired
  CHECK(lease_id(5) == R"({"ID":"5"})");
}

TEST_CASE("election: with a lease, a candidate epoch first, leading only once it is granted") {
  broker_election e({1, 2, 1'000'000'000, 3'000'000'000}, 50, 0);
  e.on_epoch(broker_epoch_of(60, 0), 0);
  e.on_leader_heard(1'000'000'000);
  e.on_broker_peer(0, false, 4'000'000'000);
  const auto want = e.candidate(4'000'000'000);
  REQUIRE(want);
  CHECK(*want == broker_epoch_of(61, 1));
  CHECK_FALSE(e.leading());  // a candidate is not a leader
  CHECK(e.candidate(4'500'000'000) == want);
  e.lead_in(broker_epoch_of(70, 1));  // what etcd granted: above the newest epoch it recorded
  CHECK(e.leading());
  CHECK(e.epoch() == broker_epoch_of(70, 1));
  CHECK_FALSE(e.candidate(5'000'000'000));
}
