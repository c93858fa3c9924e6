#include "bench/kernel_costs.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cstring>
#include <vector>

#include "bench/bench_stats.hpp"
#include "core/prng.hpp"
#include "parameter_shard/merge.hpp"
#include "transport/tensor_encoding.hpp"

namespace archipelago {
namespace {

constexpr double gb = 1e9;

// Writes `bytes` from `data` to a new file in `dir`, fdatasync'd; removes it. Seconds.
expected<double> timed_synced_write(const std::string& dir, const std::uint8_t* data,
                                    std::size_t bytes) {
  std::string path = dir + "/archipelago-disk-probe-XXXXXX";
  const int fd = mkstemp(path.data());
  if (fd < 0)
    return make_error(errc::invalid_input, "--measure-dir " + dir + ": cannot create a file there");
  const auto t0 = seconds_clock::now();
  std::size_t done = 0;
  bool ok = true;
  while (ok && done < bytes) {
    const ssize_t n = ::write(fd, data + done, bytes - done);
    ok = n > 0;
    if (ok) done += static_cast<std::size_t>(n);
  }
  ok = ok && ::fdatasync(fd) == 0;
  const double s = since(t0);
  ::close(fd);
  ::unlink(path.c_str());
  if (!ok)
    return make_error(errc::io_error, "--measure-dir " + dir +
                                          ": a write or fdatasync failed: " + std::strerror(errno));
  return s;
}

}  // namespace

expected<kernel_costs_result> measure_kernel_costs(const kernel_cost_options& o) {
  auto enc = parse_tensor_encoding(o.encoding);
  if (!enc) return enc.err();
  if (auto ok = validate_block_size(o.block_size); !ok) return ok.err();
  if (o.members < 1 || o.members > 64)
    return make_error(errc::invalid_input, "members must be in [1, 64]");
  if (!(o.fragment_mib >= 1 && o.fragment_mib <= 1024))
    return make_error(errc::invalid_input, "the fragment must be in [1, 1024] MiB");
  if (o.rounds < 1 || o.rounds > 100)
    return make_error(errc::invalid_input, "rounds must be in [1, 100]");

  kernel_costs_result out;
  out.load_before = load_average();
  const auto n = static_cast<std::size_t>(o.fragment_mib * 1048576 / 4);
  const auto members = static_cast<std::size_t>(o.members);
  // A fragment of four matrices (merged by RDA), the deltas of learners a few
  // hundred steps apart, Θ and its momentum.
  prng rng(1);
  std::vector<std::vector<float>> deltas(members, std::vector<float>(n));
  for (auto& d : deltas)
    for (float& x : d) x = static_cast<float>(1e-3 * rng.normal());
  std::vector<float> theta(n), momentum(n, 0.0f), delta(n), copy_to(n);
  for (float& x : theta) x = static_cast<float>(0.02 * rng.normal());
  std::vector<fragment_tensor> tensors;
  for (std::size_t t = 0; t < 4; ++t)
    tensors.push_back({t * (n / 4), t < 3 ? n / 4 : n - 3 * (n / 4), false});
  std::vector<std::vector<std::uint8_t>> wire;
  for (const auto& d : deltas) {
    auto bytes = encode_tensor(d.data(), n, *enc, o.block_size);
    if (!bytes) return bytes.err();
    wire.push_back(std::move(*bytes));
  }
  std::vector<std::vector<float>> decoded(members, std::vector<float>(n));
  const outer_optimizer outer(nesterov_config{});
  const double fragment_gb = static_cast<double>(n) * 4 / gb;

  std::vector<double> copy, merge, encode, disk;
  std::vector<std::uint8_t> encoded(wire.front().size());
  for (int r = 0; r < o.rounds; ++r) {
    auto t0 = seconds_clock::now();
    for (const auto& d : deltas) std::memcpy(copy_to.data(), d.data(), n * 4);
    copy.push_back(since(t0) / (fragment_gb * static_cast<double>(members)));

    t0 = seconds_clock::now();
    if (auto ok = encode_tensor(deltas[r % members].data(), n, *enc, o.block_size, encoded.data(),
                                encoded.size());
        !ok)
      return ok.err();
    encode.push_back(since(t0) / fragment_gb);

    t0 = seconds_clock::now();
    std::vector<contribution_view> views;
    for (std::size_t m = 0; m < members; ++m) {
      if (auto ok = decode_tensor(wire[m].data(), wire[m].size(), n, *enc, o.block_size,
                                  decoded[m].data());
          !ok)
        return ok.err();
      views.push_back({decoded[m].data(), 1000.0 * static_cast<double>(1 + m), 10.0});
    }
    if (auto ok = merge_outer_gradient(tensors, views, n, delta.data()); !ok) return ok.err();
    outer.step(theta.data(), momentum.data(), delta.data(), n, static_cast<std::uint64_t>(r));
    merge.push_back(since(t0) / (fragment_gb * static_cast<double>(members)));

    // The version a shard commits: Θ and momentum.
    const std::size_t bytes = n * 8;
    std::vector<std::uint8_t> version(bytes);
    std::memcpy(version.data(), theta.data(), n * 4);
    std::memcpy(version.data() + n * 4, momentum.data(), n * 4);
    auto s = timed_synced_write(o.disk_dir, version.data(), bytes);
    if (!s) return s.err();
    disk.push_back(*s / (static_cast<double>(bytes) / gb));
  }
  out.copy_gb_per_s = 1 / median(copy);
  out.merge_s_per_gb = median(merge);
  out.encode_s_per_gb = median(encode);
  out.install_s_per_gb = median(copy);
  out.disk_s_per_gb = median(disk);
  out.merge_vs_copy = (1 / out.merge_s_per_gb) / out.copy_gb_per_s;
  out.load_after = load_average();
  return out;
}

}  // namespace archipelago
