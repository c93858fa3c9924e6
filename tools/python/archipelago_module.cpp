// The Python package's native half (`archipelago._native`): a learner shell
// around the real learner wire layer (learner_wire, learner_core) and node
// transport, for a model trained by someone else's loop. It plays the part
// learner_actor plays for the GPT, without CAF: the transport's I/O thread
// queues inbound messages and peer events (bounded); the caller's thread hands
// them to the wire layer between two of its steps (after_step, wait_ready,
// close), and runs the wire's timers there. So merged fragments are installed
// between steps, as in the native learner, never while the user's optimizer
// writes the parameters.
//
// The parameters live in one flat buffer laid out by the mesh's layout. The
// user either adopts views of it (array(name): numpy arrays over the buffer,
// which a PyTorch model can wrap with torch.from_numpy, no copy) or binds
// arrays of their own (bind): they are copied into the buffer before the wire
// reads it and the fragments it installed are copied back.

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <cstring>
#include <limits>
#include <mutex>

#include "core/inner_optimizer.hpp"
#include "core/config.hpp"
#include "core/layout.hpp"
#include "core/log.hpp"
#include "core/mesh_setup.hpp"
#include "core/node_status.hpp"
#include "core/prng.hpp"
#include "learner/learner_wire.hpp"
#include "learner/model/trainer.hpp"
#include "node/metrics_server.hpp"
#include "transport/transport.hpp"
#include "transport/wire_metrics.hpp"

namespace py = pybind11;

namespace archipelago {
namespace {

[[noreturn]] void raise(const error& e) { throw py::value_error(e.message); }

config load_config(const std::string& path, const std::vector<std::string>& overrides) {
  config cfg;
  if (!path.empty())
    if (auto ok = apply_toml_file(cfg, path); !ok) raise(ok.err());
  for (const auto& o : overrides)
    if (auto ok = set_knob_assignment(cfg, o); !ok) raise(ok.err());
  if (auto ok = validate_mesh(cfg); !ok) raise(ok.err());
  return cfg;
}

/// A numpy view of `count` floats at `data` with `dims`, keeping `owner` alive.
py::array float_view(float* data, const std::vector<int>& dims, py::handle owner) {
  std::vector<py::ssize_t> shape(dims.begin(), dims.end()), strides(dims.size());
  py::ssize_t stride = sizeof(float);
  for (std::size_t i = dims.size(); i-- > 0;) {
    strides[i] = stride;
    stride *= shape[i];
  }
  return py::array(py::dtype::of<float>(), shape, strides, data, owner);
}

std::vector<int> dims_of(const tensor_spec& t) {
  if (!t.dims.empty()) return t.dims;
  return t.rows == 1 && t.kind == tensor_kind::vector ? std::vector<int>{t.cols} : std::vector<int>{t.rows, t.cols};
}

class py_learner {
 public:
  py_learner(const std::string& config_path, std::vector<std::string> overrides, std::uint32_t index,
             std::string broker, std::vector<std::string> shards, std::string listen, std::uint32_t tokens_per_step,
             int metrics_port, std::string log_level)
      : log_(log_options_for(log_level), clock_) {
    config cfg = load_config(config_path, overrides);
    auto policy = resolve_policy(cfg);
    if (!policy) raise(policy.err());
    if (index >= static_cast<std::uint32_t>(cfg.mesh.learners))
      raise(make_error(errc::invalid_input, "index " + std::to_string(index) + ": mesh.learners is " +
                                                std::to_string(cfg.mesh.learners)));
    if (static_cast<int>(shards.size()) != policy->shards)
      raise(make_error(errc::invalid_input, "shards lists " + std::to_string(shards.size()) +
                                                " endpoints; the configuration has " +
                                                std::to_string(policy->shards) + " shard(s)"));
    if (policy->send_gradients)
      raise(make_error(errc::invalid_input, "mesh.mode = " + cfg.mesh.mode + ": its contributions are gradients, "
                                                "which this package does not take; use decoupled, streaming or diloco"));
    setup_ = make_mesh_setup(cfg, *policy);
    // "primary[,standby...]", as `archipelago node --broker` takes it.
    for (std::size_t at = 0; at <= broker.size();) {
      const std::size_t comma = std::min(broker.find(',', at), broker.size());
      (at == 0 ? setup_.broker_endpoint : setup_.standby_endpoints.emplace_back()) = broker.substr(at, comma - at);
      at = comma + 1;
    }
    setup_.shard_endpoints = std::move(shards);
    setup_.learner_endpoints.assign(index + 1, listen);
    index_ = index;
    inc_ = incarnation{static_cast<std::uint64_t>(wall_clock_ns() / 1'000'000)};
    params_.assign(setup_.layout.total_floats, 0.f);
    versions_.assign(setup_.fragments(), not_copied);
    const node_address me{role::learner, index};
    auto tc = transport::transport_config_from(setup_.cfg, me, inc_, listen);
    if (!tc) raise(tc.err());
    auto wire = transport::node_transport::start(
        std::move(*tc), clock_, log_,
        [this](std::shared_ptr<const transport::inbound_message> m) { push({std::move(m), {}, false}); },
        [this](node_address peer, bool alive) { push({nullptr, peer, alive}); });
    if (!wire) raise(wire.err());
    wire_ = std::move(*wire);
    const learner_model_view model{params_.data(), nullptr, tokens_per_step, 1};
    learner_ = std::make_unique<learner_wire>(setup_, learner_settings(setup_), index, inc_, *wire_, log_, model);
    started_ns_ = clock_.now();
    {
      std::lock_guard lock(wire_mu_);
      learner_->start();
    }
    retry_ns_ = static_cast<nanos>(setup_.cfg.wire.heartbeat_interval_ms) * setup_.cfg.wire.liveness * 1'000'000;
    join_timer_ns_ = started_ns_ + retry_ns_;
    if (metrics_port >= 0) {
      metrics_server::handlers h;
      h.metrics = [this] { return metrics_text(); };
      h.nodes = [this] { return "[" + node_json() + "]"; };
      auto server = metrics_server::start({"127.0.0.1", metrics_port}, std::move(h), log_);
      if (!server) raise(server.err());
      metrics_ = std::move(*server);
    }
  }

