// Device: where a model runs and in which precision (ape-train / ape-eval / ape-generate --device,
// --precision), chosen and checked in one place with one set of messages.
//
//   --device cpu        the CPU kernels (float32; float64 in the tests)
//   --device cuda[:N]   the generated CUDA kernels on GPU N (default: 0); this build must have
//                       them (runtime/CudaAttention.h), N must be a visible device, and the
//                       encoding must have a kernel for the precision and head dim
//   --precision auto    float32 on the CPU, bf16 on a GPU
//               bf16    autocast to bfloat16 on the GPU: matmuls and attention in bf16 with fp32
//                       accumulation, master weights, optimizer state, layer norms, the loss and
//                       every parameter gradient in float32 (torch.autocast's rules)
//               f16     autocast to float16 on the GPU, the same rules as bf16; training scales the
//                       loss dynamically (LossScaler, runtime/Train.h) against float16's range
//               f32     float32 everywhere
#pragma once

#include <cstdint>
#include <iosfwd>
#include <string>

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

namespace ape {
struct KernelEntry;

enum class Precision { F32, BF16, F16 };

struct ComputeDevice {
  c10::Device device = c10::Device(c10::kCPU);
  Precision precision = Precision::F32;

  bool is_cuda() const { return device.is_cuda(); }
  // The dtype attention's q, k, v have: float32, or bfloat16 / float16 under autocast.
  c10::ScalarType attention_dtype() const {
    return precision == Precision::BF16 ? c10::kBFloat16 : precision == Precision::F16 ? c10::kHalf : c10::kFloat;
  }
  std::string str() const;  // "cpu (f32)", "cuda:0 (bf16 autocast)"
};

// Parses and checks --device and --precision ("auto", "bf16", "f16", "f32"); throws std::invalid_argument
// with a message naming the option, what is wrong and what to do.
ComputeDevice choose_device(const std::string &device, const std::string &precision = "auto");

// Throws std::invalid_argument when `entry` cannot run on `dev` at `head_dim` (no CUDA kernel for
// the precision and head dim; an inference-only encoding on a GPU). A spec compiled at run time
// (--spec) gets its CUDA kernels compiled first, for the GPU's architecture (nvcc; cached; one line
// to `log`).
void check_encoding_on(const ComputeDevice &dev, const KernelEntry &entry, int64_t head_dim,
                       std::ostream *log = nullptr);

// Autocast to bfloat16 or float16 on dev's GPU while it lives (torch.autocast("cuda", dtype));
// nothing for float32 or on the CPU.
class AutocastScope {
 public:
  explicit AutocastScope(const ComputeDevice &dev);
  ~AutocastScope();
  AutocastScope(const AutocastScope &) = delete;
  AutocastScope &operator=(const AutocastScope &) = delete;

 private:
  bool on_ = false, was_enabled_ = false;
  c10::ScalarType was_dtype_ = c10::kFloat;
};

// How many CUDA devices this process sees (0 without a driver or a CUDA LibTorch).
int64_t visible_gpus();

// "f32", "bf16", "f16": --precision's words.
const char *precision_name(Precision p);

// The help text of --device and --precision, shared by the tools.
extern const char *const kDeviceHelp;
extern const char *const kPrecisionHelp;

}  // namespace ape
