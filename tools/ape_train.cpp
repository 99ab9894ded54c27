// ape-train: train a small decoder LM per encoding on the shipped corpus, checkpoint it, and
// evaluate it at multiples of the training length.
//
//   ape-train --encoding rope --encoding cable --minutes 2
//   ape-train --spec my_encoding.mlir --minutes 2   # a spec file of your own, compiled now (cached)
//   ape-train --resume runs/rope.ckpt          # continue an interrupted run where it stopped
//   ape-train --list
//   torchrun --nproc-per-node 2 --no-python ape-train --encoding rope --steps 200   # data parallel
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <memory>
#include <cstring>
#include <optional>
#include <set>
#include <thread>
#include <tuple>

#include <CLI/CLI.hpp>
#include <torch/utils.h>

#include "Cli.h"

#include "ape/cpu/kernel_entry.h"
#include "runtime/Attention.h"
#include "runtime/AtomicFile.h"
#include "runtime/Checkpoint.h"
#include "runtime/CudaAttention.h"
#include "runtime/Data.h"
#include "runtime/Device.h"
#include "runtime/Distributed.h"
#include "runtime/Eval.h"
#include "runtime/Model.h"
#include "runtime/Options.h"
#include "runtime/Registry.h"
#include "runtime/SpecLibrary.h"
#include "runtime/Threads.h"
#include "runtime/Train.h"
#include "runtime/Util.h"

namespace fs = std::filesystem;

namespace {

// Ctrl-C or SIGTERM: the running encoding writes its checkpoint and ape-train stops (status 130).
// The runtime's stop flag: a child process it waits for (the tokenizer's helper, a compiler) is
// ended on a stop too (ape::run_process).
volatile std::sig_atomic_t &g_stop = ape::g_stop_requested;
extern "C" void on_stop_signal(int) { g_stop = 1; }
struct Interrupted : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Where a rank that refuses to start posts its reason (DataParallel::refuse_to_join): `d`'s
// rendezvous, if it names one (distributed, a rank in range, a port, a host), without the other
// settings (one of them may be the one refused); a timeout out of range is left out.
std::optional<ape::DistConfig> rendezvous_part(ape::DistConfig d) {
  if (!d.enabled() || d.rank < 0 || d.rank >= d.world_size || d.world_size > (1 << 20) || d.master_port < 1 ||
      d.master_port > 65535 || d.master_addr.empty())
    return std::nullopt;
  ape::DistConfig r;  // the rendezvous alone: another setting may be the one refused
  r.rank = d.rank, r.world_size = d.world_size, r.master_addr = d.master_addr, r.master_port = d.master_port;
  if (d.timeout_s > 0 && d.timeout_s <= 1e6) r.timeout_s = d.timeout_s;
  return r;
}

// The rendezvous of a command line that did not parse: torchrun's variables and the flags among
// argv (`--rank 1`, `--rank=1`; a malformed value is left out), as the parse would have set them.
std::optional<ape::DistConfig> rendezvous_of_argv(int argc, char **argv, ape::DistConfig d) {
  try {
    d = ape::DistConfig::from_env(d);
  } catch (const std::exception &) {
    return std::nullopt;
  }
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i], value;
    if (const size_t eq = arg.find('='); arg.rfind("--", 0) == 0 && eq != std::string::npos) {
      value = arg.substr(eq + 1), arg.resize(eq);
    } else if (i + 1 < argc) {
      value = argv[i + 1];
    }
    auto whole = [&](int64_t &out) {
      try {
        size_t used = 0;
        const long long x = std::stoll(value, &used);
        if (used == value.size()) out = x;
      } catch (const std::exception &) {
      }
    };
    if (arg == "--rank") whole(d.rank);
    else if (arg == "--world-size") whole(d.world_size);
    else if (arg == "--master-port") whole(d.master_port);
    else if (arg == "--master-addr" && !value.empty()) d.master_addr = value;
    else if (arg == "--dist-timeout") {
      try {
        d.timeout_s = std::stod(value);
      } catch (const std::exception &) {
      }
    }
  }
  return rendezvous_part(d);
}

// How a fresh run starts: from the weights of `init_from` (a checkpoint; fine-tuning) or a fresh
// initialisation, with the fixed params `sets` applied (ape-eval --set's NAME=VALUE).
struct Start {
  std::string init_from;
  std::vector<std::pair<std::string, double>> sets;
  std::string data_dir, cache_dir;  // absolute: recorded for --resume
  // A finished run at the output checkpoint that this one replaces, kept aside until it finishes
  // (keep_previous): recorded ("replaces"), so that a resumed run removes it when it finishes.
  std::string replaces;
};