  ~py_learner() { shut_down(); }

  /// Blocks until every fragment is installed (the first step may run) or `timeout_s`.
  bool wait_ready(double timeout_s) {
    check_refused();
    {
      py::gil_scoped_release unlocked;
      const nanos deadline = clock_.now() + static_cast<nanos>(timeout_s * 1e9);
      while (!stepping_ && !refused_ && clock_.now() < deadline) pump(deadline);
    }
    check_refused();
    copy_out();
    return stepping_;
  }

  /// One step of `tokens` tokens is done: Progress and every contribution now
  /// ready go out, messages that arrived meanwhile are handled, and a synchronous
  /// policy waits here for the fragment it needs.
  void after_step(std::uint64_t tokens, double step_s) {
    check_refused();
    if (!stepping_) throw py::value_error("after_step before wait_ready(): the learner has not installed the model yet");
    copy_in();
    {
      py::gil_scoped_release unlocked;
      const nanos now = clock_.now();
      const nanos step_ns = step_s >= 0 ? static_cast<nanos>(step_s * 1e9) : (last_step_end_ns_ ? now - last_step_end_ns_ : 0);
      {
        std::lock_guard lock(wire_mu_);
        learner_->after_step(tokens, step_ns);
      }
      pump(clock_.now());
      bool waiting;
      {
        std::lock_guard lock(wire_mu_);
        waiting = learner_->wait_before_step(clock_.now());
      }
      const nanos bound = static_cast<nanos>(setup_.cfg.mesh.round_timeout_s * 1e9);
      nanos wait_deadline = clock_.now() + bound;
      while (waiting && !refused_) {
        pump(wait_deadline);
        std::lock_guard lock(wire_mu_);
        waiting = learner_->waiting();
        if (waiting && clock_.now() >= wait_deadline) {
          learner_->on_wait_timeout();
          wait_deadline = clock_.now() + bound;
        }
      }
      last_step_end_ns_ = clock_.now();
    }
    copy_out();
    check_refused();
  }

