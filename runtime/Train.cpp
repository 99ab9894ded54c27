// The training loop and checkpoint files.
#include "runtime/Train.h"

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <set>
#include <sstream>

#include <torch/nn/utils/clip_grad.h>
#include <torch/optim/adamw.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include "ape/kernel_entry.h"
#include "runtime/Registry.h"

namespace fs = std::filesystem;

namespace ape {

// ---- configuration ---------------------------------------------------------------------------------

void TrainConfig::validate() const {
  auto need = [](bool ok, const std::string &msg) {
    if (!ok) throw std::invalid_argument("training config: " + msg);
  };
  need(steps > 0 || minutes > 0, "give a budget: --steps N and/or --minutes M (both are 0)");
  need(steps >= 0 && minutes >= 0, "steps and minutes must be >= 0");
  need(batch > 0, "batch must be > 0, got " + std::to_string(batch));
  need(seq_len > 0, "seq_len must be > 0, got " + std::to_string(seq_len));
  need(lr > 0 && std::isfinite(lr), "lr must be > 0");
  need(min_lr_frac >= 0 && min_lr_frac <= 1, "min_lr_frac must be in [0, 1]");
  need(warmup_steps >= 0, "warmup_steps must be >= 0");
  need(weight_decay >= 0, "weight_decay must be >= 0");
  need(grad_clip > 0, "grad_clip must be > 0");
}

nlohmann::json TrainConfig::to_json() const {
  return {{"steps", steps},
          {"minutes", minutes},
          {"batch", batch},
          {"seq_len", seq_len},
          {"lr", lr},
          {"min_lr_frac", min_lr_frac},
          {"warmup_steps", warmup_steps},
          {"weight_decay", weight_decay},
          {"betas", {beta1, beta2}},
          {"grad_clip", grad_clip},
          {"seed", seed}};
}

nlohmann::json TrainResult::to_json() const {
  return {{"steps", steps},
          {"seconds", seconds},
          {"tokens_per_second", tokens_per_second},
          {"first_loss", first_loss},
          {"final_loss", final_loss}};
}

double learning_rate(const TrainConfig &cfg, int64_t step, double progress) {
  int64_t warm = cfg.warmup_steps;
  if (cfg.steps > 0) warm = std::min<int64_t>(warm, cfg.steps / 5);
  const double w = warm > 0 ? std::min(1.0, double(step + 1) / double(warm)) : 1.0;
  const double p = std::clamp(progress, 0.0, 1.0);
  const double cosine = cfg.min_lr_frac + (1.0 - cfg.min_lr_frac) * 0.5 * (1.0 + std::cos(M_PI * p));
  return cfg.lr * w * cosine;
}

// ---- loop --------------------------------------------------------------------------------------------

namespace {

std::string clock_str(double s) {
  if (!std::isfinite(s) || s < 0) return "--:--";
  const long t = std::lround(s);
  char buf[32];
  if (t >= 3600) std::snprintf(buf, sizeof buf, "%ld:%02ld:%02ld", t / 3600, (t / 60) % 60, t % 60);
  else std::snprintf(buf, sizeof buf, "%ld:%02ld", t / 60, t % 60);
  return buf;
}

std::string rate_str(double tps) {
  char buf[32];
  if (tps >= 1e6) std::snprintf(buf, sizeof buf, "%.2fM", tps / 1e6);
  else if (tps >= 1e3) std::snprintf(buf, sizeof buf, "%.1fk", tps / 1e3);
  else std::snprintf(buf, sizeof buf, "%.0f", tps);
  return buf;
}

}  // namespace

TrainResult train(LanguageModel &model, TrainSampler &sampler, const TrainConfig &cfg, std::ostream &out,
                  const std::string &label) {
  cfg.validate();
  using clock = std::chrono::steady_clock;

  // Weight decay on matrices (Linear and Embedding weights) only.
  std::vector<torch::Tensor> decay, no_decay;
  for (const auto &kv : model->named_parameters()) {
    const std::string &name = kv.key();
    const bool is_weight = name.size() >= 7 && name.compare(name.size() - 7, 7, ".weight") == 0;
    (is_weight && kv.value().dim() >= 2 ? decay : no_decay).push_back(kv.value());
  }
  auto opts = [&](double wd) {
    return std::make_unique<torch::optim::AdamWOptions>(
        torch::optim::AdamWOptions(cfg.lr).betas({cfg.beta1, cfg.beta2}).eps(1e-8).weight_decay(wd));
  };
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(decay, opts(cfg.weight_decay));
  if (!no_decay.empty()) groups.emplace_back(no_decay, opts(0.0));
  torch::optim::AdamW opt(groups, torch::optim::AdamWOptions(cfg.lr));
  std::vector<torch::Tensor> params = model->parameters();

  model->train();
  const double budget_s = cfg.minutes * 60.0;
  const int64_t tokens_per_step = cfg.batch * cfg.seq_len;
  TrainResult res;
  const auto t0 = clock::now();
  auto last_print = t0 - std::chrono::seconds(10);
  double elapsed = 0;
  std::string prefix = label.empty() ? "" : "[" + label + "] ";
  size_t last_width = 0;

  for (int64_t step = 0;; ++step) {
    elapsed = std::chrono::duration<double>(clock::now() - t0).count();
    const double p_steps = cfg.steps > 0 ? double(step) / double(cfg.steps) : 0.0;
    const double p_time = budget_s > 0 ? elapsed / budget_s : 0.0;
    const double progress = std::max(p_steps, p_time);
    if (progress >= 1.0) break;

    const double lr = learning_rate(cfg, step, progress);
    for (auto &g : opt.param_groups()) static_cast<torch::optim::AdamWOptions &>(g.options()).lr(lr);

    torch::Tensor windows = sampler.next(cfg.batch, cfg.seq_len + 1);
    opt.zero_grad();
    torch::Tensor loss = model->loss(windows);
    const double l = loss.item<double>();
    if (!std::isfinite(l)) {
      if (cfg.progress && cfg.progress_in_place) out << "\n";
      throw TrainingDiverged((label.empty() ? std::string() : label + ": ") + "loss became " +
                             (std::isnan(l) ? "NaN" : "inf") + " at step " + std::to_string(step + 1) +
                             " (lr " + std::to_string(lr) +
                             "); training stopped and nothing was saved. Try a lower --lr.");
    }
    loss.backward();
    const double gnorm = torch::nn::utils::clip_grad_norm_(params, cfg.grad_clip);
    if (!std::isfinite(gnorm)) {
      if (cfg.progress && cfg.progress_in_place) out << "\n";
      throw TrainingDiverged((label.empty() ? std::string() : label + ": ") +
                             "gradient norm became non-finite at step " + std::to_string(step + 1) +
                             " (loss " + std::to_string(l) + ", lr " + std::to_string(lr) +
                             "); training stopped and nothing was saved. Try a lower --lr.");
    }
    opt.step();
    res.losses.push_back(l);
    res.steps = step + 1;

    if (cfg.progress) {
      const auto now = clock::now();
      elapsed = std::chrono::duration<double>(now - t0).count();
      const double since = std::chrono::duration<double>(now - last_print).count();
      const bool done_soon = (cfg.steps > 0 && step + 1 >= cfg.steps) || (budget_s > 0 && elapsed >= budget_s);
      if (since >= (cfg.progress_in_place ? 0.2 : 15.0) || step == 0 || done_soon) {
        last_print = now;
        const double tps = elapsed > 0 ? double(res.steps * tokens_per_step) / elapsed : 0.0;
        double left = INFINITY;
        if (cfg.steps > 0) left = double(cfg.steps - res.steps) * elapsed / double(res.steps);
        if (budget_s > 0) left = std::min(left, budget_s - elapsed);
        std::ostringstream line;
        line << prefix << "step " << res.steps;
        if (cfg.steps > 0) line << "/" << cfg.steps;
        line << "  loss " << std::fixed << std::setprecision(4) << l << "  lr " << std::scientific
             << std::setprecision(2) << lr << "  " << rate_str(tps) << " tok/s  " << clock_str(elapsed)
             << " elapsed, " << clock_str(std::max(0.0, left)) << " left";
        std::string s = line.str();
        if (cfg.progress_in_place) {
          const size_t w = s.size();
          if (w < last_width) s += std::string(last_width - w, ' ');
          last_width = w;
          out << "\r" << s << std::flush;
        } else {
          out << s << "\n" << std::flush;
        }
      }
    }
  }
  if (cfg.progress && cfg.progress_in_place && last_width) out << "\n";

  res.seconds = std::chrono::duration<double>(clock::now() - t0).count();
  res.tokens_per_second = res.seconds > 0 ? double(res.steps * tokens_per_step) / res.seconds : 0.0;
  if (!res.losses.empty()) {
    res.first_loss = res.losses.front();
    const size_t n = std::min<size_t>(20, res.losses.size());
    double s = 0;
    for (size_t i = res.losses.size() - n; i < res.losses.size(); ++i) s += res.losses[i];
    res.final_loss = s / double(n);
  }
  return res;
}

// ---- checkpoints ------------------------------------------------------------------------------------

namespace {
constexpr char kCkptMagic[8] = {'A', 'P', 'E', 'C', 'K', 'P', 'T', '1'};

template <typename T> void append(std::string &buf, const T &v) {
  buf.append(reinterpret_cast<const char *>(&v), sizeof(T));
}

// Every parameter and buffer by its dotted name.
std::vector<std::pair<std::string, torch::Tensor>> state_of(LanguageModel &model) {
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (const auto &kv : model->named_parameters()) out.emplace_back(kv.key(), kv.value());
  for (const auto &kv : model->named_buffers()) out.emplace_back(kv.key(), kv.value());
  return out;
}
}  // namespace

void save_checkpoint(const std::string &path, LanguageModel &model, const nlohmann::json &config_in) {
  nlohmann::json config = config_in;
  config["model"] = model->config().to_json();

  torch::serialize::OutputArchive archive;
  for (const auto &[name, t] : state_of(model)) archive.write(name, t.detach());
  std::ostringstream payload;
  archive.save_to(payload);
  const std::string p = payload.str();

  const std::string enc = model->config().encoding;
  const std::string cfg = config.dump();
  std::string buf(kCkptMagic, 8);
  append(buf, kCheckpointVersion);
  append(buf, static_cast<uint32_t>(enc.size()));
  buf += enc;
  append(buf, static_cast<uint64_t>(cfg.size()));
  buf += cfg;
  append(buf, static_cast<uint64_t>(p.size()));
  buf += p;
  append(buf, fnv1a(buf.data(), buf.size()));

  fs::path fp(path);
  if (fp.has_parent_path()) fs::create_directories(fp.parent_path());
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream o(tmp, std::ios::binary | std::ios::trunc);
    if (!o) throw std::runtime_error("cannot write checkpoint " + tmp + ": " + std::strerror(errno));
    o.write(buf.data(), static_cast<std::streamsize>(buf.size()));
    o.flush();
    if (!o) {
      std::error_code ec;
      fs::remove(tmp, ec);
      throw std::runtime_error("writing checkpoint " + tmp + " failed (disk full?); " + path + " is untouched");
    }
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) {
    fs::remove(tmp, ec);
    throw std::runtime_error("cannot rename " + tmp + " to " + path + ": " + ec.message());
  }
}

