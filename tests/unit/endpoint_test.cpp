#include <doctest/doctest.h>

#include <string>

#include "transport/endpoint.hpp"

using namespace archipelago::transport;

TEST_CASE("endpoint: what a node may dial") {
  for (const char* good : {"tcp://127.0.0.1:7100", "tcp://10.0.0.5:1", "tcp://localhost:65535", "tcp://node-3.mesh.local:7000",
                           "tcp://[::1]:7000", "tcp://[fe80::1]:7000", "inproc://learner-3", "inproc://sim-broker-1",
                           "inproc://a/b:c+d_e.f"})
    CHECK_MESSAGE(check_endpoint(good), good);
  for (const char* bad : {"", "x", "tcp://", "tcp://127.0.0.1", "tcp://127.0.0.1:0", "tcp://127.0.0.1:65536",
                          "tcp://127.0.0.1:99999", "tcp://127.0.0.1:-1", "tcp://127.0.0.1:+80", "tcp://*:7000",
                          "tcp://127.0.0.1:*", "tcp://300.1.1.1:80", "tcp://1.2.3:80", "tcp://a;b:1", "tcp://a b:1",
                          "tcp://-a.b:1", "tcp://[::1:7000", "tcp://[zz]:1", "ipc:///tmp/x", "udp://1.2.3.4:5",
                          "inproc://", "inproc://a b", "epgm://eth0;239.1.1.1:5555"})
    CHECK_MESSAGE(!check_endpoint(bad), bad);
  CHECK_FALSE(check_endpoint("tcp://" + std::string(300, 'a') + ":1"));
  CHECK_FALSE(check_endpoint("tcp://" + std::string(64, 'a') + ".b:1"));  // a label of 64
  CHECK_FALSE(check_endpoint("inproc://" + std::string(201, 'a')));
  const auto err = check_endpoint(std::string("x\x01y"));
  REQUIRE_FALSE(err);
  CHECK(err.err().message.find("x?y") != std::string::npos);  // shown printable
}

TEST_CASE("endpoint: where a node may bind") {
  for (const char* good : {"tcp://127.0.0.1:0", "tcp://*:7100", "tcp://0.0.0.0:*", "tcp://127.0.0.1:7100",
                           "inproc://broker"})
    CHECK_MESSAGE(check_bind_endpoint(good), good);
  for (const char* bad : {"tcp://127.0.0.1:65536", "tcp://127.0.0.1", "x", "ipc:///tmp/x"})
    CHECK_MESSAGE(!check_bind_endpoint(bad), bad);
}
