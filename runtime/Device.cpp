#include "runtime/Device.h"

#include <stdexcept>

#include <ATen/Context.h>
#include <ATen/autocast_mode.h>
#include <ATen/detail/CUDAHooksInterface.h>

#include "ape/cpu/kernel_entry.h"
#include "runtime/Attention.h"
#include "runtime/CudaAttention.h"
#include "runtime/SpecLibrary.h"

namespace ape {

const char *const kDeviceHelp =
    "Where the model runs: cpu, cuda or cuda:N (the generated CUDA kernels on GPU N)";
const char *const kPrecisionHelp =
    "auto (f32 on the CPU, bf16 on a GPU), bf16 (autocast; fp32 weights, optimizer state and "
    "gradients), f16 (the same with float16; training scales the loss dynamically) or f32";

const char *precision_name(Precision p) {
  return p == Precision::BF16 ? "bf16" : p == Precision::F16 ? "f16" : "f32";
}

std::string ComputeDevice::str() const {
  switch (precision) {
    case Precision::BF16: return device.str() + " (bf16 autocast)";
    case Precision::F16: return device.str() + " (f16 autocast)";
    default: return device.str() + " (f32)";
  }
}

int64_t visible_gpus() {
  try {
    return at::globalContext().hasCUDA() ? static_cast<int64_t>(at::detail::getCUDAHooks().deviceCount()) : 0;
  } catch (const std::exception &) {
    return 0;
  }
}

ComputeDevice choose_device(const std::string &device, const std::string &precision) {
  ComputeDevice d;
  const std::string opt = "--device " + device + ": ";
  if (device == "cpu") {
    d.device = c10::Device(c10::kCPU);
  } else if (device == "cuda" || device.rfind("cuda:", 0) == 0) {
    int64_t index = 0;
    if (device != "cuda") {
      const std::string n = device.substr(5);
      if (n.empty() || n.size() > 4 || n.find_first_not_of("0123456789") != std::string::npos)
        throw std::invalid_argument(opt + "expected cuda:N with N a GPU index (0, 1, ...)");
      index = std::stoll(n);
    }
    if (!cuda_attention_built())
      throw std::invalid_argument(opt + "this build of APE has no CUDA kernels (CMake found no nvcc or no "
                                        "CUDA LibTorch; docs/cuda.md); use --device cpu");
    const int64_t n = visible_gpus();
    if (n == 0)
      throw std::invalid_argument(opt + "no CUDA device is visible to this process (no GPU, no driver, or "
                                        "CUDA_VISIBLE_DEVICES hides them); use --device cpu");
    if (index >= n)
      throw std::invalid_argument(opt + "this process sees " + std::to_string(n) + " CUDA device" +
                                  (n == 1 ? "" : "s") + " (cuda:0" +
                                  (n > 1 ? " .. cuda:" + std::to_string(n - 1) : std::string()) + ")");
    d.device = c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(index));
  } else {
    throw std::invalid_argument(opt + "unknown device; expected cpu, cuda or cuda:N");
  }
  if (precision == "auto") {
    d.precision = d.is_cuda() ? Precision::BF16 : Precision::F32;
  } else if (precision == "f32") {
    d.precision = Precision::F32;
  } else if (precision == "bf16" || precision == "f16") {
    if (!d.is_cuda())
      throw std::invalid_argument("--precision " + precision + ": the CPU kernels compute in float32; " +
                                  precision + " is for --device cuda");
    d.precision = precision == "bf16" ? Precision::BF16 : Precision::F16;
  } else {
    throw std::invalid_argument("--precision " + precision + ": expected auto, bf16, f16 or f32");
  }
  return d;
}

AutocastScope::AutocastScope(const ComputeDevice &dev) {
  if (!dev.is_cuda() || dev.precision == Precision::F32) return;
  on_ = true;
  was_enabled_ = at::autocast::is_autocast_enabled(c10::kCUDA);
  was_dtype_ = at::autocast::get_autocast_dtype(c10::kCUDA);
  at::autocast::set_autocast_enabled(c10::kCUDA, true);
  at::autocast::set_autocast_dtype(c10::kCUDA, dev.attention_dtype());
  at::autocast::increment_nesting();
}

AutocastScope::~AutocastScope() {
  if (!on_) return;
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  at::autocast::set_autocast_enabled(c10::kCUDA, was_enabled_);
  at::autocast::set_autocast_dtype(c10::kCUDA, was_dtype_);
}

void check_encoding_on(const ComputeDevice &dev, const KernelEntry &entry, int64_t head_dim, std::ostream *log) {
  if (!dev.is_cuda()) return;
  const std::string who = "--device " + dev.device.str() + ": ";
  if (registered_spec(entry.name)) {
    try {
      cuda_compile_spec(entry, dev.attention_dtype(), head_dim, cuda_arch(dev.device.index()), log);
    } catch (const std::exception &e) {
      throw std::invalid_argument(who + "the CUDA kernels of spec '" + entry.name + "': " + e.what());
    }
  }
  if (std::string why = cuda_attention_problem(entry, dev.attention_dtype(), head_dim); !why.empty())
    throw std::invalid_argument(who + why);
  // The build's kernels (a spec's are compiled for this GPU above).
  if (!registered_spec(entry.name))
    if (std::string why = cuda_device_problem(dev.device.index()); !why.empty())
      throw std::invalid_argument(who + why);
}

}  // namespace ape