Checkpoint read_checkpoint(const std::string &path) {
  auto fail = [&](const std::string &why) { return std::runtime_error("checkpoint " + path + ": " + why); };
  std::ifstream f(path, std::ios::binary);
  if (!f) throw fail(std::string("cannot open: ") + std::strerror(errno));
  std::ostringstream ss;
  ss << f.rdbuf();
  const std::string buf = ss.str();
  size_t pos = 0;
  auto take = [&](size_t n, const char *what) {
    if (buf.size() < pos + n)
      throw fail(std::string("truncated while reading ") + what + " (file has " + std::to_string(buf.size()) +
                 " bytes); it was not written completely");
    const char *p = buf.data() + pos;
    pos += n;
    return p;
  };
  if (buf.size() < 8 || std::memcmp(buf.data(), kCkptMagic, 8) != 0)
    throw fail("not an APE checkpoint (bad magic number; expected \"APECKPT1\")");
  pos = 8;
  uint32_t version, name_len;
  std::memcpy(&version, take(4, "the version"), 4);
  if (version != kCheckpointVersion)
    throw fail("format version " + std::to_string(version) + ", this build reads version " +
               std::to_string(kCheckpointVersion));
  std::memcpy(&name_len, take(4, "the encoding name"), 4);
  if (name_len == 0 || name_len > 1024) throw fail("corrupt encoding name length " + std::to_string(name_len));
  Checkpoint c;
  c.encoding.assign(take(name_len, "the encoding name"), name_len);
  uint64_t cfg_len, payload_len, checksum;
  std::memcpy(&cfg_len, take(8, "the config length"), 8);
  if (cfg_len > buf.size() - pos)
    throw fail("truncated or damaged: the config needs " + std::to_string(cfg_len) + " bytes, " +
               std::to_string(buf.size() - pos) + " remain");
  std::string cfg(take(cfg_len, "the config"), cfg_len);
  std::memcpy(&payload_len, take(8, "the payload length"), 8);
  if (payload_len > buf.size() - pos)
    throw fail("truncated: the parameters need " + std::to_string(payload_len) + " bytes, " +
               std::to_string(buf.size() - pos) + " remain (the file was not written completely)");
  c.payload.assign(take(payload_len, "the parameters"), payload_len);
  const size_t body = pos;
  std::memcpy(&checksum, take(8, "the checksum"), 8);
  if (pos != buf.size()) throw fail(std::to_string(buf.size() - pos) + " unexpected trailing bytes (corrupt)");
  if (checksum != fnv1a(buf.data(), body)) throw fail("checksum mismatch: the file is corrupt");
  try {
    c.config = nlohmann::json::parse(cfg);
  } catch (const std::exception &e) {
    throw fail(std::string("config is not valid JSON: ") + e.what());
  }
  if (!c.config.is_object() || !c.config.contains("model")) throw fail("config has no \"model\" section");
  return c;
}