  /// Handles what arrived without stepping (e.g. while the user's loop evaluates).
  void poll() {
    check_refused();
    {
      py::gil_scoped_release unlocked;
      pump(clock_.now());
    }
    copy_out();
  }

  /// Leaves like a native learner: the last Progress and contributions went out
  /// with the last after_step; with mesh.flush (and `flush`) it first waits,
  /// bounded by mesh.round_timeout_s, until every fragment's work is in a version
  /// received (a learner stopped by a signal passes flush=False); Leave, then the
  /// transport drains its control lanes (bounded) and stops.
  void close(const std::string& reason, bool flush) {
    py::gil_scoped_release unlocked;
    if (flush && wire_ && stepping_ && !refused_) {
      bool flushing;
      {
        std::lock_guard lock(wire_mu_);
        flushing = learner_->begin_flush();
      }
      const nanos deadline = clock_.now() + static_cast<nanos>(setup_.cfg.mesh.round_timeout_s * 1e9);
      while (flushing && !refused_ && clock_.now() < deadline) {
        pump(deadline);
        std::lock_guard lock(wire_mu_);
        flushing = learner_->flushing();
      }
    }
    shut_down(reason);
  }

  /// Copy mode: the user's arrays, in layout order; each must match its tensor.
  void bind(const py::dict& arrays) {
    std::vector<py::array_t<float>> bound(setup_.layout.tensors.size());
    std::size_t i = 0;
    for (const auto& t : setup_.layout.tensors) {
      const py::str name(t.name);
      if (!arrays.contains(name))
        throw py::value_error("bind: no array for the layout's tensor '" + t.name + "' (tensor " + std::to_string(i) + ")");
      py::array a = py::reinterpret_borrow<py::array>(arrays[name]);
      if (!a.dtype().is(py::dtype::of<float>())) throw py::value_error("bind: '" + t.name + "' is not float32");
      if (!(a.flags() & py::array::c_style) || !a.writeable())
        throw py::value_error("bind: '" + t.name + "' is not a writeable C-contiguous array");
      const auto want = dims_of(t);
      std::vector<int> got(a.shape(), a.shape() + a.ndim());
      if (got != want) {
        auto text = [](const std::vector<int>& d) {
          std::string s = "[";
          for (std::size_t k = 0; k < d.size(); ++k) s += (k ? "," : "") + std::to_string(d[k]);
          return s + "]";
        };
        throw py::value_error("bind: '" + t.name + "' has shape " + text(got) + ", the layout says " + text(want));
      }
      bound[i] = py::array_t<float>(a);
      if (bound[i].data() != a.data()) throw py::value_error("bind: '" + t.name + "' could not be bound without a copy");
      ++i;
    }
    if (arrays.size() != setup_.layout.tensors.size())
      for (const auto& item : arrays)
        if (!setup_.layout.find(py::str(item.first)))
          throw py::value_error("bind: '" + std::string(py::str(item.first)) + "' is not a tensor of the layout");
    bound_ = std::move(bound);
    if (stepping_) copy_out(true);
  }

  /// Adopt mode: a numpy view of one tensor in the learner's own buffer.
  py::array array(py::object self, const std::string& name) {
    const tensor_spec* t = setup_.layout.find(name);
    if (!t) throw py::key_error("'" + name + "' is not a tensor of the layout");
    return float_view(params_.data() + t->offset, dims_of(*t), self);
  }

  std::vector<std::string> names() const {
    std::vector<std::string> out;
    for (const auto& t : setup_.layout.tensors) out.push_back(t.name);
    return out;
  }

  /// The node status a native learner serves on GET /node and prints in its
  /// `node --json` summary: what a drill across processes reads.
  std::string node_json() {
    std::lock_guard lock(wire_mu_);
    node_status s = learner_->status();
    if (wire_) count_wire(s.counts, wire_->counters());
    s.schedule_step = schedule_step_ + static_cast<std::int64_t>(s.counts.steps);
    return to_json(s);
  }

  /// The chaos monkey's slow-down in force (1: none); cheap enough for every step.
  double slowdown() {
    std::lock_guard lock(wire_mu_);
    return learner_->slowdown();
  }

