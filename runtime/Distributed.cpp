// Data-parallel training on c10d: the rendezvous, the Gloo (or NCCL) group, bucketed gradient
// averaging and the small agreements the training loop needs (Distributed.h).
#include "runtime/Distributed.h"

#include <errno.h>  // program_invocation_short_name

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <map>
#include <mutex>
#include <thread>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <c10/util/Logging.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#if APE_HAVE_C10D_GLOO
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#endif
#include <torch/csrc/distributed/c10d/Backend.hpp>

#include "runtime/CudaAttention.h"
#include "runtime/Util.h"
#include "runtime/Options.h"

namespace ape {

#if APE_HAVE_C10D_NCCL
// DistributedNccl.cpp: c10d::ProcessGroupNCCL on GPU `device` (its own file: the NCCL header
// pulls in CUDA's).
c10::intrusive_ptr<c10d::Backend> make_nccl_backend(const c10::intrusive_ptr<c10d::Store> &store, int rank,
                                                   int world, std::chrono::milliseconds timeout, int device);
bool nccl_device_present(int device);
#endif

// ---- configuration ---------------------------------------------------------------------------------

void DistConfig::validate() const {
  // The settings first, distributed or not: a bad value is a mistake either way.
  require_in("--master-port", master_port, 1, 65535);
  if (master_addr.empty()) throw std::invalid_argument("--master-addr must name a host (e.g. 127.0.0.1)");
  if (backend != "auto" && backend != "gloo" && backend != "nccl")
    throw std::invalid_argument("--dist-backend must be auto, gloo or nccl; got '" + backend + "'");
  require_in("--dist-timeout", timeout_s, 0.0, 1e6, /*open_low=*/true);
  require_in("bucket_bytes", bucket_bytes, 1, int64_t(1) << 40);
  if (local_rank != -1) require_in("--local-rank", local_rank, 0, 1 << 20);
  if (!enabled()) return;
  require_in("--world-size", world_size, 1, 1 << 20);
  require_in("--rank", rank, 0, world_size - 1);
}

namespace {
int64_t env_int(const char *name, int64_t lo, int64_t hi) {
  const char *v = std::getenv(name);
  std::string s = v ? v : "";
  size_t used = 0;
  long long x = 0;
  try {
    x = std::stoll(s, &used);
  } catch (const std::exception &) {
    used = 0;
  }
  if (s.empty() || used != s.size() || x < lo || x > hi)
    throw std::invalid_argument(std::string("environment variable ") + name + "='" + s +
                                "' must be a whole number in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
  return x;
}
}  // namespace

DistConfig DistConfig::from_env(DistConfig base) {
  if (!std::getenv("RANK") || !std::getenv("WORLD_SIZE")) return base;
  base.world_size = env_int("WORLD_SIZE", 1, 1 << 20);
  base.rank = env_int("RANK", 0, base.world_size - 1);
  if (std::getenv("LOCAL_RANK")) base.local_rank = env_int("LOCAL_RANK", 0, 1 << 20);
  if (const char *a = std::getenv("MASTER_ADDR")) base.master_addr = a;
  if (std::getenv("MASTER_PORT")) base.master_port = env_int("MASTER_PORT", 1, 65535);
  return base;
}

std::string backend_unavailable(const std::string &backend) {
  if (backend == "gloo") {
#if APE_HAVE_C10D_GLOO
    return "";
#else
    return "this build has no Gloo backend: LibTorch's c10d Gloo header needs Gloo's headers, which the "
           "PyPI wheel does not ship (install libgloo-dev and reconfigure; docs/distributed.md)";
#endif
  }
  if (backend == "nccl") {
#if APE_HAVE_C10D_NCCL
    return "";
#else
    return "this build has no NCCL backend (it needs a CUDA LibTorch and NCCL's headers at configure time)";
#endif
  }
  return "unknown backend '" + backend + "' (auto, gloo or nccl)";
}

uint64_t fingerprint(const std::vector<at::Tensor> &tensors, uint64_t h) {
  for (const auto &t0 : tensors) {
    if (!t0.defined()) {
      h = fnv1a("-", 1, h);
      continue;
    }
    at::Tensor t = t0.detach().cpu().contiguous();
    for (int64_t s : t.sizes()) h = fnv1a(&s, sizeof s, h);
    h = fnv1a(t.data_ptr(), t.nbytes(), h);
  }
  return h;
}

// ---- the group --------------------------------------------------------------------------------------

struct DataParallel::Impl {
  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<c10d::Backend> pg;
  at::Device device{at::kCPU};  // where collectives run (a GPU for NCCL: buffers are staged there)
};

namespace {
// The first line of a c10d error, without LibTorch's C++ backtrace.
std::string reason(const std::exception &e) {
  std::string s;
  if (const auto *c = dynamic_cast<const c10::Error *>(&e)) s = c->what_without_backtrace();
  else s = e.what();
  if (auto nl = s.find('\n'); nl != std::string::npos) s.resize(nl);
  // Gloo's "[/path/to/pair.cc:545] Read error ...: Connection reset by peer. This is typically ...":
  // the reason without the source location and the generic advice.
  if (s.rfind("[", 0) == 0)
    if (auto close = s.find("] "); close != std::string::npos && s.find(".cc:") < close) s.erase(0, close + 2);
  if (auto advice = s.find(" This is typically caused"); advice != std::string::npos) s.resize(advice);
  while (!s.empty() && (s.back() == '.' || s.back() == ' ')) s.pop_back();
  return s;
}

bool loopback(const std::string &host) {
  return host == "localhost" || host.rfind("127.", 0) == 0 || host == "::1";
}

std::chrono::milliseconds millis(double s) { return std::chrono::milliseconds(int64_t(s * 1000.0 + 0.5)); }

std::string seconds_text(double s) {
  char t[32];
  std::snprintf(t, sizeof t, "%g", s);
  return t;
}

// Throws GroupError for a failed collective, naming the rank, what it was doing and the likely cause.
[[noreturn]] void group_failed(const std::string &who, const std::string &what, const std::exception &e,
                               double timeout_s) {
  throw GroupError(who + "the data-parallel group failed during " + what + ": " + reason(e) +
                   ". Another rank has stopped (see its own error) or cannot be reached; a silent rank is given up "
                   "after --dist-timeout " + seconds_text(timeout_s) + " s");
}
}  // namespace

DataParallel::~DataParallel() = default;

std::string DataParallel::who() const {
  return "[rank " + std::to_string(cfg_.rank) + " of " + std::to_string(cfg_.world_size) + "] ";
}

namespace {
// The rendezvous store. Under torchrun the agent already serves one at MASTER_ADDR:MASTER_PORT and
// says so (as torch.distributed's env:// does, every rank is then a client, and the keys live in a
// namespace of the attempt: an elastic restart finds the last attempt's keys there); otherwise rank
// 0 hosts it. The host does not wait for the others here: the roll call does.
struct Rendezvous {
  c10::intrusive_ptr<c10d::Store> store;
  bool agent_store = false, hosts = false;
};
// Ends the process (status 1, with `message` unless it is empty) unless disarmed (destroyed) within
// `after`: for a call that can block past its own timeout (a TCPStore client connected to a
// listener that is not a store never hears back). Nothing is written before the group forms, and
// the caller flushes its log lines first, so exiting loses nothing.
class Watchdog {
 public:
  Watchdog(std::chrono::milliseconds after, std::string message)
      : message_(std::move(message)), thread_([this, after] {
          std::unique_lock<std::mutex> lock(mutex_);
          if (!cv_.wait_for(lock, after, [this] { return done_; })) {
            if (!message_.empty()) std::cerr << program_invocation_short_name << ": error: " << message_ << std::endl;
            std::_Exit(1);
          }
        }) {}
  ~Watchdog() {
    {
      const std::lock_guard<std::mutex> lock(mutex_);
      done_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  Watchdog(const Watchdog &) = delete;
  Watchdog &operator=(const Watchdog &) = delete;

 private:
  std::string message_;
  std::mutex mutex_;
  std::condition_variable cv_;
  bool done_ = false;
  std::thread thread_;  // last: it reads the members above
};

// `quiet`: the watchdog ends the process without a message of its own (a refusing rank has said
// why already).
Rendezvous rendezvous(const DistConfig &cfg, std::chrono::milliseconds timeout, const std::string &who,
                      bool quiet = false) {
  Rendezvous r;
  const char *agent = std::getenv("TORCHELASTIC_USE_AGENT_STORE");
  const char *env_addr = std::getenv("MASTER_ADDR");
  const char *env_port = std::getenv("MASTER_PORT");
  r.agent_store = agent && std::string(agent) == "True" && env_addr && env_port &&
                  cfg.master_addr == env_addr && std::to_string(cfg.master_port) == env_port;
  c10d::TCPStoreOptions so;
  so.port = static_cast<uint16_t>(cfg.master_port);
  so.isServer = r.hosts = cfg.rank == 0 && !r.agent_store;
  so.numWorkers = static_cast<size_t>(cfg.world_size);
  so.waitWorkers = false;
  so.timeout = timeout;
  so.multiTenant = true;
  std::string space = "ape";
  if (const char *restart = std::getenv("TORCHELASTIC_RESTART_COUNT"); r.agent_store && restart && *restart)
    space += "/attempt_" + std::string(restart);
  const std::string where = cfg.master_addr + ":" + std::to_string(cfg.master_port);
  std::cout << std::flush;  // the watchdog's exit must not lose a line
  try {
    // c10d retries a refused connection for up to about twice its timeout (its own error comes
    // then); the watchdog waits longer still.
    const auto bound = 2 * timeout + std::chrono::seconds(30);
    const Watchdog watchdog(
        bound, quiet ? std::string()
                     : who + "rendezvous at " + where + ": no store answered within " +
                           seconds_text(std::chrono::duration<double>(bound).count()) +
                           " s (is rank 0 running with this --master-addr/--master-port, and no other program "
                           "listening there?)");
    auto tcp = c10::make_intrusive<c10d::TCPStore>(cfg.master_addr, so);
    r.store = c10::make_intrusive<c10d::PrefixStore>(space, tcp);
  } catch (const std::exception &e) {
    throw GroupError(who + "rendezvous at " + where + " failed: " + reason(e) +
                     (so.isServer ? (reason(e).find("ADDRINUSE") != std::string::npos ||
                                             reason(e).find("in use") != std::string::npos
                                         ? " (is another run using this --master-port?)"
                                         : " (rank 0 hosts the store: is --master-addr " + cfg.master_addr +
                                               " an address of this machine? Is another run using this "
                                               "--master-port?)")
                                  : " (is rank 0 running, and are --master-addr/--master-port the same on every rank?)"));
  }
  return r;
}

std::string roll_key(int64_t rank) { return "roll/" + std::to_string(rank); }
// How many ranks have posted under roll/: what a rank waiting for the roll polls.
const char *const kPostsKey = "roll/posts";
void count_post(c10d::Store &store) {
  try {
    store.add(kPostsKey, 1);
  } catch (const std::exception &) {
    // The post itself is there; a rank that misses the count reads it at the deadline's last look.
  }
}
std::string seen_key(int64_t rank) { return "seen/" + std::to_string(rank); }
std::vector<uint8_t> bytes(const std::string &s) { return std::vector<uint8_t>(s.begin(), s.end()); }

// How long the host of the store (rank 0 outside torchrun) keeps it up after a failed roll call
// (its own refusal included), at most: until every other rank has read the roll (seen/R), so that
// a rank reading a failure hears of it rather than of a lost connection. A rank started later waits
// out --dist-timeout as it would have.
constexpr double kLingerSeconds = 5.0;

// Waits (at most `linger`) for seen/1 .. seen/(ranks - 1).
void linger(c10d::Store &store, int64_t ranks, std::chrono::milliseconds linger) {
  const auto until = std::chrono::steady_clock::now() + linger;
  for (int64_t r = 1; r < ranks; ++r) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - std::chrono::steady_clock::now());
    if (left.count() <= 0) return;
    try {
      store.wait({seen_key(r)}, left);
    } catch (const std::exception &) {
      return;
    }
  }
}

// The roll call: rank R posts "ok WORLD", or "refused REASON" when `refusal` says why it will not
// join, under roll/R; then reads the other ranks' posts as they come (polling the store, so that a
// refusal is heard while an earlier rank is still missing; up to --dist-timeout in all), then posts
// seen/R. Throws GroupError for its own refusal, another rank's, another --world-size, or a rank
// that has not come by the deadline.
void roll_call(c10d::Store &store, const DistConfig &cfg, bool hosts, std::chrono::milliseconds timeout,
               const std::string &who, const std::string &refusal = "") {
  const auto say = [&](const std::string &key, const std::string &value) {
    try {
      store.set(key, bytes(value));
    } catch (const std::exception &e) {
      throw GroupError(who + "the rendezvous store failed: " + reason(e));
    }
  };
  const auto window = std::min(timeout, millis(kLingerSeconds));
  if (!refusal.empty()) {
    std::string text = refusal;
    for (char &c : text)
      if (c == '\n') c = ' ';
    say(roll_key(cfg.rank), "refused " + text);
    count_post(store);
    say(seen_key(cfg.rank), "1");
    if (hosts) linger(store, cfg.world_size, window);
    throw GroupError(who + refusal);
  }
  say(roll_key(cfg.rank), "ok " + std::to_string(cfg.world_size));
  count_post(store);
  std::string problem;
  int64_t ranks = cfg.world_size;  // the most any rank said: the host waits for all of them to read
  const auto deadline = std::chrono::steady_clock::now() + timeout;  // for all the reads together
  std::vector<int64_t> pending;
  for (int64_t r = 0; r < cfg.world_size; ++r)
    if (r != cfg.rank) pending.push_back(r);
  auto pause = std::chrono::milliseconds(2);
  int64_t posts_seen = -1;  // the count of posts when the pending ranks were last looked for
  bool last_look = false;
  while (!pending.empty() && problem.empty()) {
    // One request a round while nothing new was posted; the pending ranks' keys only when it was
    // (a request per rank and round would be world^2 requests to the one store).
    int64_t posts = 0;
    try {
      posts = store.add(kPostsKey, 0);
    } catch (const std::exception &e) {
      throw GroupError(who + "the rendezvous store failed while the roll was read: " + reason(e));
    }
    for (auto it = pending.begin(); posts != posts_seen && it != pending.end() && problem.empty();) {
      const int64_t r = *it;
      std::string post;
      try {
        if (!store.check({roll_key(r)})) {
          ++it;
          continue;
        }
        const std::vector<uint8_t> v = store.get(roll_key(r));
        post.assign(v.begin(), v.end());
      } catch (const std::exception &e) {
        throw GroupError(who + "the rendezvous store failed while rank " + std::to_string(r) +
                         "'s answer was read: " + reason(e));
      }
      it = pending.erase(it);
      if (post.rfind("refused ", 0) == 0) {
        problem = "rank " + std::to_string(r) + " refused to start: " + post.substr(8);
      } else if (post != "ok " + std::to_string(cfg.world_size)) {
        problem = "--world-size is " + std::to_string(cfg.world_size) + " here and " +
                  (post.rfind("ok ", 0) == 0 ? post.substr(3) : "'" + post + "'") + " on rank " + std::to_string(r) +
                  ": every rank needs the same --world-size (and WORLD_SIZE under torchrun)";
        if (post.rfind("ok ", 0) == 0) ranks = std::max<int64_t>(ranks, std::atoll(post.c_str() + 3));
      }
    }
    posts_seen = posts;
    if (pending.empty() || !problem.empty()) break;
    if (std::chrono::steady_clock::now() >= deadline && !last_look) {
      last_look = true;  // every pending key once more, whatever the count says
      posts_seen = -1;
      continue;
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      std::string missing;
      for (size_t i = 0; i < pending.size() && i < 8; ++i)
        missing += (i == 0 ? "" : ", ") + std::to_string(pending[i]);
      if (pending.size() > 8) missing += " and " + std::to_string(pending.size() - 8) + " more";
      throw GroupError(who + (pending.size() == 1 ? "rank " : "ranks ") + missing + " did not join within --dist-timeout (" +
                       seconds_text(std::chrono::duration<double>(timeout).count()) +
                       " s; are they running, with the same --master-addr/--master-port and --world-size?)");
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::milliseconds(100));
  }
  try {
    store.set(seen_key(cfg.rank), bytes("1"));
  } catch (const std::exception &) {
  }
  if (problem.empty()) return;
  if (hosts) linger(store, std::min<int64_t>(ranks, 1 << 20), window);
  throw GroupError(who + problem);
}
}  // namespace

void DataParallel::refuse_to_join(const DistConfig &cfg, const std::string &why) {
  if (!cfg.enabled() || cfg.world_size < 2) return;
  // Quietly: c10d's messages of each connection retry (with their stack traces) would bury the
  // error this rank printed (the post is best effort: its own failures are not worth a line).
  struct Quiet {
    int was = FLAGS_caffe2_log_level;
    Quiet() { FLAGS_caffe2_log_level = std::max(was, 3); }
    ~Quiet() { FLAGS_caffe2_log_level = was; }
  } quiet;
  try {
    cfg.validate();
    const auto window = millis(std::min(kLingerSeconds, cfg.timeout_s));
    const Rendezvous r = rendezvous(cfg, window, "", /*quiet=*/true);
    roll_call(*r.store, cfg, r.hosts, window, "", why);
  } catch (const std::exception &) {
    // Best effort (the GroupError of its own refusal included): the others wait for this rank as
    // they would have.
  }
}

std::unique_ptr<DataParallel> DataParallel::join(const DistConfig &cfg, std::ostream *log) {
  cfg.validate();
  if (!cfg.enabled()) throw std::invalid_argument("DataParallel::join: not a distributed configuration");
  std::unique_ptr<DataParallel> dp(new DataParallel());
  dp->cfg_ = cfg;
  dp->impl_ = std::make_unique<Impl>();
  dp->backend_ = cfg.backend == "auto" ? "gloo" : cfg.backend;
  const std::string who = dp->who();
  const auto timeout = millis(cfg.timeout_s);
  const std::string where = cfg.master_addr + ":" + std::to_string(cfg.master_port);
  // What this rank lacks for the group: said at the roll call, so that the others stop too.
  std::string refusal;
  if (std::string why = backend_unavailable(dp->backend_); !why.empty())
    refusal = "--dist-backend " + dp->backend_ + ": " + why;
#if APE_HAVE_C10D_NCCL
  const int device = int(cfg.gpu >= 0 ? cfg.gpu : cfg.local_rank >= 0 ? cfg.local_rank : cfg.rank);
  if (refusal.empty() && dp->backend_ == "nccl" && !nccl_device_present(device))
    refusal = "--dist-backend nccl needs GPU " + std::to_string(device) +
              (cfg.gpu >= 0 ? std::string(" (--device)") : std::string(" (LOCAL_RANK / --local-rank)")) +
              " and none answers; use --dist-backend gloo";
#endif
  const Rendezvous rv = rendezvous(cfg, timeout, who);
  const bool agent_store = rv.agent_store;
  dp->impl_->store = rv.store;
  roll_call(*rv.store, cfg, rv.hosts, timeout, who, refusal);

  try {
    if (dp->backend_ == "gloo") {
#if APE_HAVE_C10D_GLOO
      auto opts = c10d::ProcessGroupGloo::Options::create(timeout);
      if (const char *ifname = std::getenv("GLOO_SOCKET_IFNAME"); ifname && *ifname)
        opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForInterface(ifname));
      else if (loopback(cfg.master_addr))
        opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
      else
        opts->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
      dp->impl_->pg = c10::make_intrusive<c10d::ProcessGroupGloo>(dp->impl_->store, int(cfg.rank),
                                                                  int(cfg.world_size), opts);
#endif
    } else {
#if APE_HAVE_C10D_NCCL
      dp->impl_->device = at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(device));
      dp->impl_->pg = make_nccl_backend(dp->impl_->store, int(cfg.rank), int(cfg.world_size), timeout, device);
#endif
    }
  } catch (const GroupError &) {
    throw;
  } catch (const std::exception &e) {
    throw GroupError(who + "forming the " + dp->backend_ + " group of " + std::to_string(cfg.world_size) +
                     " ranks via " + where + " failed: " + reason(e));
  }
  dp->barrier("joining the group");
  if (log && cfg.rank == 0)
    *log << "[dist] " << cfg.world_size << " ranks, backend " << dp->backend_ << ", rendezvous " << where
         << (agent_store ? " (torchrun's store)" : "") << ", timeout " << cfg.timeout_s << " s\n"
         << std::flush;
  return dp;
}