void load_state(LanguageModel &model, const Checkpoint &ckpt, const std::string &path) {
  auto fail = [&](const std::string &why) { return std::runtime_error("checkpoint " + path + ": " + why); };
  if (ckpt.encoding != model->config().encoding)
    throw fail("it holds encoding '" + ckpt.encoding + "', but the model is '" + model->config().encoding + "'");
  torch::serialize::InputArchive archive;
  try {
    std::istringstream in(ckpt.payload);
    archive.load_from(in);
  } catch (const std::exception &e) {
    std::string msg = e.what();
    throw fail("cannot read the parameter payload: " + msg.substr(0, msg.find('\n')));
  }
  torch::NoGradGuard no_grad;
  std::set<std::string> buffers;
  for (const auto &kv : model->named_buffers()) buffers.insert(kv.key());
  for (auto &[name, t] : state_of(model)) {
    torch::Tensor saved;
    if (!archive.try_read(name, saved)) {
      // A fixed param the encoding gained after the checkpoint was written keeps its initial value.
      if (buffers.count(name)) continue;
      throw fail("missing tensor '" + name + "' (saved by a different model layout?)");
    }
    if (saved.sizes() != t.sizes()) {
      std::ostringstream s;
      s << "tensor '" << name << "' has shape " << saved.sizes() << ", the model expects " << t.sizes()
        << " (different --d-model/--heads/--layers/vocab?)";
      throw fail(s.str());
    }
    t.copy_(saved);
  }
}