  py::dict status() {
    std::lock_guard lock(wire_mu_);
    const node_status s = learner_->status();
    py::dict d;
    d["index"] = index_;
    d["incarnation"] = inc_.value;
    d["steps"] = s.counts.steps;
    d["tokens"] = s.counts.tokens;
    d["contributions"] = s.counts.contributions;
    d["non_finite"] = learner_->non_finite();
    d["wait_s"] = static_cast<double>(s.counts.wait_ns) * 1e-9;
    d["ready"] = stepping_;
    d["refused"] = refused_;
    d["refusal"] = s.refusal;
    d["inbox_dropped"] = inbox_dropped_;
    d["schedule_step"] = schedule_step_;
    d["endpoint"] = wire_ ? wire_->endpoint() : std::string();
    d["metrics_port"] = metrics_ ? metrics_->port() : -1;
    std::vector<std::uint64_t> versions;
    for (std::uint32_t p = 0; p < setup_.fragments(); ++p) versions.push_back(learner_->core().version({p}));
    d["versions"] = versions;
    return d;
  }

 private:
  struct event {
    std::shared_ptr<const transport::inbound_message> message;  // null: a peer event
    node_address peer;
    bool alive = false;
  };
  static constexpr std::size_t inbox_capacity = 4096;
  static constexpr std::uint64_t not_copied = std::numeric_limits<std::uint64_t>::max();

  static log_options log_options_for(const std::string& level) {
    log_options o;
    if (auto l = parse_log_level(level); l) o.level = *l;
    return o;
  }

  /// The transport's I/O thread: queue (bounded; beyond it the event is dropped and
  /// counted: the wire's join and wait timers fetch again what went missing).
  void push(event e) {
    {
      std::lock_guard lock(inbox_mu_);
      if (inbox_.size() >= inbox_capacity) {
        ++inbox_dropped_;
        return;
      }
      inbox_.push_back(std::move(e));
    }
    inbox_cv_.notify_one();
  }

  /// Handles queued events and due timers; blocks for the first event until `deadline`.
  void pump(nanos deadline) {
    std::deque<event> batch;
    {
      std::unique_lock lock(inbox_mu_);
      const nanos wait = std::min(deadline, next_timer()) - clock_.now();
      if (inbox_.empty() && wait > 0) inbox_cv_.wait_for(lock, std::chrono::nanoseconds(wait));
      batch.swap(inbox_);
    }
    std::lock_guard lock(wire_mu_);
    for (auto& e : batch) {
      if (!e.message) {
        if (learner_->on_peer(e.peer, e.alive) && rejoin_timer_ns_ < 0) rejoin_timer_ns_ = clock_.now() + retry_ns_;
        continue;
      }
      const learner_event r = learner_->on_message(*e.message->envelope, clock_.now());
      if (r.refused) refused_ = true;
      if (r.schedule_step) schedule_step_ = *r.schedule_step;
      if (r.start_stepping) stepping_ = true;
    }
    const nanos now = clock_.now();
    if (join_timer_ns_ >= 0 && now >= join_timer_ns_)
      join_timer_ns_ = learner_->on_join_timer(now) ? now + retry_ns_ : -1;
    if (rejoin_timer_ns_ >= 0 && now >= rejoin_timer_ns_)
      rejoin_timer_ns_ = learner_->on_rejoin_timer() ? now + retry_ns_ : -1;
  }

  nanos next_timer() const {
    nanos t = std::numeric_limits<nanos>::max();
    if (join_timer_ns_ >= 0) t = std::min(t, join_timer_ns_);
    if (rejoin_timer_ns_ >= 0) t = std::min(t, rejoin_timer_ns_);
    return t;
  }

  void check_refused() {
    if (!wire_) throw std::runtime_error("this learner is closed");
    if (!refused_) return;
    std::string why;
    {
      std::lock_guard lock(wire_mu_);
      why = learner_->status().refusal;
    }
    throw std::runtime_error("the mesh refused this learner: " + why);
  }