// One encoding's run: a fresh one, or the continuation of `resume`. Returns its evaluation rows;
// throws ape::TrainingDiverged when training stops.
// With `dp`, as one rank of a data-parallel run (runtime/Distributed.h): rank 0 prints and writes.
std::vector<ape::EvalRow> train_one(const std::string &name, const ape::ModelConfig &mc, const ape::TrainConfig &tc,
                                    const ape::Corpus &corpus, const ape::EvalConfig &ec, const std::string &ckpt,
                                    const ape::Checkpoint *resume, const std::string &budget,
                                    ape::DataParallel *dp, const ape::ComputeDevice &device, const Start &start) {
  torch::manual_seed(tc.seed);
  ape::ModelConfig cfg = mc;
  cfg.encoding = name;
  // Initialised on the CPU: the same weights on every device. A resumed run's weights (fixed params
  // included) come from its checkpoint below.
  const bool init = !resume && !start.init_from.empty();
  std::vector<std::string> kept;
  ape::LanguageModel model = init ? ape::load_model_as(start.init_from, name, nullptr, &kept) : ape::LanguageModel(cfg);
  if (!resume)
    for (const auto &[param, value] : start.sets) {
      try {
        model->set_fixed_param(param, value);
      } catch (const std::exception &e) {
        throw std::invalid_argument("--set " + param + ": " + e.what());
      }
    }
  model->place(device);
  ape::TrainSampler sampler(corpus.train(), tc.seed);
  ape::Trainer trainer(model, sampler, tc);
  std::cout << "\n[" << name << "] " << model->num_parameters() << " parameters; d " << cfg.d_model << ", "
            << cfg.layers << " layers, " << cfg.heads << " heads";
  if (cfg.key_heads() != cfg.heads) std::cout << " (" << cfg.key_heads() << " key/value)";
  std::cout << ", L " << tc.seq_len << ", batch " << tc.batch;
  if (dp) std::cout << " x " << tc.world_size << " ranks";
  std::cout << ", budget " << budget << "; " << device.str() << "\n";
  if (dp) trainer.distribute(*dp);
  const double reduce0 = dp ? dp->reduce_seconds() : 0;
  const int64_t calls0 = dp ? dp->reduce_calls() : 0;
  bool finished_before = false;
  if (resume) {
    trainer.restore(*resume);
    finished_before = trainer.state().complete;
    if (finished_before)  // its training is over: evaluated again, nothing trained
      std::cout << "[" << name << "] " << resume->path << " is a finished run (" << trainer.state().step
                << " steps, " << std::lround(trainer.state().elapsed) << " s): evaluating it again\n";
    else
      std::cout << "[" << name << "] resumed from " << resume->path << " at step " << trainer.state().step << " ("
                << std::lround(trainer.state().elapsed) << " s trained)\n";
  }
  if (init) {
    std::cout << "[" << name << "] initialised from " << start.init_from;
    if (!kept.empty()) std::cout << " (" << kept.size() << " tensors it does not hold keep " << name << "'s values)";
    std::cout << "\n";
  }
  for (const auto &[param, value] : start.sets)
    if (!resume) std::cout << "[" << name << "] " << param << " = " << value << "\n";
  // Absolute paths: a resumed run finds them from any working folder, and the same folders given
  // as relative and absolute paths record the same words.
  auto absolute = [](const std::string &p) { return p.empty() ? p : fs::absolute(p).lexically_normal().string(); };
  nlohmann::json extra = {
      {"data", {{"vocab", corpus.vocab()}, {"tokenizer", absolute(corpus.tokenizer_path())},
                {"tokenizer_fnv", corpus.tokenizer_hash()}, {"dir", absolute(start.data_dir)},
                {"cache_dir", absolute(start.cache_dir)}}},
      {"eval", {{"multiples", ec.multiples}, {"tokens", ec.tokens}}},  // a resumed run evaluates the same way
      // Where it trains: --resume goes on there by default.
      {"device", {{"type", device.is_cuda() ? "cuda" : "cpu"}, {"precision", ape::precision_name(device.precision)}}}};
  if (!device.is_cuda()) {
    // The CPU kernels' instruction-set level: another one's sums round differently, so a run
    // resumed on it goes on correctly but not bit for bit as the uninterrupted run (said below).
    const std::string level = ape::checked_kernel_cpu_level();
    extra["device"]["cpu_level"] = level.substr(0, level.find(' '));
    const nlohmann::json *was = nullptr;
    if (resume)
      if (auto d = resume->config.find("device"); d != resume->config.end() && d->is_object())
        if (auto l = d->find("cpu_level"); l != d->end() && l->is_string() && d->value("type", "") == "cpu") was = &*l;
    if (was && *was != extra["device"]["cpu_level"])
      std::cout << "[" << name << "] note: trained so far with the " << was->get<std::string>()
                << " CPU kernels, it goes on with the " << extra["device"]["cpu_level"].get<std::string>()
                << " ones (APE_CPU_LEVEL, or another CPU): correct, but not bit for bit the uninterrupted run\n";
  }
  if (resume) {  // where the run started, as its first checkpoint said
    for (const char *key : {"init_from", "sets", "replaces"})
      if (auto it = resume->config.find(key); it != resume->config.end()) extra[key] = *it;
  } else {
    if (init) extra["init_from"] = start.init_from;
    // (its name only: a file beside the checkpoint, wherever the run is resumed from: replaced_beside)
    if (!start.replaces.empty()) extra["replaces"] = fs::path(start.replaces).filename().string();
    if (!start.sets.empty()) {
      nlohmann::json sets = nlohmann::json::object();
      for (const auto &[param, value] : start.sets) sets[param] = value;
      extra["sets"] = sets;
    }
  }
  if (const ape::SpecLibrary *spec = ape::registered_spec(name))
    extra["spec"] = spec->record();  // ape-eval and --resume rebuild the kernel from it
  // Test hook (test/distributed): APE_TEST_STOP_AFTER_STEP=N asks to stop, as Ctrl-C does, once N
  // steps are done: one rank asking stops every rank at the same step.
  const char *stop_env = std::getenv("APE_TEST_STOP_AFTER_STEP");
  const int64_t stop_after = stop_env ? std::atoll(stop_env) : 0;
  trainer.interrupt = [stop_after](const ape::TrainState &s) {
    return g_stop != 0 || (stop_after > 0 && s.step >= stop_after);
  };
  ape::TrainResult res = trainer.run(std::cout, name, ckpt, extra);
  if (!trainer.state().complete)
    throw Interrupted("[" + name + "] interrupted at step " + std::to_string(trainer.state().step) +
                      "; checkpoint -> " + ckpt + "; continue with: ape-train --resume " + ckpt +
                      (dp ? " (started like this run, on every rank)" : ""));
  char summary[256];
  std::snprintf(summary, sizeof summary,
                "[%s] %lld steps in %.1f s, %.0f tok/s, loss %.4f -> %.4f (mean of the last %lld steps)\n",
                name.c_str(), (long long)res.steps, res.seconds, res.tokens_per_second, res.first_loss, res.final_loss,
                (long long)std::min<int64_t>(20, res.steps));
  if (!finished_before) std::cout << summary;
  if (res.skipped_steps > 0)
    std::cout << "[" << name << "] loss scaling skipped " << res.skipped_steps << " update(s) (float16 overflow)\n";
  if (res.steady_tokens_per_second > 0)
    std::cout << "[" << name << "] after step " << ape::kSteadyAfter << ": " << std::llround(res.steady_tokens_per_second)
              << " tok/s\n";
  if (device.is_cuda())
    std::cout << "[" << name << "] GPU memory: peak " << ape::cuda_peak_memory(device.device.index()) / (1 << 20)
              << " MiB allocated (" << device.str() << ")\n";
  if (dp && dp->reduce_calls() > calls0 && dp->reduce_on_device()) {
    std::snprintf(summary, sizeof summary,
                  "[%s] data parallel: %d ranks (%s); gradient all-reduce of %.0f KiB a step, queued on the GPU's "
                  "stream (the host does not wait for it)\n",
                  name.c_str(), int(dp->world_size()), dp->backend().c_str(), double(dp->reduce_bytes()) / 1024.0);
    std::cout << summary;
  } else if (dp && dp->reduce_calls() > calls0) {
    const double per = (dp->reduce_seconds() - reduce0) / double(dp->reduce_calls() - calls0);
    std::snprintf(summary, sizeof summary,
                  "[%s] data parallel: %d ranks (%s); gradient all-reduce of %.0f KiB: %.1f ms/step on rank 0, "
                  "waiting for the slowest rank included\n",
                  name.c_str(), int(dp->world_size()), dp->backend().c_str(), double(dp->reduce_bytes()) / 1024.0,
                  1000.0 * per);
    std::cout << summary;
  }
  std::cout << "[" << name << "] checkpoint -> " << ckpt << "\n";
  if (!dp) return ape::evaluate(model, corpus.test(), tc.seq_len, ec, &std::cout);
  ape::EvalShard shard;
  shard.rank = dp->rank();
  shard.world = dp->world_size();
  shard.sum = [dp](std::vector<double> &v) { dp->sum(v, "the evaluation's sums"); };
  return ape::evaluate(model, corpus.test(), tc.seq_len, ec, &std::cout, "", &shard);
}

// Renames `ckpt` to NAME<tag>.ckpt beside it (-2, -3, ... where that exists); "" when the rename
// failed (`ec` says why).
std::string keep_aside(const std::string &ckpt, const std::string &tag, std::error_code &ec) {
  const fs::path p(ckpt);
  const std::string stem = (p.parent_path() / p.stem()).string() + tag;
  std::string kept = stem + ".ckpt";
  for (int n = 2; fs::exists(kept, ec); ++n) kept = stem + "-" + std::to_string(n) + ".ckpt";
  fs::rename(ckpt, kept, ec);
  return ec ? std::string() : kept;
}

// A run at the output checkpoint, which this command starts over, is kept: renamed beside it with
// a note. An unfinished one as NAME.unfinished-stepN.ckpt (the note says how to continue it), a
// file there this build cannot read (a newer format, a damaged file) as NAME.unreadable.ckpt: both
// stay. A finished one as NAME.finished-stepN.ckpt until the new run finishes, which then removes
// it (its checkpoint replaces the old one, as asked): a stop or a failure before that leaves it
// there (Ctrl-C at a new run's start had replaced a finished model with one of a single step).
// A user's training is never replaced by a new run's first checkpoint. Returns the path of a
// finished run kept aside ("" when none).
std::string keep_previous(const std::string &ckpt) {
  std::error_code ec;
  if (!fs::is_regular_file(ckpt, ec)) return "";
  int64_t step = 0;
  bool complete = false;
  std::string unreadable;
  try {
    const ape::Checkpoint c = ape::read_checkpoint(ckpt);
    const auto st = c.config.find("state");
    complete = st == c.config.end() || !st->is_object() || st->value("complete", true);
    step = st != c.config.end() && st->is_object() ? st->value("step", int64_t{0}) : 0;
  } catch (const std::exception &e) {
    unreadable = ape::error_text(e);
  }
  const std::string what = !unreadable.empty() ? "is not a checkpoint this build reads (" + unreadable + ")"
                           : complete ? "holds a finished run (step " + std::to_string(step) + ")"
                                      : "holds an unfinished run (step " + std::to_string(step) + ")";
  const std::string tag = !unreadable.empty() ? ".unreadable"
                          : complete          ? ".finished-step" + std::to_string(step)
                                              : ".unfinished-step" + std::to_string(step);
  const std::string kept = keep_aside(ckpt, tag, ec);
  if (kept.empty())
    throw std::runtime_error(ckpt + " " + what + " and could not be kept aside (" + ec.message() + "): " +
                             (unreadable.empty() && !complete ? "ape-train --resume " + ckpt + " continues it; " : "") +
                             "move it away to start a new run there");
  std::cout << "[note] " << ckpt << " " << what << ": kept as " << kept;
  if (complete && unreadable.empty())
    std::cout << " until this run finishes (then removed: this run's checkpoint replaces it; if this run stops or "
                 "fails first, it stays, or goes back where this run saved nothing)\n";
  else
    std::cout << "; starting a new run" << (unreadable.empty() ? ". To continue it instead: ape-train --resume " + kept : "")
              << "\n";
  return complete && unreadable.empty() ? kept : "";
}