namespace {
// Runs `op` on `tensors` (CPU) where the group computes (staged to the GPU for NCCL, copied back:
// the host waits for the device on purpose, so $APE_CUDA_SYNC_DEBUG does not count it).
template <typename Op>
void run_collective(c10d::Backend &pg, const at::Device &device, std::vector<at::Tensor> &tensors, Op op) {
  const CudaSyncDebugScope waits_on_purpose(CudaSyncDebugScope::kOff);
  if (device.is_cpu()) {
    op(tensors)->wait();
    return;
  }
  std::vector<at::Tensor> staged;
  for (auto &t : tensors) staged.push_back(t.to(device));
  op(staged)->wait();
  for (size_t i = 0; i < tensors.size(); ++i) tensors[i].copy_(staged[i]);
}
}  // namespace

at::Tensor DataParallel::average_gradients(const std::vector<at::Tensor> &params, const at::Tensor &loss,
                                       int64_t step) {
  const std::string what = "the gradient all-reduce of step " + std::to_string(step);
  std::vector<at::Tensor> grads;
  for (const auto &p : params)
    if (p.grad().defined()) grads.push_back(p.grad());
  if (!layout_checked_) {  // the same parameters, shapes and gradients on every rank
    uint64_t h = 1469598103934665603ULL;
    for (const auto &p : params) {
      for (int64_t s : p.sizes()) h = fnv1a(&s, sizeof s, h);
      const char d = p.grad().defined() ? '1' : '0';
      h = fnv1a(&d, 1, h);
    }
    check_same(h, "the model's parameters (names, shapes, which have gradients)");
    layout_checked_ = true;
  }
  // Buckets of consecutive gradients of one dtype, at most bucket_bytes each (one gradient may
  // exceed it alone); the loss rides in the last bucket as one more element.
  std::vector<std::vector<size_t>> buckets;
  int64_t bytes = 0;
  for (size_t i = 0; i < grads.size(); ++i) {
    const int64_t n = static_cast<int64_t>(grads[i].nbytes());
    if (buckets.empty() || bytes + n > cfg_.bucket_bytes ||
        grads[buckets.back().front()].scalar_type() != grads[i].scalar_type()) {
      buckets.emplace_back();
      bytes = 0;
    }
    buckets.back().push_back(i);
    bytes += n;
  }
  std::vector<at::Tensor> flats;
  for (size_t b = 0; b < buckets.size(); ++b) {
    std::vector<at::Tensor> parts;
    for (size_t i : buckets[b]) parts.push_back(grads[i].reshape({-1}));
    if (b + 1 == buckets.size())
      parts.push_back(loss.detach().reshape({1}).to(grads[buckets[b].front()].options()));
    flats.push_back(at::cat(parts));
  }
  if (flats.empty()) flats.push_back(loss.detach().reshape({1}).to(at::kDouble));
  // Every bucket in flight at once, then wait for each (Gloo runs them on its worker threads).
  const auto t0 = std::chrono::steady_clock::now();
  try {
    c10d::AllreduceOptions opts;
    opts.reduceOp = c10d::ReduceOp::SUM;
    std::vector<std::vector<at::Tensor>> io(flats.size());
    std::vector<c10::intrusive_ptr<c10d::Work>> works;
    const bool cpu = impl_->device.is_cpu();
    for (size_t b = 0; b < flats.size(); ++b) {
      io[b] = {cpu ? flats[b] : flats[b].to(impl_->device)};
      works.push_back(impl_->pg->allreduce(io[b], opts));
    }
    for (size_t b = 0; b < flats.size(); ++b) {
      works[b]->wait();
      if (!io[b][0].is_same(flats[b])) flats[b].copy_(io[b][0]);  // staged to the group's device
    }
  } catch (const std::exception &e) {
    group_failed(who(), what, e, cfg_.timeout_s);
  }
  // Gradients on a GPU are reduced in place on NCCL's stream: the host waited for nothing to time.
  if (flats.front().device().is_cpu())
    reduce_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  else
    reduce_on_device_ = true;
  ++reduce_calls_;
  reduce_bytes_ = 0;
  for (const auto &f : flats) reduce_bytes_ += static_cast<int64_t>(f.nbytes());
  const double inv = 1.0 / double(cfg_.world_size);
  at::Tensor mean_loss;
  for (size_t b = 0; b < flats.size(); ++b) {
    at::Tensor &flat = flats[b];
    flat.mul_(inv);
    int64_t off = 0;
    if (b < buckets.size())
      for (size_t i : buckets[b]) {
        at::Tensor &g = grads[i];
        g.view({-1}).copy_(flat.narrow(0, off, g.numel()));
        off += g.numel();
      }
    if (b + 1 == flats.size()) mean_loss = flat[off];
  }
  return mean_loss;
}