  /// Copy mode: the user's arrays into the buffer (the wire reads it).
  void copy_in() {
    if (bound_.empty()) return;
    for (std::size_t i = 0; i < bound_.size(); ++i) {
      const tensor_spec& t = setup_.layout.tensors[i];
      std::memcpy(params_.data() + t.offset, bound_[i].data(), t.size() * sizeof(float));
    }
  }

  /// Copy mode: the fragments whose version changed back into the user's arrays.
  void copy_out(bool all = false) {
    std::lock_guard lock(wire_mu_);
    for (std::uint32_t p = 0; p < setup_.fragments(); ++p) {
      if (!learner_->core().installed({p})) continue;
      const std::uint64_t v = learner_->core().version({p});
      if (v == versions_[p] && !all) continue;
      versions_[p] = v;
      if (bound_.empty()) continue;
      for (std::size_t i : setup_.plan.fragments[p].tensors) {
        const tensor_spec& t = setup_.layout.tensors[i];
        std::memcpy(bound_[i].mutable_data(), params_.data() + t.offset, t.size() * sizeof(float));
      }
    }
  }

  std::string metrics_text() {
    prometheus_text page;
    std::lock_guard lock(wire_mu_);
    if (!wire_) return page.str();
    const node_address me{role::learner, index_};
    add_node_metrics(page, me, inc_, clock_.now() - started_ns_, wire_->counters(), &log_);
    learner_->add_metrics(page);
    return page.str();
  }

  void shut_down(const std::string& reason = "closed") {
    metrics_.reset();
    std::lock_guard lock(wire_mu_);
    if (!wire_) return;
    if (!learner_->done() && !refused_) learner_->leave(reason);
    wire_.reset();  // drains the control lanes (transport_config::stop_drain_ns), then stops
  }

  steady_clock_source clock_;
  logger log_;
  mesh_setup setup_;
  std::uint32_t index_ = 0;
  incarnation inc_{1};
  std::vector<float> params_;
  std::vector<std::uint64_t> versions_;  // per fragment, as last copied out
  std::vector<py::array_t<float>> bound_;  // copy mode: the user's arrays, in layout order
  std::mutex wire_mu_;  // the wire layer: the caller's thread and the metrics server's
  std::mutex inbox_mu_;
  std::condition_variable inbox_cv_;
  std::deque<event> inbox_;
  std::uint64_t inbox_dropped_ = 0;
  bool stepping_ = false, refused_ = false;
  std::int64_t schedule_step_ = 0;
  nanos started_ns_ = 0, last_step_end_ns_ = 0, retry_ns_ = 0;
  nanos join_timer_ns_ = -1, rejoin_timer_ns_ = -1;
  // Last, so that they go first: the transport's I/O thread and the metrics server
  // call into the members above.
  std::unique_ptr<transport::node_transport> wire_;
  std::unique_ptr<learner_wire> learner_;
  std::unique_ptr<metrics_server> metrics_;
};

/// A learner's share of the mesh's data: the same split and sampler a native learner uses.
class py_data_shard {
 public:
  py_data_shard(const std::string& config_path, std::vector<std::string> overrides, int index,
                std::uint64_t incarnation)
      : cfg_(load_config(config_path, overrides)) {
    const model_shape shape = *resolve_model(cfg_.model);
    if (index < 0 || index >= cfg_.mesh.learners)
      raise(make_error(errc::invalid_input, "index " + std::to_string(index) + ": mesh.learners is " +
                                                std::to_string(cfg_.mesh.learners)));
    auto data = load_dataset(cfg_.data, cfg_.mesh.learners, shape.context, cfg_.train.seed);
    if (!data) raise(data.err());
    data_ = std::make_unique<dataset>(std::move(*data));
    context_ = shape.context;
    // As the native learner's engine: its seed per learner and incarnation, its sampler's stream.
    const std::uint64_t seed = derive_seed(derive_seed(cfg_.train.seed, 1000 + static_cast<std::uint64_t>(index)), incarnation);
    sampler_ = std::make_unique<batch_sampler>(data_->text, data_->split.shards.at(index), context_,
                                               derive_seed(seed, 100 + static_cast<std::uint64_t>(index)));
  }