// The finished run a resumed run replaces (its checkpoint's "replaces"): the file of that name
// beside the checkpoint, and only a name keep_previous gives (NAME.finished-stepN[-k].ckpt), else
// "". The path had been recorded as typed, relative to the folder the run started in: resumed from
// another folder, or from a copy of the checkpoint, the run removed whatever stood at that path
// (a file of the user's, or another folder's only finished model).
std::string replaced_beside(const std::string &ckpt, const std::string &recorded) {
  const fs::path name = fs::path(recorded).filename();
  const std::string n = name.string(), stem = fs::path(ckpt).stem().string() + ".finished-step";
  if (n.size() <= stem.size() || n.compare(0, stem.size(), stem) != 0 || name.extension() != ".ckpt") return "";
  return (fs::path(ckpt).parent_path() / name).string();
}

// The finished run kept aside for one encoding's new run (keep_previous): removed when the run
// finishes; when it ends otherwise (stopped, failed, diverged) put back where nothing was saved in
// its place (a run that diverged or failed before its first save had left no checkpoint at all),
// else left, with a note.
struct KeptAside {
  std::string ckpt, previous;
  bool done = false;

  void finished() {
    done = true;
    std::error_code ec;
    if (!previous.empty() && fs::remove(previous, ec))
      std::cout << "[note] removed " << previous << ": " << ckpt << " replaces it\n";
  }
  void ended() noexcept {
    if (done || previous.empty()) return;
    done = true;
    try {
      std::error_code ec;
      if (!fs::exists(previous, ec)) return;
      if (!fs::exists(ckpt, ec)) {
        fs::rename(previous, ckpt, ec);
        if (!ec) std::cout << "[note] this run saved nothing: " << ckpt << " is the finished run again\n";
      } else {
        std::cout << "[note] the finished run stays kept as " << previous
                  << " (removed when this run, continued with --resume, finishes)\n";
      }
    } catch (...) {
    }
  }
  ~KeptAside() { ended(); }
};

}  // namespace

// Whether a stop was requested (Ctrl-C, SIGTERM) on this process or, data parallel, on any rank
// (every rank calls it at the same point: a collective).
static bool any_rank_stopped(ape::DataParallel *dp, const std::string &when) {
  if (!dp) return g_stop != 0;
  std::vector<double> stop{g_stop != 0 ? 1.0 : 0.0};
  dp->sum(stop, "agreeing on a stop request " + when);
  return stop[0] > 0;
}