void DataParallel::broadcast_from_root(const std::vector<at::Tensor> &tensors, const std::string &what) {
  at::NoGradGuard no_grad;
  // One flat buffer per dtype.
  std::map<at::ScalarType, std::vector<at::Tensor>> by_type;
  for (const auto &t : tensors)
    if (t.defined() && t.numel() > 0) by_type[t.scalar_type()].push_back(t);
  try {
    for (auto &[type, list] : by_type) {
      std::vector<at::Tensor> parts;
      for (const auto &t : list) parts.push_back(t.detach().reshape({-1}));
      std::vector<at::Tensor> io{at::cat(parts)};
      c10d::BroadcastOptions opts;
      opts.rootRank = 0;
      run_collective(*impl_->pg, impl_->device, io, [&](std::vector<at::Tensor> &v) { return impl_->pg->broadcast(v, opts); });
      int64_t off = 0;
      for (const auto &t : list) {
        t.detach().view({-1}).copy_(io[0].narrow(0, off, t.numel()));
        off += t.numel();
      }
    }
  } catch (const std::exception &e) {
    group_failed(who(), "broadcasting " + what, e, cfg_.timeout_s);
  }
}

std::pair<double, bool> DataParallel::agree(double seconds, bool stop, int64_t step) {
  std::vector<at::Tensor> io{at::tensor({seconds, stop ? 1.0 : 0.0}, at::kDouble)};
  try {
    c10d::AllreduceOptions opts;
    opts.reduceOp = c10d::ReduceOp::MAX;
    run_collective(*impl_->pg, impl_->device, io, [&](std::vector<at::Tensor> &v) { return impl_->pg->allreduce(v, opts); });
  } catch (const std::exception &e) {
    group_failed(who(), "the end of step " + std::to_string(step) + " (agreeing on the clock and stop requests)", e,
                 cfg_.timeout_s);
  }
  const double *v = io[0].data_ptr<double>();
  return {v[0], v[1] > 0};
}