  /// (inputs, targets): int64 arrays [batch, context] of byte values.
  py::tuple next(int batch) {
    if (batch < 1) throw py::value_error("batch must be >= 1");
    std::vector<std::int32_t> in(static_cast<std::size_t>(batch) * context_), out(in.size());
    sampler_->next(batch, in.data(), out.data());
    py::array_t<std::int64_t> a({batch, context_}), b({batch, context_});
    std::copy(in.begin(), in.end(), a.mutable_data());
    std::copy(out.begin(), out.end(), b.mutable_data());
    return py::make_tuple(a, b);
  }

  /// Held-out windows of the mesh's split, for evaluation: (inputs, targets) of up to `windows` rows.
  py::tuple heldout(int windows) {
    std::vector<std::int64_t> in, out;
    int rows = 0;
    for (const auto& r : data_->split.heldout) {
      for (std::size_t s = r.begin; s + context_ + 1 <= r.end && rows < windows; s += context_, ++rows)
        for (int k = 0; k < context_; ++k) {
          in.push_back(data_->text.data()[s + k]);
          out.push_back(data_->text.data()[s + k + 1]);
        }
    }
    py::array_t<std::int64_t> a({rows, context_}), b({rows, context_});
    std::copy(in.begin(), in.end(), a.mutable_data());
    std::copy(out.begin(), out.end(), b.mutable_data());
    return py::make_tuple(a, b);
  }

  int context() const { return context_; }

