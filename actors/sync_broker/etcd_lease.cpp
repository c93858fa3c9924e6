#include "sync_broker/etcd_lease.hpp"

#include <algorithm>
#include <chrono>
#include <httplib.h>

namespace archipelago {

etcd_lease::etcd_lease(etcd_lease_config cfg, const clock_source& clock, logger& log)
    : cfg_(std::move(cfg)), clock_(clock), log_(log), keeper_(cfg_.keeper) {
  clients_.resize(cfg_.endpoints.size());
  thread_ = std::thread([this] { run(); });
}

etcd_lease::~etcd_lease() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

void etcd_lease::campaign(std::uint64_t min_epoch) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    keeper_.campaign(min_epoch);
    poked_ = true;
  }
  wake_.notify_all();
}

void etcd_lease::release() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    keeper_.release();
    poked_ = true;
  }
  wake_.notify_all();
}

lease_state etcd_lease::state() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return keeper_.state();
}

void etcd_lease::run() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stop_) {
    if (auto call = keeper_.next(clock_.now())) {
      lock.unlock();
      const lease_reply reply = carry(*call);
      lock.lock();
      keeper_.answer(reply, clock_.now());
      continue;
    }
    const nanos wait = std::clamp<nanos>(keeper_.due_at() - clock_.now(), 0, 3'600'000'000'000);
    wake_.wait_for(lock, std::chrono::nanoseconds(wait), [&] { return stop_ || poked_; });
    poked_ = false;
  }
  keeper_.release();  // a clean stop hands leadership on at once
  const auto call = keeper_.next(clock_.now());
  lock.unlock();
  if (call && call->what == lease_call::kind::revoke) (void)carry(*call);
}

/// One call, as etcd's JSON API carries it.
lease_reply etcd_lease::carry(const lease_call& call) {
  lease_reply reply;
  std::optional<std::string> body;
  switch (call.what) {
    case lease_call::kind::range:
      if ((body = post("/v3/kv/range", etcd_requests::range_keys(cfg_.prefix), reply.error))) {
        auto keys = etcd_requests::read_keys(*body, cfg_.prefix);
        if (!keys) return lease_reply::failed(keys.err().to_string());
        reply.keys = *keys;
      }
      break;
    case lease_call::kind::grant:
      if ((body = post("/v3/lease/grant", etcd_requests::grant(call.ttl_s), reply.error))) {
        auto granted = etcd_requests::read_grant(*body);
        if (!granted) return lease_reply::failed(granted.err().to_string());
        reply.granted = *granted;
      }
      break;
    case lease_call::kind::campaign:
      if ((body = post("/v3/kv/txn",
                       etcd_requests::campaign(cfg_.prefix, call.lease_id, call.epoch, call.epoch_mod_revision),
                       reply.error))) {
        auto won = etcd_requests::read_campaign(*body);
        if (!won) return lease_reply::failed(won.err().to_string());
        reply.won = *won;
      }
      break;
    case lease_call::kind::keepalive:
      if ((body = post("/v3/lease/keepalive", etcd_requests::lease_id(call.lease_id), reply.error))) {
        auto ttl = etcd_requests::read_keepalive(*body);
        if (!ttl) return lease_reply::failed(ttl.err().to_string());
        reply.ttl_left_s = *ttl;
        if (*ttl <= 0)
          log_.warn("broker.etcd", "archipelago broker/%u: etcd: the lease is gone (it expired unrenewed)",
                    cfg_.keeper.broker_index);
      }
      break;
    case lease_call::kind::revoke:
      body = post("/v3/lease/revoke", etcd_requests::lease_id(call.lease_id), reply.error);
      break;
  }
  reply.reached = body.has_value();
  return reply;
}

/// One call, bounded by retry_ns; the next endpoint on failure.
std::optional<std::string> etcd_lease::post(const std::string& path, const std::string& body, std::string& failure) {
  const auto bound = std::chrono::nanoseconds(cfg_.keeper.retry_ns);
  for (std::size_t tried = 0; tried < cfg_.endpoints.size(); ++tried) {
    const std::string& endpoint = cfg_.endpoints[endpoint_];
    std::unique_ptr<httplib::Client>& client = clients_[endpoint_];
    if (!client) {  // one connection per endpoint, kept alive: a renewal every second costs no handshake
      client = std::make_unique<httplib::Client>(endpoint);
      client->set_keep_alive(true);
      client->set_connection_timeout(bound);
      client->set_read_timeout(bound);
      client->set_write_timeout(bound);
    }
    auto res = client->Post(path, body, "application/json");
    if (!res) client.reset();  // a broken connection: a new one next time
    if (res && res->status == 200) {
      last_failure_.clear();
      return res->body;
    }
    failure = endpoint + path + ": " +
              (res ? "HTTP " + std::to_string(res->status) + " " + res->body.substr(0, 200) : httplib::to_string(res.error()));
    endpoint_ = (endpoint_ + 1) % cfg_.endpoints.size();
  }
  if (last_failure_ != failure)  // said once per new failure; the logger bounds a flapping one
    log_.warn("broker.etcd", "archipelago broker/%u: etcd: %s", cfg_.keeper.broker_index, failure.c_str());
  last_failure_ = failure;
  return std::nullopt;
}

}  // namespace archipelago