void DataParallel::sum(std::vector<double> &values, const std::string &what) {
  if (values.empty()) return;
  std::vector<at::Tensor> io{at::tensor(values, at::kDouble)};
  try {
    c10d::AllreduceOptions opts;
    opts.reduceOp = c10d::ReduceOp::SUM;
    run_collective(*impl_->pg, impl_->device, io, [&](std::vector<at::Tensor> &v) { return impl_->pg->allreduce(v, opts); });
  } catch (const std::exception &e) {
    group_failed(who(), what, e, cfg_.timeout_s);
  }
  std::memcpy(values.data(), io[0].data_ptr<double>(), values.size() * sizeof(double));
}

void DataParallel::check_same(uint64_t fp, const std::string &what) {
  // max and -min of both 32-bit halves in one allreduce(MAX): equal everywhere iff max == min.
  const int64_t lo = int64_t(fp & 0xffffffffu), hi = int64_t(fp >> 32);
  std::vector<at::Tensor> io{at::tensor(std::vector<int64_t>{lo, hi, -lo, -hi}, at::kLong)};
  try {
    c10d::AllreduceOptions opts;
    opts.reduceOp = c10d::ReduceOp::MAX;
    run_collective(*impl_->pg, impl_->device, io, [&](std::vector<at::Tensor> &v) { return impl_->pg->allreduce(v, opts); });
  } catch (const std::exception &e) {
    group_failed(who(), "comparing " + what, e, cfg_.timeout_s);
  }
  const int64_t *v = io[0].data_ptr<int64_t>();
  if (v[0] != -v[2] || v[1] != -v[3])
    throw RanksDiffer(who() + what + " differs between the ranks; every rank must run the same command " +
                     "(apart from --rank) with the same data and build");
}

void DataParallel::barrier(const std::string &what) {
  std::vector<double> one{1.0};
  sum(one, what);
  if (one[0] != double(cfg_.world_size))
    throw GroupError(who() + what + ": " + std::to_string(int64_t(one[0])) + " ranks answered, expected " +
                     std::to_string(cfg_.world_size));
}

}  // namespace ape