 private:
  config cfg_;
  std::unique_ptr<dataset> data_;
  std::unique_ptr<batch_sampler> sampler_;
  int context_ = 0;
};

/// What a native learner `index` of this mesh trains with: its AdamW and schedule
/// (optimizer.*), its batch, threads and slow-down (mesh.learner_batch / learner_threads /
/// learner_slowdown or data.batch, train.threads / mesh.learners), the step budget,
/// its pace (mesh.step_time_ms), context and heads.
py::dict training_of(const std::string& config_path, const std::vector<std::string>& overrides, int index) {
  const config cfg = load_config(config_path, overrides);
  if (index < 0 || index >= cfg.mesh.learners)
    raise(make_error(errc::invalid_input, "index " + std::to_string(index) + ": mesh.learners is " +
                                              std::to_string(cfg.mesh.learners)));
  const learner_profile p = learner_profile_of(cfg, index);
  const optimizer_config& o = cfg.optimizer;
  py::dict d;
  d["lr"] = o.lr;
  d["min_lr_ratio"] = o.min_lr_ratio;
  d["warmup_steps"] = o.warmup_steps;
  d["weight_decay"] = o.weight_decay;
  d["beta1"] = o.beta1;
  d["beta2"] = o.beta2;
  d["eps"] = o.eps;
  d["clip_norm"] = o.clip_norm;
  d["steps"] = cfg.train.steps;
  d["batch"] = p.batch;
  d["threads"] = p.threads;
  d["step_time_ms"] = cfg.mesh.step_time_ms;
  d["slowdown"] = p.slowdown;
  const auto shape = resolve_model(cfg.model);
  if (!shape) raise(shape.err());
  d["context"] = shape->context;
  d["n_head"] = shape->n_head;
  return d;
}

/// The held-out windows a native evaluation scores (engine::evaluate, `replay eval`):
/// (inputs, targets) int64 [windows, context] and first_scored int32 [windows]; a
/// window scores positions first_scored.. only (the earlier ones were scored before).
py::tuple eval_windows_of(const std::string& config_path, const std::vector<std::string>& overrides) {
  const config cfg = load_config(config_path, overrides);
  const auto shape = resolve_model(cfg.model);
  if (!shape) raise(shape.err());
  const int t = shape->context;
  auto data = load_dataset(cfg.data, 1, t, cfg.train.seed);  // as replay's evaluate_params
  if (!data) raise(data.err());
  const auto windows = make_eval_windows(data->split.heldout, t, cfg.data.eval_tokens);
  const auto rows = static_cast<py::ssize_t>(windows.size());
  py::array_t<std::int64_t> in({rows, static_cast<py::ssize_t>(t)}), out({rows, static_cast<py::ssize_t>(t)});
  py::array_t<std::int32_t> first(rows);
  const std::uint8_t* bytes = data->text.data();
  for (py::ssize_t w = 0; w < rows; ++w) {
    for (int k = 0; k < t; ++k) {
      in.mutable_data()[w * t + k] = bytes[windows[w].offset + k];
      out.mutable_data()[w * t + k] = bytes[windows[w].offset + k + 1];
    }
    first.mutable_data()[w] = windows[w].first_scored;
  }
  return py::make_tuple(in, out, first);
}

/// The GPT's shape; a layout file's mesh (model.layout) has no native model.
expected<model_shape> native_gpt_shape(const config& cfg) {
  if (!cfg.model.layout.empty()) throw py::value_error("model.layout is set: the native GPT has no such layout");
  auto shape = resolve_model(cfg.model);
  if (!shape) raise(shape.err());
  return shape;
}

/// {name: array} of the layout's tensors into the model's parameters.
void copy_params(const py::dict& params, gpt<float>& model) {
  for (const auto& t : model.layout().tensors) {
    if (!params.contains(py::str(t.name))) throw py::value_error("no array for '" + t.name + "'");
    auto a = py::array_t<float, py::array::c_style | py::array::forcecast>::ensure(params[py::str(t.name)]);
    if (!a || static_cast<std::size_t>(a.size()) != t.size()) throw py::value_error("'" + t.name + "' has the wrong size");
    std::copy(a.data(), a.data() + a.size(), model.params() + t.offset);
  }
}

/// `count` tokens as the model takes them; each must be a byte.
std::vector<std::int32_t> tokens_of(const std::int64_t* data, std::size_t count) {
  for (std::size_t i = 0; i < count; ++i)
    if (data[i] < 0 || data[i] > 255) throw py::value_error("tokens must be bytes (0..255), got " + std::to_string(data[i]));
  return {data, data + count};
}

/// {name: a copy of the tensor} of a buffer laid out by `layout`.
py::dict tensors_of(const param_layout& layout, const float* buffer) {
  py::dict out;
  for (const auto& t : layout.tensors) {
    const auto dims = dims_of(t);
    py::array_t<float> a(std::vector<py::ssize_t>(dims.begin(), dims.end()));
    std::copy(buffer + t.offset, buffer + t.offset + t.size(), a.mutable_data());
    out[py::str(t.name)] = a;
  }
  return out;
}

/// The native GPT's loss and gradients at `params` ({name: float32 array} of the layout)
/// on one batch (int64 [batch, context] inputs and targets): to check a port of the GPT.
py::tuple gpt_loss_and_gradients(const std::string& config_path, const std::vector<std::string>& overrides,
                                 const py::dict& params, const py::array_t<std::int64_t>& inputs,
                                 const py::array_t<std::int64_t>& targets) {
  const config cfg = load_config(config_path, overrides);
  const auto shape = native_gpt_shape(cfg);
  if (inputs.ndim() != 2 || inputs.shape(1) != shape->context || targets.size() != inputs.size())
    throw py::value_error("inputs and targets must be [batch, " + std::to_string(shape->context) + "]");
  set_compute_threads(1);
  gpt<float> model(make_layout(*shape));
  copy_params(params, model);
  const auto in = tokens_of(inputs.data(), inputs.size()), out = tokens_of(targets.data(), targets.size());
  const double loss = model.forward_backward(in.data(), out.data(), static_cast<int>(inputs.shape(0)));
  return py::make_tuple(loss, tensors_of(model.layout(), model.grads()));
}

/// The native learner's inner steps from `params` on the batches inputs[k] / targets[k]
/// (int64 [steps, batch, context]), starting at schedule step `first_step`: forward,
/// backward, the inner optimizer at the scheduled rate (engine::step). Returns (losses, parameters after).
py::tuple gpt_train_steps(const std::string& config_path, const std::vector<std::string>& overrides,
                          const py::dict& params, const py::array_t<std::int64_t>& inputs,
                          const py::array_t<std::int64_t>& targets, std::int64_t first_step) {
  const config cfg = load_config(config_path, overrides);
  const auto shape = native_gpt_shape(cfg);
  if (inputs.ndim() != 3 || inputs.shape(2) != shape->context || targets.size() != inputs.size())
    throw py::value_error("inputs and targets must be [steps, batch, " + std::to_string(shape->context) + "]");
  set_compute_threads(1);
  gpt<float> model(make_layout(*shape));
  inner_optimizer optimizer(model.layout(), cfg.optimizer, onednn_gemm());
  copy_params(params, model);
  const auto per_step = static_cast<std::size_t>(inputs.shape(1) * inputs.shape(2));
  std::vector<double> losses;
  for (py::ssize_t k = 0; k < inputs.shape(0); ++k) {
    const auto in = tokens_of(inputs.data() + k * per_step, per_step);
    const auto out = tokens_of(targets.data() + k * per_step, per_step);
    losses.push_back(model.forward_backward(in.data(), out.data(), static_cast<int>(inputs.shape(1))));
    optimizer.step(model.params(), model.grads(), scheduled_lr(cfg.optimizer, first_step + k, cfg.train.steps));
  }
  return py::make_tuple(losses, tensors_of(model.layout(), model.params()));
}

}  // namespace
}  // namespace archipelago

