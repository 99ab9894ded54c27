// Distributed: data-parallel training on PyTorch's c10d process groups (Gloo; NCCL where built).
//
//   torchrun --nproc-per-node N --no-python ape-train ...     (env://: RANK, WORLD_SIZE, LOCAL_RANK,
//   ape-train --rank R --world-size N --master-addr A ...      MASTER_ADDR, MASTER_PORT) or flags
//
//   rendezvous   c10d::TCPStore at MASTER_ADDR:MASTER_PORT (hosted by rank 0, or by torchrun's
//                agent when it says so: TORCHELASTIC_USE_AGENT_STORE), under the prefix "ape/"
//   transport    c10d::ProcessGroupGloo (TCP) on the CPU tensors the runtime trains; NCCL
//                (c10d::ProcessGroupNCCL) on request where LibTorch has CUDA and the rank has a GPU
//
// One training step on N ranks equals one step of a single process with N times the batch:
//   windows   every rank draws the same N·b windows from the shared sampler stream and keeps
//             rows [r·b, (r+1)·b) (TrainSampler::next with a shard), so the union over the ranks
//             is exactly the single process's batch of N·b, in the same order
//   loss      each rank's mean over its b windows; the step's loss is the mean over the ranks
//             (all windows have the same length, so that is the mean over all N·b windows)
//   grads     after backward, every parameter's gradient (model, encoding params, token features)
//             is summed over the ranks in buckets of flattened gradients (bucket_bytes each, one
//             allreduce per bucket, all in flight at once) and divided by N: the gradient of the
//             mean loss over N·b windows. Every rank then holds the same bits (an allreduce ends
//             with one result broadcast to all), so the clipped update keeps the replicas equal.
//   control   the clock (budget, time-based checkpoints) and a stop request (Ctrl-C, SIGTERM on any
//             rank) are agreed once a step on the CPU, once every Trainer::read_every (16) steps on
//             a GPU, where an agreement waits for the device (max over the ranks): every rank takes
//             the same branch.
//
// Failures: a rank that exits (crash, kill) closes its connections and the others' next collective
// fails at once; a rank that stops answering makes it fail after `timeout_s`. Both surface as
// GroupError naming this rank and what it was doing.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

namespace ape {

struct DistConfig {
  int64_t rank = -1;        // this process, in [0, world_size)
  int64_t world_size = 0;   // 0: not distributed (a single process; no group is formed)
  int64_t local_rank = -1;  // rank on this node (-1: unknown; the GPU index for NCCL)
  int64_t gpu = -1;         // the GPU NCCL reduces on (the model's; -1: local_rank, else the rank)
  std::string master_addr = "127.0.0.1";
  int64_t master_port = 29500;
  std::string backend = "auto";  // "auto" (Gloo), "gloo" or "nccl"
  double timeout_s = 300;        // rendezvous and every collective; a silent rank fails after this
  int64_t bucket_bytes = 25 << 20;

  bool enabled() const { return world_size > 0; }
  // Throws std::invalid_argument naming the option (--rank, --world-size, ...) and its range.
  void validate() const;
  // The variables torchrun sets (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT), over
  // `base`; `base` unchanged when RANK and WORLD_SIZE are not set. A malformed value throws.
  static DistConfig from_env(DistConfig base);
};

// The process group failed: a peer died or timed out, or the ranks disagree (settings, model).
struct GroupError : std::runtime_error {
  using std::runtime_error::runtime_error;
};
// The ranks answered and disagree (DataParallel::check_same): the group itself still works.
struct RanksDiffer : GroupError {
  using GroupError::GroupError;
};

// Whether this build can form a group with `backend` ("gloo", "nccl"); "" when it can, else why not.
std::string backend_unavailable(const std::string &backend);

class DataParallel {
 public:
  // Joins the group (blocks until every rank has joined or timeout_s passes). `log` gets one line
  // on rank 0. Throws GroupError.
  // Before the group forms, the ranks call the roll (each posts its --world-size in the store and
  // reads every other's): a rank with another --world-size, or one that refused to start
  // (refuse_to_join), ends every rank that reads its post at once, with the reason, where the group
  // would have waited out --dist-timeout for it.
  static std::unique_ptr<DataParallel> join(const DistConfig &cfg, std::ostream *log = nullptr);
  // A rank that will not join (its command line or data was refused) tells the others why, so that
  // they stop instead of waiting for it: it posts `reason` at the roll, as a client of the store (or
  // as its host, rank 0 outside torchrun, which then keeps it up until the others have read it).
  // Best effort within 5 s (or --dist-timeout, if shorter): a rank that comes later waits as
  // before. Never throws.
  static void refuse_to_join(const DistConfig &cfg, const std::string &reason);
  virtual ~DataParallel();

  int64_t rank() const { return cfg_.rank; }
  int64_t world_size() const { return cfg_.world_size; }
  const std::string &backend() const { return backend_; }
  const DistConfig &config() const { return cfg_; }
  // "[rank 1 of 2] " for messages.
  std::string who() const;

  // Replaces every gradient of `params` by its mean over the ranks (bucketed, see above); params
  // without a gradient are skipped (the same on every rank: checked on the first call). Returns the
  // mean of `loss` (a one-element tensor) over the ranks, as a 0-dim tensor on the gradients' device
  // in their dtype: it rides in the last bucket, and nothing here reads it, so on a GPU the host
  // queues the step without waiting for the device (NCCL's waits are the stream's). `step` names the
  // step in errors.
  at::Tensor average_gradients(const std::vector<at::Tensor> &params, const at::Tensor &loss, int64_t step);

  // Copies rank 0's values of `tensors` into every rank's (the same list on every rank).
  void broadcast_from_root(const std::vector<at::Tensor> &tensors, const std::string &what);

  // The agreed clock and stop request after `step`: {max of seconds, any of stop} over the ranks.
  std::pair<double, bool> agree(double seconds, bool stop, int64_t step);

  // Adds `values` elementwise over the ranks (f64), in place.
  void sum(std::vector<double> &values, const std::string &what);

  // Throws GroupError "<what> differs between the ranks" unless every rank passes the same value.
  void check_same(uint64_t fingerprint, const std::string &what);

  // Waits for every rank.
  void barrier(const std::string &what);

  // Time spent in average_gradients' all-reduces (from the first bucket sent to the last one back,
  // waiting for the slower rank included), the calls, and the bytes reduced per call, so far.
  // Gradients on a GPU are reduced on the device's stream, the host waiting for nothing: their time
  // is not counted (reduce_on_device() says so).
  double reduce_seconds() const { return reduce_seconds_; }
  bool reduce_on_device() const { return reduce_on_device_; }
  int64_t reduce_calls() const { return reduce_calls_; }
  int64_t reduce_bytes() const { return reduce_bytes_; }

 protected:
  DataParallel() = default;
  struct Impl;
  std::unique_ptr<Impl> impl_;
  DistConfig cfg_;
  std::string backend_;
  bool layout_checked_ = false;
  double reduce_seconds_ = 0;
  bool reduce_on_device_ = false;
  int64_t reduce_calls_ = 0, reduce_bytes_ = 0;
};

// FNV-1a over the bytes of `tensors` (contiguous CPU copies), for check_same.
uint64_t fingerprint(const std::vector<at::Tensor> &tensors, uint64_t seed = 1469598103934665603ULL);

}  // namespace ape