static int tool_main(int argc, char **argv) {
  // Lines reach a log file as they are written (progress to follow, and every line before a crash).
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  ape::prepare_threads(argv);
  ape::tune_allocator();
  CLI::App app{"ape-train: train a small decoder language model with each named encoding on the shipped\n"
               "pg30 books (same seed, same data order), save a checkpoint per encoding, and report loss /\n"
               "perplexity on the held-out test books at multiples of the training length.\n\n"
               "Checkpoints (OUT/NAME.ckpt) are written every --checkpoint-minutes / --checkpoint-every and at\n"
               "the end, with the whole training state: `ape-train --resume OUT/NAME.ckpt` continues a run that\n"
               "was stopped or killed, and with a step budget ends bit-identical to one never interrupted.\n"
               "Training stops on a NaN/inf loss or gradient (on the CPU naming where it first appeared; on a\n"
               "GPU the step, found when the queued losses are read) and when the mean\n"
               "loss of the last 10 steps exceeds --divergence-factor x the first step's loss; the other\n"
               "encodings of the run still train, and ape-train then exits with status 1 (as it does when an\n"
               "evaluation gives a non-finite loss, or its output could not be written: a reader that closed it,\n"
               "as `| head` does, or a full disk; the checkpoints and results.csv are written all the same).\n\n"
               "On a GPU (--device cuda[:N]) the model trains with the encoding's generated CUDA kernels in bf16\n"
               "autocast (--precision f16: float16 with dynamic loss scaling, a step whose gradients overflow\n"
               "is skipped; f32: float32); weights, optimizer state and gradients stay float32, and\n"
               "checkpoints are device-independent (resume, evaluate or decode on either device; docs/cuda.md;\n"
               "--resume goes on on the run's device type and precision unless --device / --precision differ).\n"
               "The steps are queued without waiting for the GPU (losses are read 16 steps at a time, data\n"
               "parallel too); APE_CUDA_SYNC_DEBUG=warn (or error) reports any wait inside them.\n\n"
               "Data parallel (docs/distributed.md): started by `torchrun --nproc-per-node N --no-python ape-train\n"
               "...` (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT) or with --rank/--world-size/\n"
               "--master-addr/--master-port on every process, ape-train joins a PyTorch c10d group (Gloo; NCCL\n"
               "with --device cuda, one GPU per rank): each rank trains on its own --batch windows of every\n"
               "step and the gradients are averaged, so N ranks with --batch b train like one process with\n"
               "--batch N*b. Rank 0 prints and writes the checkpoint and results.csv; a resumed run may use\n"
               "another number of ranks that divides the global batch. If a rank dies the others stop with an\n"
               "error (Gloo: at once; NCCL: at the latest after --dist-timeout); a rank that hangs, after\n"
               "--dist-timeout."};
  std::vector<std::string> encodings;
  std::vector<std::string> specs;
  int64_t steps = 0;
  double minutes = 0;
  ape::ModelConfig mc;
  ape::TrainConfig tc;
  ape::EvalConfig ec;
  std::string multiples = "1,2,4,8";
  std::string out_dir = "runs";
  std::string data_dir = ape::default_data_dir();
  std::string cache_dir = ape::default_cache_dir();
  std::string resume, init_from;
  std::vector<std::string> set_args;
  int64_t threads = 0;
  bool list = false;
  ape::DistConfig dist_flags;

  auto *enc_opt = ape::cli::add_list_option(app, "-e,--encoding", encodings,
                                            "Encoding to train (repeatable, or comma-separated); see --list");
  auto *steps_opt = app.add_option("--steps", steps, "Training steps per encoding, in [0, 10^9]");
  auto *minutes_opt = app.add_option("--minutes", minutes,
                                     "Training time per encoding in minutes, in [0, 10^6] (default 2 when --steps is not\n"
                                     "given; with both, whichever ends first)");
  auto *spec_opt = app.add_option("--spec", specs,
                                  "Train the encoding of this spec file too (repeatable): compiled now by apec and\n"
                                  "the C++ compiler into a cached library ($APE_CACHE_DIR, default $XDG_CACHE_HOME/ape\n"
                                  "or ~/.cache/ape), no rebuild of APE; its text is kept in the checkpoint")
                       ->type_name("FILE");
  std::vector<CLI::Option *> run_options = {enc_opt, spec_opt, steps_opt, minutes_opt};
  auto run_option = [&](CLI::Option *o) {
    run_options.push_back(o);
    return o;
  };
  run_option(app.add_option("--seq-len", tc.seq_len, "Training length L (tokens per window), in [1, 2^24]")->capture_default_str());
  run_option(app.add_option("--batch", tc.batch, "Windows per step, in [1, 65536]")->capture_default_str());
  run_option(app.add_option("--d-model", mc.d_model, "Model width d, in [1, 65536]")->capture_default_str());
  run_option(app.add_option("--layers", mc.layers, "Number of blocks, in [1, 1024]")->capture_default_str());
  run_option(app.add_option("--heads", mc.heads, "Attention heads, in [1, d-model], dividing d-model")->capture_default_str());
  run_option(app.add_option("--kv-heads", mc.kv_heads,
                            "Key/value heads, in [0, --heads], dividing --heads: fewer than --heads is grouped-query\n"
                            "attention (1: multi-query); 0 = --heads")
                 ->capture_default_str());
  run_option(app.add_option("--vocab", mc.vocab, "SentencePiece BPE vocabulary size, in [300, 65535]")->capture_default_str());
  run_option(app.add_option("--lr", tc.lr, "Peak learning rate (AdamW, warmup then cosine decay), in (0, 10]")->capture_default_str());
  run_option(app.add_option("--warmup", tc.warmup_steps, "Linear warmup steps, in [0, 10^9] (at most steps/5 with --steps)")->capture_default_str());
  int64_t seed = static_cast<int64_t>(tc.seed);  // (signed: a negative one is refused, not wrapped)
  run_option(app.add_option("--seed", seed, "Random seed (model init and data order), in [0, 2^63)")
                 ->capture_default_str());
  run_option(app.add_option("--checkpoint-every", tc.checkpoint_every,
                            "Also write the checkpoint every N steps, in [0, 10^9] (0: only by time and at the end)")
                 ->capture_default_str());
  run_option(app.add_option("--checkpoint-minutes", tc.checkpoint_minutes,
                            "Write the checkpoint every M minutes of training, in [0, 10^6] (0: never by time)")
                 ->capture_default_str());
  run_option(app.add_option("--divergence-factor", tc.divergence_factor,
                            "Stop when the mean loss of the last 10 steps exceeds F x the first step's loss\n"
                            "(F in (1, 10^6]; 0: never)")
                 ->capture_default_str());
  auto *out_opt = run_option(app.add_option("--out", out_dir, "Output folder: <encoding>.ckpt per encoding and results.csv (a finished\n"
                                                                     "<encoding>.ckpt there is replaced when this run finishes, kept\n"
                                                                     "until then as <encoding>.finished-stepN.ckpt; an unfinished one is\n"
                                                                     "kept as <encoding>.unfinished-stepN.ckpt, one this build cannot\n"
                                                                     "read as <encoding>.unreadable.ckpt; results.csv keeps the rows\n"
                                                                     "of the encodings this run does not train)")
                                 ->capture_default_str());
  run_option(app.add_option("--init-from", init_from,
                            "Start from the weights of CKPT (an ape-train checkpoint) instead of a fresh initialisation:\n"
                            "fine-tuning, e.g. at a longer --seq-len with a scaled RoPE (-e rope_pi --set rope_factor=2).\n"
                            "One encoding; its trainable params must match CKPT's in name and shape (as ape-eval\n"
                            "--encoding); the model's size is CKPT's; optimizer, schedule and data order start anew")
                 ->type_name("CKPT"));
  run_option(app.add_option("--set", set_args,
                            "NAME=VALUE (repeatable): set the fixed param NAME in every layer before training, e.g.\n"
                            "rope_factor=2 (as ape-eval --set; kept in the checkpoint)")
                 ->type_name("NAME=VALUE"));
  app.add_option("--resume", resume,
                 "Continue the run that wrote CKPT (its encoding, model, training settings and state); the\n"
                 "checkpoint is updated in place and results.csv written beside it")
      ->type_name("CKPT");
  auto *multiples_opt =
      app.add_option("--eval-multiples", multiples, "Evaluate at these multiples of --seq-len, each in [1, 1024]")
          ->capture_default_str();
  auto *tokens_opt =
      app.add_option("--eval-tokens", ec.tokens, "Target tokens scored per length, in [1, 10^9]: the same tokens at every length, in segments of\n"
                 "the longest length asked (a cell compares with another run's, or ape-eval's, only when both asked\n"
                 "for the same --eval-multiples and --eval-tokens)")
          ->capture_default_str();
  auto *data_opt = app.add_option("--data", data_dir, "Corpus folder holding SPLITS.tsv and the books, UTF-8 text (clean/pg<ID>_*.txt or clean.tar.xz) "
                                  "(with --resume: the run's, where it still exists)")->capture_default_str();
  auto *cache_opt = app.add_option("--cache-dir", cache_dir, "Cache for the unpacked books, the tokenizer and the "
                                   "token ids (with --resume: the run's, where it still exists)")->capture_default_str();
  auto *threads_opt = app.add_option("--threads", threads,
                                     "CPU threads, in [0, 1024] (default 0: all hardware threads; with --resume: the run's)");
  std::string device_name = "cpu", precision = "auto";
  auto *device_opt = app.add_option("--device", device_name,
                                    std::string(ape::kDeviceHelp) + "; data parallel, cuda means cuda:LOCAL_RANK (cuda:0 where CUDA_VISIBLE_DEVICES shows a rank one GPU). "
                                    "With --resume: the run's device type (cpu or cuda); another resumes it "
                                    "there (checkpoints are device-independent)")
                         ->capture_default_str();
  auto *precision_opt = app.add_option("--precision", precision, std::string(ape::kPrecisionHelp) +
                                                                     " (with --resume: the run's)")
                            ->capture_default_str();
  app.add_flag("--list", list, "List the available encodings and exit");
  const std::string dist_group = "Data parallel (default: torchrun's RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT)";
  auto *rank_opt = app.add_option("--rank", dist_flags.rank, "This process's rank, in [0, world-size)")->group(dist_group);
  auto *world_opt = app.add_option("--world-size", dist_flags.world_size,
                                   "Processes training together, in [1, 2^20]; each takes --batch windows a step")
                        ->group(dist_group);
  auto *local_opt = app.add_option("--local-rank", dist_flags.local_rank,
                                   "Rank on this machine, in [0, 2^20] (prepares the data first when 0; the GPU index for nccl)")
                        ->group(dist_group);
  auto *addr_opt = app.add_option("--master-addr", dist_flags.master_addr,
                                  "Host of rank 0, where the rendezvous store listens")
                       ->group(dist_group)->capture_default_str();
  auto *port_opt = app.add_option("--master-port", dist_flags.master_port, "Port of the rendezvous store, in [1, 65535]")
                       ->group(dist_group)->capture_default_str();
  app.add_option("--dist-backend", dist_flags.backend,
                 "auto (nccl with --device cuda, else gloo), gloo, or nccl (reduces on each rank's GPU; a CUDA\n"
                 "build with a GPU per rank)")
      ->group(dist_group)->capture_default_str();
  app.add_option("--dist-timeout", dist_flags.timeout_s,
                 "Seconds to wait for the other ranks (joining, and every collective) before giving up,\n"
                 "in (0, 10^6]: a rank that hangs stops the others after this long")
      ->group(dist_group)->capture_default_str();
  app.footer(ape::kernel_cpu_level_help());
  try {
    ape::cli::check_whole_numbers(app);
    ape::cli::check_nonempty_values(app);
    app.parse(argc, argv);
  } catch (const CLI::ParseError &e) {
    if (ape::cli::report_parse_error(app, e, argv[0]) == 0) return 0;  // --help
    // A rank of a data-parallel run whose command line was refused tells the others, which would
    // wait out --dist-timeout for it (its rendezvous flags read from argv: the parse stopped).
    if (std::optional<ape::DistConfig> d = rendezvous_of_argv(argc, argv, dist_flags))
      ape::DataParallel::refuse_to_join(*d, std::string("its command line was refused: ") + e.what());
    return 1;
  }

  bool root = true;     // rank 0, or a single process: prints and writes
  std::string who;      // "[rank r of N] " in a data-parallel run's errors
  // A data-parallel rank refused before it joins tells the others (DataParallel::refuse_to_join).
  std::optional<ape::DistConfig> refusing;
  try {
    ape::SpecLibraryOptions spec_opts;
    spec_opts.log = &std::cout;
    if (list) {
      for (const auto &name : ape::kernel_names()) {
        const auto &m = ape::manifest_of(ape::find_kernel(name));
        std::cout << name;
        if (!m.source.empty()) std::cout << "  (" << m.source << ")";
        std::cout << "\n";
      }
      return 0;
    }
    // Data parallel: torchrun's variables, the flags over them.
    ape::DistConfig dist = ape::DistConfig::from_env(dist_flags);
    if (*rank_opt) {
      ape::require_in("--rank", dist_flags.rank, 0, 1 << 20);  // (-1 is "not given")
      dist.rank = dist_flags.rank;
    }
    if (*world_opt) {
      ape::require_in("--world-size", dist_flags.world_size, 1, 1 << 20);  // 0 would mean "not distributed"
      dist.world_size = dist_flags.world_size;
    }
    if (!*rank_opt && !*world_opt && (std::getenv("RANK") != nullptr) != (std::getenv("WORLD_SIZE") != nullptr))
      std::cout << "[note] " << (std::getenv("RANK") ? "RANK" : "WORLD_SIZE") << " is set but "
                << (std::getenv("RANK") ? "WORLD_SIZE" : "RANK")
                << " is not (torchrun sets both): training as a single process\n";
    if (*local_opt) dist.local_rank = dist_flags.local_rank;
    if (*addr_opt) dist.master_addr = dist_flags.master_addr;
    if (*port_opt) dist.master_port = dist_flags.master_port;
    if ((dist.world_size > 0) != (dist.rank >= 0))
      throw std::invalid_argument("--rank and --world-size go together (or neither: torchrun's RANK and WORLD_SIZE)");
    // --world-size alone over torchrun's RANK: the ranks it adds never come (they waited out
    // --dist-timeout, 5 minutes by default).
    if (*world_opt && !*rank_opt)
      if (const char *env = std::getenv("WORLD_SIZE"); env && std::string(env) != std::to_string(dist.world_size))
        throw std::invalid_argument("--world-size " + std::to_string(dist.world_size) + " differs from torchrun's WORLD_SIZE " +
                                    env + ": leave --world-size out under torchrun, or give --rank with it");
    // A restart by torchrun (--max-restarts) of a command without --resume would start the run over
    // at step 0, its unfinished checkpoint set aside; a command with --resume continues from the
    // checkpoint it keeps writing.
    if (const char *restart = std::getenv("TORCHELASTIC_RESTART_COUNT");
        dist.enabled() && resume.empty() && restart && *restart && std::string(restart) != "0")
      throw std::invalid_argument(
          "torchrun restarted the workers (restart " + std::string(restart) +
          "), and this command would start the run over at step 0: to have torchrun's restarts continue a run, "
          "launch them with ape-train --resume OUT/NAME.ckpt once it has a checkpoint (now: the same torchrun "
          "command with ape-train --resume on the checkpoint this run wrote), or give torchrun --max-restarts 0");
    // Where to post a refusal, before the other settings are checked: one of them refused on
    // this rank reaches the others (--dist-backend mpi, a bad --local-rank).
    refusing = rendezvous_part(dist);
    if (refusing) who = "[rank " + std::to_string(dist.rank) + " of " + std::to_string(dist.world_size) + "] ";
    dist.validate();
    refusing = dist.enabled() ? std::optional<ape::DistConfig>(dist) : std::nullopt;
    ape::require_in("--threads", threads, 0, ape::kMaxThreads);
    const int64_t world = dist.enabled() ? dist.world_size : 1;
    root = !dist.enabled() || dist.rank == 0;
    if (dist.enabled()) who = "[rank " + std::to_string(dist.rank) + " of " + std::to_string(dist.world_size) + "] ";
    // Rank 0 prints; the others only their errors: their output goes nowhere (a stream left good,
    // so that output_status tells a silenced stream from one that could not be written).
    struct Discard : std::streambuf {
      int overflow(int c) override { return traits_type::not_eof(c); }
      std::streamsize xsputn(const char *, std::streamsize n) override { return n; }
    };
    if (!root) std::cout.rdbuf(new Discard);  // (never freed: std::cout flushes at exit)
    ec.multiples = ape::parse_multiples(multiples);
    ec.validate();

    // Ctrl-C and SIGTERM while the specs compile (a --spec, or the spec a checkpoint was trained
    // from: apec and the compiler, seconds to minutes): the compiler is ended, its work folder
    // removed, and ape-train exits 130 (ape::Stopped), as docs/reliability.md says; they had
    // killed ape-train outright (status 143, or ignored where a script started it in the
    // background). The dispositions it had come back before the group forms (below).
    struct StopWhileCompiling {
      void (*old_int)(int) = std::signal(SIGINT, on_stop_signal);
      void (*old_term)(int) = std::signal(SIGTERM, on_stop_signal);
      bool restored = false;
      void restore() {
        if (restored) return;
        restored = true;
        std::signal(SIGINT, old_int), std::signal(SIGTERM, old_term);
        if (g_stop) throw ape::Stopped("stopped (Ctrl-C or SIGTERM) before training began; nothing was written");
      }
      ~StopWhileCompiling() {
        if (!restored) std::signal(SIGINT, old_int), std::signal(SIGTERM, old_term);
      }
    } stop_while_compiling;

    std::unique_ptr<ape::Checkpoint> resumed;
    std::string resume_ckpt, resumed_device, resumed_precision;  // the run's own, where not given
    std::string run_device, run_precision;                       // the run's own, as recorded
    if (!resume.empty()) {
      // The run's own settings, from the checkpoint: the command line may not change them.
      for (CLI::Option *o : run_options)
        if (*o)
          throw std::invalid_argument("--resume continues the checkpoint's run with its own settings; " +
                                      o->get_name() + " cannot be given with it");
      // A link to a checkpoint: the file it names, resolved once, before it is read, is the one
      // this run reads, writes and whose folder it locks (written through the link, another run's
      // folder would be unlocked; retargeted during the run, another file would be replaced).
      {
        std::error_code link_ec;
        if (fs::is_symlink(resume, link_ec)) {
          const fs::path target = fs::weakly_canonical(resume, link_ec);
          if (!link_ec) resume = target.string();
        }
      }
      resumed = std::make_unique<ape::Checkpoint>(ape::read_checkpoint(resume));
      ape::register_checkpoint_spec(resumed->config, resume, spec_opts);  // trained from a spec file
      mc = ape::checked_model_config(*resumed);
      try {
        tc = ape::TrainConfig::from_json(resumed->config.at("train"));
      } catch (const std::exception &e) {
        throw std::runtime_error("checkpoint " + resume + ": bad training config: " + e.what());
      }
      encodings = {resumed->encoding};
      if (tc.world_size != world) {  // another number of ranks: the same global batch, split anew
        const int64_t global = tc.batch * tc.world_size;
        if (global % world != 0)
          throw std::invalid_argument("checkpoint " + resume + " was written by " + std::to_string(tc.world_size) +
                                      " data-parallel rank(s) with --batch " + std::to_string(tc.batch) +
                                      " (global batch " + std::to_string(global) + "); its data position cannot be "
                                      "split over " + std::to_string(world) + " ranks: resume with a number of "
                                      "ranks that divides " + std::to_string(global));
        std::cout << "[note] the run was trained by " << tc.world_size << " rank(s) with batch " << tc.batch
                  << "; it continues on " << world << " with batch " << global / world << " (global batch " << global
                  << ")\n";
        tc.batch = global / world;
        tc.world_size = world;
      }
      // The run's evaluation settings, unless given again.
      if (auto e = resumed->config.find("eval"); e != resumed->config.end() && e->is_object()) {
        try {
          if (!*multiples_opt) ec.multiples = e->at("multiples").get<std::vector<int64_t>>();
          if (!*tokens_opt) ec.tokens = e->at("tokens").get<int64_t>();
        } catch (const std::exception &ex) {
          throw std::runtime_error("checkpoint " + resume + ": bad evaluation settings: " + ex.what());
        }
        try {
          ec.validate();
        } catch (const std::exception &ex) {  // (the checkpoint's values, or those given again)
          throw std::runtime_error("checkpoint " + resume + ": bad evaluation settings: " + ex.what() +
                                   " (give --eval-multiples / --eval-tokens to replace them)");
        }
      }
      // The run's corpus and cache folders (recorded since they are kept in "data"), unless given
      // again or gone: a resumed run reads the same token ids without being told where they are.
      if (auto d = resumed->config.find("data"); d != resumed->config.end() && d->is_object()) {
        if (const auto v = d->find("vocab"); v != d->end() && !(v->is_number_integer() && v->get<int64_t>() == mc.vocab))
          throw std::runtime_error("checkpoint " + resume + ": its data's vocabulary (" + v->dump() +
                                   ") is not its model's (" + std::to_string(mc.vocab) + ")");
        std::error_code ec_fs;
        const std::string dir = d->value("dir", std::string()), cache = d->value("cache_dir", std::string());
        if (!*data_opt && !dir.empty() && fs::is_directory(dir, ec_fs)) data_dir = dir;
        if (!*cache_opt && !cache.empty() && fs::is_directory(cache, ec_fs)) cache_dir = cache;
      }
      const fs::path p(resume);  // (a link resolved above)
      out_dir = p.has_parent_path() ? p.parent_path().string() : ".";
      resume_ckpt = p.string();
      if (!*threads_opt) threads = tc.threads;  // any count gives the same bits (Train.h); the run's by default
      // The run's device type and precision by default: a bf16 GPU run goes on as one, not in f32
      // on the CPU (nor an f16 run without its loss scaling).
      // (On another device type, given, the precision is that device's default.)
      if (auto d = resumed->config.find("device"); d != resumed->config.end() && d->is_object()) {
        const std::string type = d->value("type", std::string());
        run_device = type, run_precision = d->value("precision", std::string());
        if (!*device_opt) resumed_device = type;
        if (!resumed_device.empty()) device_name = resumed_device;
        const bool same_type = device_name == type || (type == "cuda" && device_name.rfind("cuda:", 0) == 0);
        if (!*precision_opt && same_type) resumed_precision = d->value("precision", std::string());
        if (!resumed_precision.empty()) precision = resumed_precision;
      }
    } else {
      // (An encoding both named and defined by a spec file: refused before the spec compiles.)
      const std::vector<std::string> named = encodings;
      for (const auto &path : specs)
        encodings.push_back(ape::register_spec(path, spec_opts, [&](const std::string &name) {
                              if (std::find(named.begin(), named.end(), name) != named.end())
                                throw std::invalid_argument("encoding '" + name + "' is given twice: --spec " + path +
                                                            " defines it and --encoding names it (drop one)");
                            }).name);
      if (encodings.empty())
        throw std::invalid_argument("no encoding given: pass --encoding NAME (see --list) or --spec FILE");
      ape::require_in("--seed", seed, 0, INT64_MAX);
      tc.seed = static_cast<uint64_t>(seed);
      tc.steps = steps;
      tc.minutes = minutes;
      if (!*steps_opt && !*minutes_opt) tc.minutes = 2.0;
      if (*steps_opt && !*minutes_opt) tc.minutes = 0.0;
      tc.threads = threads;
      tc.world_size = world;
      if (!init_from.empty()) {
        // Fine-tuning: one encoding, the model's size from the checkpoint (a size given on the command
        // line must agree with it).
        if (encodings.size() != 1)
          throw std::invalid_argument("--init-from fine-tunes one encoding; " + std::to_string(encodings.size()) +
                                      " were given");
        const ape::Checkpoint init = ape::read_checkpoint(init_from);
        ape::register_checkpoint_spec(init.config, init_from, spec_opts);  // trained from a spec file
        const ape::ModelConfig from = ape::checked_model_config(init);
        for (auto [opt, given, has] : {std::tuple{"--d-model", mc.d_model, from.d_model},
                                       std::tuple{"--layers", mc.layers, from.layers},
                                       std::tuple{"--heads", mc.heads, from.heads},
                                       std::tuple{"--vocab", mc.vocab, from.vocab}})
          if (app.count(opt) && given != has)
            throw std::invalid_argument(std::string(opt) + " " + std::to_string(given) + " differs from the model of " +
                                        init_from + " (" + std::to_string(has) + "); --init-from takes its size");
        // --kv-heads 0 means every head: of --heads where given, else of the checkpoint's model.
        const int64_t kv_given = mc.kv_heads > 0 ? mc.kv_heads : app.count("--heads") ? mc.heads : from.heads;
        if (app.count("--kv-heads") && kv_given != from.key_heads())
          throw std::invalid_argument("--kv-heads " + std::to_string(mc.kv_heads) +
                                      (mc.kv_heads == 0 ? " (every head: " + std::to_string(kv_given) + ")" : "") +
                                      " differs from the model of " + init_from + " (" +
                                      std::to_string(from.key_heads()) + " key/value head" +
                                      (from.key_heads() == 1 ? "" : "s") + "); --init-from takes its size");
        const std::string enc = mc.encoding;
        mc = from;
        mc.encoding = enc;
        // The checkpoint this run writes must not be the one it starts from (its first save would
        // replace the weights it was fine-tuned from).
        std::error_code eq_ec;
        const fs::path written = fs::path(out_dir) / (encodings[0] + ".ckpt");
        if (fs::exists(written, eq_ec) && fs::equivalent(init_from, written, eq_ec))
          throw std::invalid_argument("--init-from " + init_from + " is the checkpoint this run writes (" +
                                      written.string() + "): copy it elsewhere first, or give another --out");
      }
    }
    Start start;
    start.init_from = init_from;
    std::error_code abs_ec;
    start.data_dir = fs::absolute(data_dir, abs_ec).lexically_normal().string();
    start.cache_dir = fs::absolute(cache_dir, abs_ec).lexically_normal().string();
    start.sets = ape::parse_assignments(set_args);
    // Several ranks on one machine share its cores (torchrun says how many ranks: LOCAL_WORLD_SIZE).
    if (dist.enabled() && threads == 0)
      if (const char *lws = std::getenv("LOCAL_WORLD_SIZE"); lws && std::atoi(lws) > 0)
        threads = std::max<int64_t>(1, int64_t(std::thread::hardware_concurrency()) / std::atoi(lws));
    (void)out_opt;
    std::set<std::string> seen;
    for (const auto &e : encodings) {
      if (!seen.insert(e).second) throw std::invalid_argument("encoding '" + e + "' is given twice");
      ape::find_kernel(e);  // unknown name: fail now, before any work, with the list of names
    }
    // One GPU per rank: plain "cuda" is this machine's rank's (torchrun's LOCAL_RANK, else the
    // rank), or the one GPU a rank sees where CUDA_VISIBLE_DEVICES shows it one (a launcher that
    // gives each rank its own). The NCCL group reduces on the model's GPU.
    const bool own_gpu = std::getenv("CUDA_VISIBLE_DEVICES") && ape::visible_gpus() == 1;
    if (device_name == "cuda" && dist.enabled() && (dist.local_rank >= 0 ? dist.local_rank : dist.rank) > 0 &&
        !own_gpu)
      device_name = "cuda:" + std::to_string(dist.local_rank >= 0 ? dist.local_rank : dist.rank);
    const ape::ComputeDevice device = [&] {
      try {
        return ape::choose_device(device_name, precision);
      } catch (const std::invalid_argument &e) {
        if (resumed_device.empty() && resumed_precision.empty()) throw;
        throw std::invalid_argument(std::string(e.what()) + " (--resume " + resume + ": the run trained on " +
                                    run_device + " in " + run_precision + ", and resumes there unless --device and "
                                    "--precision say otherwise, e.g. --device cpu)");
      }
    }();
    if (dist.enabled() && device.is_cuda()) {  // gradients on the GPU: NCCL reduces them in place
      if (dist.backend == "gloo")
        throw std::invalid_argument("--dist-backend gloo with --device " + device.device.str() +
                                    ": this build's Gloo group reduces CPU tensors; use --dist-backend nccl (the "
                                    "default with a GPU)");
      dist.backend = "nccl";
      dist.gpu = device.device.index();
    }
    tc.progress_in_place = ::isatty(STDOUT_FILENO);
    tc.progress = root;
    tc.validate();
    // (before the model's check, whose range is a checkpoint's: [2, 2^20])
    if (mc.vocab < 300 || mc.vocab > 65535)
      throw std::invalid_argument("--vocab must be a whole number in [300, 65535]; got " + std::to_string(mc.vocab));
    mc.validate();
    for (const auto &e : encodings) {  // fail now on what would fail after hours of training
      ape::ModelConfig probe = mc;
      probe.encoding = e;
      const auto &m = ape::manifest_of(ape::find_kernel(e));
      if (m.inference_only) throw std::invalid_argument(ape::inference_only_message(e));
      ape::check_model_width(m, mc.d_model);
      if (m.embedding && m.embedding->kind == ape::EmbeddingSpec::Kind::Learned && tc.seq_len > m.embedding->max_length)
        throw std::invalid_argument("encoding '" + e + "': learned absolute positions: sequence length " +
                                    std::to_string(tc.seq_len) + " exceeds the table's max_length " +
                                    std::to_string(m.embedding->max_length) + " (lower --seq-len)");
      if (m.rotation)
        if (std::string why = ape_rules::checkRotation(m.rotation->fraction, probe.head_dim()); !why.empty())
          throw std::invalid_argument("encoding '" + e + "' rotates q/k pairs: " + why +
                                      "; choose --d-model / --heads so that head_dim = d_model / heads fits");
      if (!resumed) {  // every encoding's --set, before the first trains
        for (const auto &[param, value] : start.sets) {
          try {
            ape::check_fixed_param(m, param, value);
          } catch (const std::exception &ex) {
            throw std::invalid_argument("--set " + param + ": " + ex.what());
          }
        }
      }
      ape::check_encoding_on(device, ape::find_kernel(e), probe.head_dim(), &std::cout);
    }
    if (device.device.is_cpu()) {
      // The least a training step takes on the CPU: the weights, their gradients and AdamW's two
      // moments, 16 bytes per fp32 element (the loss's logits come in chunks of a few MiB:
      // LmLoss.h). Past what the machine has, the allocations succeeded (overcommit) and the OOM
      // killer ended the run, and maybe others, without a word.
      const double need = 16.0 * double(mc.min_elements());
      const uint64_t have = ape::available_memory_bytes();
      if (have > 0 && need > double(have)) {
        char b[256];
        std::snprintf(b, sizeof b,
                      "the model needs at least %.1f GiB to train (its weights, their gradients and AdamW's "
                      "moments: %.3g elements) and this machine has %.1f GiB available: lower --d-model, "
                      "--layers or --vocab",
                      need / 1073741824.0, double(mc.min_elements()), double(have) / 1073741824.0);
        throw std::invalid_argument(b);
      }
    }
    ape::set_threads(threads);
    const std::string cpu_level = ape::checked_kernel_cpu_level();  // throws on a bad APE_CPU_LEVEL
    std::cout << "[cpu] kernels: " << cpu_level << "\n";

    // The group forms once the command line is known good on this rank: from here on, a rank that
    // fails makes the others fail at their next collective instead of waiting.
    stop_while_compiling.restore();
    std::unique_ptr<ape::DataParallel> dp;
    refusing.reset();  // from here on a failure reaches the others through the group
    if (dist.enabled()) dp = ape::DataParallel::join(dist, &std::cout);
    // What rank 0 alone checks comes after the group forms: its failure then ends the others at
    // their next collective (before, they waited out --dist-timeout on a rank that never joined).
    if (root) {
      if (!resume_ckpt.empty())  // the checkpoint resumed is the one written
        ape::check_writable(out_dir, fs::path(resume_ckpt).filename().string());
      else
        for (const auto &e : encodings) ape::check_writable(out_dir, e + ".ckpt");
      ape::check_writable(out_dir, "results.csv");
    }
    // One run per output folder: a second would replace this one's checkpoints and results.csv.
    std::unique_ptr<ape::FolderLock> out_lock;
    if (root)
      out_lock = std::make_unique<ape::FolderLock>(
          out_dir, "another ape-train is writing its checkpoints there; wait for it, or pass another --out");
    // Ctrl-C and SIGTERM stop the run at its next step, with a checkpoint, from here on; before,
    // while nothing is written (a rank waiting for the others to join), they end the process.
    std::signal(SIGINT, on_stop_signal);
    std::signal(SIGTERM, on_stop_signal);
    if (dp) {
      // What the trainer's check does not cover: the encodings each rank trains in turn and the
      // evaluation, whose sums the ranks add (different lists left a rank to exit 0 alone,
      // different lengths or tokens gave wrong rows or a Gloo abort).
      std::string run = "encodings";
      for (const auto &e : encodings) {  // (a --spec's by its text: one name, two specs had trained mixed)
        run += " " + e;
        if (const ape::SpecLibrary *lib = ape::registered_spec(e)) run += " (spec " + lib->spec_hash + ")";
      }
      run += "; eval tokens " + std::to_string(ec.tokens) + " batch " + std::to_string(ec.batch_tokens) + " multiples";
      for (int64_t m : ec.multiples) run += " " + std::to_string(m);
      dp->check_same(ape::fnv1a(run.data(), run.size()),
                     "the run's encoding list, their --spec files' text and the evaluation config (-e, --spec, "
                     "--eval-multiples, --eval-tokens)");
      // How the run starts: rank 0's model is broadcast, so a rank given another --set or
      // --init-from would train rank 0's start silently. (The checkpoint by its name and size: its
      // path may differ between machines.)
      std::string how;
      auto sets = start.sets;  // (in any order: the same params set)
      std::sort(sets.begin(), sets.end());
      for (const auto &[param, value] : sets) {
        uint64_t bits = 0;
        std::memcpy(&bits, &value, sizeof bits);
        how += param + "=" + std::to_string(bits) + ";";
      }
      if (!init_from.empty()) {
        std::error_code size_ec;
        how += " from " + fs::path(init_from).filename().string() + " of " +
               std::to_string(fs::file_size(init_from, size_ec)) + " bytes";
      }
      dp->check_same(ape::fnv1a(how.data(), how.size()), "how the run starts (--set, --init-from)");
    }

    ape::DataOptions dopt;
    dopt.data_dir = data_dir;
    dopt.cache_dir = cache_dir;
    dopt.vocab = mc.vocab;
    dopt.log = &std::cout;
    // Data parallel: the first rank of each machine prepares the corpus cache (unpacking, tokenizer,
    // token ids) while the others wait, then they read it.
    const bool prepares = !dp || (dist.local_rank >= 0 ? dist.local_rank == 0 : dist.rank == 0);
    std::optional<ape::Corpus> opened;
    if (prepares) opened = ape::Corpus::open(dopt);
    if (dp) dp->barrier("preparing the corpus cache");
    if (!prepares) opened = ape::Corpus::open(dopt);
    const ape::Corpus &corpus = *opened;
    std::cout << "[data] train " << corpus.train().size() << " tokens in " << corpus.train().num_docs()
              << " books; test " << corpus.test().size() << " tokens in " << corpus.test().num_docs()
              << " books\n";
    if (dp) {  // every rank's token ids: another corpus (or tokenizer) on one rank had trained mixed data
      std::string ids = corpus.tokenizer_hash();
      for (const ape::TokenSplit *split : {&corpus.train(), &corpus.valid(), &corpus.test()})
        ids += ";" + std::to_string(ape::fnv1a(split->ids.data(), split->ids.size() * sizeof(int32_t)));
      dp->check_same(ape::fnv1a(ids.data(), ids.size()),
                     "the corpus's tokenizer and token ids (--data, --cache-dir: the same books and tokenizer on "
                     "every rank)");
    }
    if (resumed) {
      const auto &d = resumed->config.value("data", nlohmann::json::object());
      const std::string tok = d.is_object() ? d.value("tokenizer_fnv", std::string()) : std::string();
      if (!tok.empty() && !corpus.tokenizer_is(tok))
        throw std::runtime_error("checkpoint " + resume + " was trained with a different tokenizer (" + tok + ") than " +
                                 corpus.tokenizer_path() + " (" + corpus.tokenizer_hash() +
                                 "); pass the --data and --cache-dir used for training");
    }

    if (!init_from.empty()) {  // the weights were trained on the same token ids
      const ape::Checkpoint init = ape::read_checkpoint(init_from);
      const auto &d = init.config.value("data", nlohmann::json::object());
      const std::string tok = d.is_object() ? d.value("tokenizer_fnv", std::string()) : std::string();
      if (!tok.empty() && !corpus.tokenizer_is(tok))
        throw std::runtime_error("--init-from " + init_from + ": trained with a different tokenizer (" + tok +
                                 ") than " + corpus.tokenizer_path() + " (" + corpus.tokenizer_hash() +
                                 "); pass the --data and --cache-dir it was trained with");
    }
    // The evaluation after training must fit the test books: found now, not after hours of training.
    ape::check_eval_fits(corpus.test(), tc.seq_len, ec, "test");
    std::string budget;
    if (tc.steps > 0) budget = std::to_string(tc.steps) + " steps";
    if (tc.minutes > 0) {
      char b[64];
      std::snprintf(b, sizeof b, "%s%g min", budget.empty() ? "" : " or ", tc.minutes);
      budget += b;
    }
    std::vector<ape::EvalRow> all_rows;
    std::vector<std::string> diverged, nonfinite;
    const std::string csv = (fs::path(out_dir) / "results.csv").string();
    // Each encoding's rows replace its own rows of results.csv only: a resumed encoding of a run of
    // several, or the encodings it did not reach trained after it, keep the others'.
    const bool merge_rows = true;
    // The rows results.csv gets: all but a diverged encoding's (its checkpoint on disk is the one
    // written before, whose rows there stay; NaN rows would replace them), which the table shows.
    auto saved_rows = [&] {
      std::vector<ape::EvalRow> out;
      for (const auto &r : all_rows)
        if (std::find(diverged.begin(), diverged.end(), r.encoding) == diverged.end()) out.push_back(r);
      return out;
    };
    for (size_t n = 0; n < encodings.size(); ++n) {
      const std::string &name = encodings[n];
      // Ctrl-C or SIGTERM during the last encoding's evaluation: no next encoding starts (it would
      // stop at its first step and replace that encoding's checkpoint). Data-parallel ranks agree
      // on it (a signal during an evaluation reaches one rank; the training loop agrees on its own).
      if (n > 0 && any_rank_stopped(dp.get(), "after " + encodings[n - 1])) {
        std::string rest;
        for (size_t k = n; k < encodings.size(); ++k) rest += (rest.empty() ? "" : ", ") + encodings[k];
        if (root) ape::write_csv(csv, saved_rows(), merge_rows);
        throw Interrupted("ape-train: stopped (Ctrl-C or SIGTERM) after " + encodings[n - 1] +
                          "; not trained: " + rest + " (results so far -> " + csv + ")");
      }
      const std::string ckpt = resumed ? resume_ckpt : (fs::path(out_dir) / (name + ".ckpt")).string();
      // A finished run there, kept aside until this one finishes (keep_previous; a resumed run
      // finishes what its first part began: the checkpoint records it).
      KeptAside kept;
      kept.ckpt = ckpt;
      if (root && !resumed) {
        kept.previous = keep_previous(ckpt);
      } else if (root) {
        const auto r = resumed->config.find("replaces");
        if (r != resumed->config.end() && r->is_string()) kept.previous = replaced_beside(ckpt, r->get<std::string>());
      }
      Start run_start = start;
      run_start.replaces = kept.previous;
      std::vector<ape::EvalRow> rows;
      try {
        rows = train_one(name, mc, tc, corpus, ec, ckpt, resumed.get(), budget, dp.get(), device, run_start);
        kept.finished();
      } catch (const Interrupted &e) {
        // The encodings after it were not trained: the message names them (--resume continues only
        // the interrupted one).
        if (n + 1 == encodings.size()) throw;
        std::string rest;
        for (size_t k = n + 1; k < encodings.size(); ++k) rest += (rest.empty() ? "" : ",") + encodings[k];
        throw Interrupted(std::string(e.what()) + "; not trained yet: " + rest + " (then: ape-train -e " + rest +
                          " --out " + out_dir + " and this run's other flags)");
      } catch (const ape::TrainingDiverged &e) {
        // Reported (by rank 0: every rank stops at the same step); the other encodings still train.
        std::cout << std::flush;
        if (root) std::cerr << "ape-train: error: " << ape::error_text(e) << "\n";
        kept.ended();
        diverged.push_back(name);
        for (int64_t m : ec.multiples) {
          ape::EvalRow r;
          r.encoding = name;
          r.train_len = tc.seq_len;
          r.eval_len = tc.seq_len * m;
          r.multiple = m;
          r.loss = r.ppl = NAN;
          r.note = "training stopped: diverged (see the error above)";
          rows.push_back(r);
        }
      }
      // A length where the trained model computes NaN or inf: a number no one can use, said in the
      // row and by the exit status (ape-eval refuses the same).
      for (auto &r : rows)
        if (!r.skipped() && !std::isfinite(r.loss)) {
          r.note = "non-finite loss: the model computes NaN or inf at this length";
          nonfinite.push_back(name + " at " + std::to_string(r.multiple) + "x");
        }
      all_rows.insert(all_rows.end(), rows.begin(), rows.end());
      if (root) ape::write_csv(csv, saved_rows(), merge_rows);  // after every encoding, so partial results survive
    }
    std::cout << "\n";
    ape::print_table(std::cout, all_rows,
                     "Held-out test books (" + std::to_string(corpus.test().num_docs()) +
                         "), cells: mean token loss / perplexity; trained at L = " + std::to_string(tc.seq_len));
    std::cout << "\nresults -> " << csv << "\n";
    if (any_rank_stopped(dp.get(), "after the last evaluation")) {  // which finished: its results are in
      std::cerr << "ape-train: stopped (Ctrl-C or SIGTERM) during the evaluation, after it finished\n";
      return 130;
    }
    if (!diverged.empty()) {
      if (!root) return 1;
      std::string names;
      for (const auto &n : diverged) names += (names.empty() ? "" : ", ") + n;
      std::cerr << "ape-train: error: " << diverged.size() << " of " << encodings.size()
                << " encodings stopped training (diverged): " << names << "\n";
      return 1;
    }
    if (!nonfinite.empty()) {
      if (!root) return 1;
      std::string cells;
      for (const auto &c : nonfinite) cells += (cells.empty() ? "" : ", ") + c;
      std::cerr << "ape-train: error: the evaluation gave a non-finite loss (" << cells
                << "): the trained model computes NaN or inf there\n";
      return 1;
    }
    return 0;
  } catch (const Interrupted &e) {
    std::cout << std::flush;
    if (root) std::cerr << ape::error_text(e) << "\n";  // rank 0's (the others stop at the same step)
    return 130;
  } catch (const ape::Stopped &e) {  // Ctrl-C or SIGTERM reached the tokenizer's trainer first
    std::cout << std::flush;
    std::cerr << "ape-train: stopped: " << who << ape::error_text(e) << "\n";
    return 130;
  } catch (const ape::GroupError &e) {  // names its rank
    std::cout << std::flush;
    std::cerr << "ape-train: error: " << ape::error_text(e) << "\n";
    return 1;
  } catch (const std::exception &e) {
    std::cout << std::flush;
    std::string text = ape::error_text(e);
    if (text.find("can't allocate memory") != std::string::npos || text.find("out of memory") != std::string::npos)
      text += " (the model and its batch do not fit in this machine's memory: lower --batch, --seq-len, --d-model "
              "or --layers)";
    std::cerr << "ape-train: error: " << who << text << "\n";
    if (refusing) ape::DataParallel::refuse_to_join(*refusing, text);
    return 1;
  }
}

int main(int argc, char **argv) {
  ape::ignore_broken_pipes();
  return ape::output_status(tool_main(argc, argv), "ape-train");
}