namespace {
torch::serialize::InputArchive open_payload(const Checkpoint &ckpt, const std::string &path) {
  torch::serialize::InputArchive archive;
  try {
    std::istringstream in(ckpt.payload);
    archive.load_from(in);
  } catch (const std::exception &e) {
    std::string msg = e.what();
    throw std::runtime_error("checkpoint " + path + ": cannot read the parameter payload: " +
                             msg.substr(0, msg.find('\n')));
  }
  return archive;
}

std::string shape_str(at::IntArrayRef s) {
  std::ostringstream o;
  o << s;
  return o.str();
}
}  // namespace

std::vector<std::string> load_state_across(LanguageModel &model, const Checkpoint &ckpt, const std::string &path,
                                           const KernelEntry *source) {
  const std::string to = model->config().encoding, from = ckpt.encoding;
  auto fail = [&](const std::string &why) {
    return std::runtime_error("checkpoint " + path + " (trained with '" + from + "') evaluated with '" + to +
                              "': " + why);
  };
  ModelConfig mc;
  try {
    mc = ModelConfig::from_json(ckpt.config.at("model"));
  } catch (const std::exception &e) {
    throw fail(std::string("bad model config: ") + e.what());
  }
  mc.encoding = from;
  // The checkpoint's own model, for the names and shapes of its trainable parameters.
  LanguageModel trained{nullptr};
  try {
    trained = source ? LanguageModel(*source, mc) : LanguageModel(mc);
  } catch (const std::exception &e) {
    throw fail(e.what());
  }
  const auto was = trained->named_parameters(), now = model->named_parameters();
  for (const auto &kv : now) {
    const torch::Tensor *t = was.find(kv.key());
    if (!t)
      throw fail("trainable parameter '" + kv.key() + "' of '" + to + "' is not in the checkpoint ('" + from +
                 "' has no such parameter)");
    if (t->sizes() != kv.value().sizes())
      throw fail("trainable parameter '" + kv.key() + "' has shape " + shape_str(t->sizes()) + " in the checkpoint, " +
                 shape_str(kv.value().sizes()) + " in '" + to + "'");
  }
  for (const auto &kv : was)
    if (!now.find(kv.key()))
      throw fail("the checkpoint's trainable parameter '" + kv.key() + "' has no place in '" + to + "'");

  torch::serialize::InputArchive archive = open_payload(ckpt, path);
  torch::NoGradGuard no_grad;
  for (auto &kv : now) {
    torch::Tensor saved;
    if (!archive.try_read(kv.key(), saved)) throw fail("missing tensor '" + kv.key() + "' in the payload");
    kv.value().copy_(saved);
  }
  std::vector<std::string> kept;
  for (auto &kv : model->named_buffers()) {
    torch::Tensor saved;
    if (archive.try_read(kv.key(), saved) && saved.sizes() == kv.value().sizes())
      kv.value().copy_(saved);
    else
      kept.push_back(kv.key());
  }
  return kept;
}