PYBIND11_MODULE(_native, m) {
  using namespace archipelago;
  m.doc() = "archipelago's learner shell for a model of your own (see the package's __init__)";
  py::class_<py_learner>(m, "NativeLearner")
      .def(py::init<const std::string&, std::vector<std::string>, std::uint32_t, std::string, std::vector<std::string>,
                    std::string, std::uint32_t, int, std::string>(),
           py::arg("config"), py::arg("overrides"), py::arg("index"), py::arg("broker"), py::arg("shards"),
           py::arg("listen"), py::arg("tokens_per_step"), py::arg("metrics_port"), py::arg("log_level"))
      .def("wait_ready", &py_learner::wait_ready, py::arg("timeout_s"))
      .def("after_step", &py_learner::after_step, py::arg("tokens"), py::arg("step_s") = -1.0)
      .def("poll", &py_learner::poll)
      .def("close", &py_learner::close, py::arg("reason") = "closed", py::arg("flush") = true)
      .def("bind", &py_learner::bind, py::arg("arrays"))
      .def("array", [](py::object self, const std::string& name) { return self.cast<py_learner&>().array(self, name); })
      .def("names", &py_learner::names)
      .def("node_json", &py_learner::node_json)
      .def("status", &py_learner::status)
      .def("slowdown", &py_learner::slowdown);
  py::class_<py_data_shard>(m, "DataShard")
      .def(py::init<const std::string&, std::vector<std::string>, int, std::uint64_t>(), py::arg("config"),
           py::arg("overrides"), py::arg("index"), py::arg("incarnation"))
      .def("next", &py_data_shard::next, py::arg("batch"))
      .def("heldout", &py_data_shard::heldout, py::arg("windows"))
      .def_property_readonly("context", &py_data_shard::context);
  m.def("layout_json", [](const std::string& config_path, std::vector<std::string> overrides) {
    auto layout = resolve_layout(load_config(config_path, overrides));
    if (!layout) raise(layout.err());
    return layout_json(*layout);
  }, py::arg("config"), py::arg("overrides"));
  m.def("training", &training_of, py::arg("config"), py::arg("overrides"), py::arg("index"));
  m.def("eval_windows", &eval_windows_of, py::arg("config"), py::arg("overrides"));
  m.def("gpt_loss_and_gradients", &gpt_loss_and_gradients, py::arg("config"), py::arg("overrides"), py::arg("params"),
        py::arg("inputs"), py::arg("targets"));
  m.def("gpt_train_steps", &gpt_train_steps, py::arg("config"), py::arg("overrides"), py::arg("params"),
        py::arg("inputs"), py::arg("targets"), py::arg("first_step"));
  m.def("check_layout_json", [](const std::string& text) {
    auto layout = parse_layout_json(text, "layout");
    if (!layout) raise(layout.err());
    return layout->fingerprint();
  }, py::arg("text"));
}
