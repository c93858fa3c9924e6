#include "sync_broker/etcd_lease.hpp"

#include <algorithm>
#include <chrono>
#include <httplib.h>

#include "core/mesh_setup.hpp"

namespace archipelago {

etcd_lease::etcd_lease(etcd_lease_config cfg, const clock_source& clock, logger& log)
    : cfg_(std::move(cfg)), clock_(clock), log_(log) {
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
    if (state_.held_epoch != 0 || wanted_epoch_ >= std::max<std::uint64_t>(min_epoch, 1)) return;
    wanted_epoch_ = std::max<std::uint64_t>(min_epoch, 1);
    release_ = false;
  }
  wake_.notify_all();
}

void etcd_lease::release() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    wanted_epoch_ = 0;
    release_ = true;
  }
  wake_.notify_all();
}

lease_state etcd_lease::state() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return state_;
}

/// One call, bounded by retry_ns; the next endpoint on failure. The error goes to state().
std::optional<std::string> etcd_lease::post(const std::string& path, const std::string& body) {
  const auto bound = std::chrono::nanoseconds(cfg_.retry_ns);
  std::string failure;
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
      std::lock_guard<std::mutex> lock(mutex_);
      state_.error.clear();
      return res->body;
    }
    failure = endpoint + path + ": " +
              (res ? "HTTP " + std::to_string(res->status) + " " + res->body.substr(0, 200) : httplib::to_string(res.error()));
    endpoint_ = (endpoint_ + 1) % cfg_.endpoints.size();
  }
  std::lock_guard<std::mutex> lock(mutex_);
  if (state_.error != failure)  // said once per new failure; the logger bounds a flapping one
    log_.warn("broker.etcd", "archipelago broker/%u: etcd: %s", cfg_.broker_index, failure.c_str());
  state_.error = failure;
  return std::nullopt;
}

void etcd_lease::run() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stop_) {
    const std::uint64_t wanted = wanted_epoch_;
    const bool release = release_, held = lease_id_ != 0;
    release_ = false;
    lock.unlock();
    if (release && held) revoke();
    else if (held && clock_.now() >= next_renewal_) renew();
    else if (!held && wanted != 0) try_to_lead(wanted);
    lock.lock();
    if (stop_) break;
    // Renew every TTL/3; campaign again every retry_ns; otherwise wait to be asked.
    const nanos wait = lease_id_ != 0 ? std::max<nanos>(next_renewal_ - clock_.now(), 0)
                                      : (wanted_epoch_ != 0 ? cfg_.retry_ns : nanos{3'600'000'000'000});
    wake_.wait_for(lock, std::chrono::nanoseconds(wait), [&] { return stop_ || release_ || (lease_id_ == 0 && wanted_epoch_ != wanted); });
  }
  lock.unlock();
  if (lease_id_ != 0) revoke();  // a clean stop hands leadership on at once
}

void etcd_lease::renew() {
  const nanos sent = clock_.now();
  auto body = post("/v3/lease/keepalive", etcd_requests::lease_id(lease_id_));
  const nanos ttl_ns = cfg_.ttl_s * 1'000'000'000;
  next_renewal_ = sent + ttl_ns / 3;
  if (!body) return;  // keep trying until valid_until passes; the seat stops leading then
  auto ttl = etcd_requests::read_keepalive(*body);
  std::lock_guard<std::mutex> lock(mutex_);
  if (ttl && *ttl > 0) {
    state_.valid_until = sent + *ttl * 1'000'000'000 - std::max<nanos>(ttl_ns / 10, 200'000'000);
    return;
  }
  log_.warn("broker.etcd", "archipelago broker/%u: etcd: the lease of epoch %llu is gone", cfg_.broker_index,
            static_cast<unsigned long long>(state_.held_epoch));
  lease_id_ = 0;
  state_.held_epoch = 0;
  wanted_epoch_ = 0;
}

void etcd_lease::try_to_lead(std::uint64_t min_epoch) {
  auto seen_body = post("/v3/kv/range", etcd_requests::range_keys(cfg_.prefix));
  if (!seen_body) return;
  auto seen = etcd_requests::read_keys(*seen_body, cfg_.prefix);
  if (!seen) {
    std::lock_guard<std::mutex> lock(mutex_);
    state_.error = seen.err().to_string();
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    state_.leader_epoch = seen->leader_epoch;
  }
  if (seen->leader_epoch != 0) return;  // another broker holds the lease: ask again later
  const nanos sent = clock_.now();
  auto granted_body = post("/v3/lease/grant", etcd_requests::grant(cfg_.ttl_s));
  if (!granted_body) return;
  auto granted = etcd_requests::read_grant(*granted_body);
  if (!granted) return;
  const std::uint64_t epoch = std::max(min_epoch, broker_epoch_of((seen->epoch >> 8) + 1, cfg_.broker_index));
  auto result = post("/v3/kv/txn", etcd_requests::campaign(cfg_.prefix, *granted, epoch, seen->epoch_mod_revision));
  const auto won = result ? etcd_requests::read_campaign(*result) : expected<bool>(false);
  if (!won.has_value() || !*won) {
    (void)post("/v3/lease/revoke", etcd_requests::lease_id(*granted));  // another broker was quicker
    return;
  }
  lease_id_ = *granted;
  const nanos ttl_ns = cfg_.ttl_s * 1'000'000'000;
  next_renewal_ = sent + ttl_ns / 3;
  std::lock_guard<std::mutex> lock(mutex_);
  state_.held_epoch = state_.leader_epoch = epoch;
  state_.valid_until = sent + ttl_ns - std::max<nanos>(ttl_ns / 10, 200'000'000);
  wanted_epoch_ = 0;
}

void etcd_lease::revoke() {
  (void)post("/v3/lease/revoke", etcd_requests::lease_id(lease_id_));
  lease_id_ = 0;
  std::lock_guard<std::mutex> lock(mutex_);
  state_.held_epoch = 0;
}

}  // namespace archipelago