LanguageModel load_model_as(const std::string &path, const std::string &encoding, nlohmann::json *config,
                            std::vector<std::string> *kept) {
  Checkpoint c = read_checkpoint(path);
  if (encoding.empty() || encoding == c.encoding) {
    if (kept) kept->clear();
    return load_model(path, config);
  }
  ModelConfig mc;
  try {
    mc = ModelConfig::from_json(c.config.at("model"));
  } catch (const std::exception &e) {
    throw std::runtime_error("checkpoint " + path + ": bad model config: " + e.what());
  }
  mc.encoding = encoding;
  LanguageModel model{nullptr};
  try {
    model = LanguageModel(mc);
  } catch (const std::exception &e) {
    throw std::runtime_error("checkpoint " + path + " evaluated with '" + encoding + "': " + e.what());
  }
  auto k = load_state_across(model, c, path);
  if (kept) *kept = std::move(k);
  if (config) *config = c.config;
  return model;
}

LanguageModel load_model(const std::string &path, nlohmann::json *config) {
  Checkpoint c = read_checkpoint(path);
  ModelConfig mc;
  try {
    mc = ModelConfig::from_json(c.config.at("model"));
  } catch (const std::exception &e) {
    throw std::runtime_error("checkpoint " + path + ": bad model config: " + e.what());
  }
  if (mc.encoding != c.encoding)
    throw std::runtime_error("checkpoint " + path + ": header says encoding '" + c.encoding +
                             "' but the config says '" + mc.encoding + "'");
  LanguageModel model{nullptr};
  try {
    model = LanguageModel(mc);  // registry lookup: unknown encoding -> error listing the names
  } catch (const std::exception &e) {
    throw std::runtime_error("checkpoint " + path + ": " + e.what());
  }
  load_state(model, c, path);
  if (config) *config = c.config;
  return model;
}

}  // namespace ape
