// decode_attention: checks the step's tensors and runs the entry's decode step.
#include "runtime/Decode.h"

#include <stdexcept>
#include <string>

#include <ATen/ATen.h>

#include "ape/cpu/kernel_entry.h"
#include "runtime/Attention.h"
#include "runtime/CudaAttention.h"

namespace ape {
namespace {

[[noreturn]] void bad(const KernelEntry &e, const std::string &msg) {
  throw std::invalid_argument(std::string("decode_attention(") + e.name + "): " + msg);
}

// The step's features and params against the manifest, on either device: features (B, H, n) and
// params of their numel, on q's device, of q's dtype (same_dtype: the CPU kernels') or any floating
// one (the CUDA kernels take float32 and convert).
void check_side_inputs(const KernelEntry &e, const Manifest &m, const at::Tensor &q,
                       const std::vector<at::Tensor> &features, const std::vector<at::Tensor> &params,
                       bool same_dtype) {
  const int64_t B = q.size(0), H = q.size(1), n = q.size(2), D = q.size(3);
  auto dtype_ok = [&](const at::Tensor &t) {
    return same_dtype ? t.scalar_type() == q.scalar_type() : at::isFloatingType(t.scalar_type());
  };
  const std::string dtype = same_dtype ? "q's dtype" : "a floating dtype";
  if (int64_t(features.size()) != m.num_features())
    bad(e, "expected " + std::to_string(m.num_features()) + " feature tensors, got " +
               std::to_string(features.size()));
  for (size_t i = 0; i < features.size(); ++i) {
    const at::Tensor &f = features[i];
    if (!f.defined() || f.dim() != 3 || f.size(0) != B || f.size(1) != H || f.size(2) != n || !dtype_ok(f) ||
        f.device() != q.device())
      bad(e, "feature '" + m.features[i].name + "' must be (B, H, n) = (" + std::to_string(B) + ", " +
                 std::to_string(H) + ", " + std::to_string(n) + ") of " + dtype + " on q's device");
  }
  if (int64_t(params.size()) != m.num_params())
    bad(e, "expected " + std::to_string(m.num_params()) + " param tensors, got " + std::to_string(params.size()));
  for (size_t i = 0; i < params.size(); ++i)
    if (!params[i].defined() || params[i].numel() != m.params[i].numel(H, D) || !dtype_ok(params[i]) ||
        params[i].device() != q.device())
      bad(e, "param '" + m.params[i].name + "' must have " + std::to_string(m.params[i].numel(H, D)) +
                 " elements of " + dtype + " on q's device");
}

template <typename T>
at::Tensor run_step(const KernelEntry &e, DecodeCache<T> &c, int64_t capacity, const at::Tensor &q,
                    const at::Tensor &k, const at::Tensor &v, const std::vector<at::Tensor> &feats,
                    const std::vector<at::Tensor> &params, double scale, AttnLayer layer) {
  if (!c.started()) c.capacity = capacity;
  std::vector<at::Tensor> keep;
  std::vector<const T *> fp, pp;
  for (const auto &f : feats) keep.push_back(f.contiguous()), fp.push_back(keep.back().data_ptr<T>());
  for (const auto &p : params) keep.push_back(p.contiguous()), pp.push_back(keep.back().data_ptr<T>());
  at::Tensor qc = q.contiguous(), kc = k.contiguous(), vc = v.contiguous();
  at::Tensor o = at::empty_like(qc);
  DecodeArgs<T> a{};
  a.kv_heads = k.size(1) == q.size(1) ? 0 : k.size(1);
  a.B = q.size(0), a.H = q.size(1), a.n = q.size(2), a.D = q.size(3);
  a.q = qc.data_ptr<T>(), a.k = kc.data_ptr<T>(), a.v = vc.data_ptr<T>();
  a.features = fp.data(), a.params = pp.data();
  a.scale = static_cast<T>(scale);
  a.o = o.data_ptr<T>(), a.lse = nullptr;
  a.layer = layer.index, a.num_layers = layer.count;
  if constexpr (std::is_same_v<T, float>) e.decode->step_f32(c, a);
  else e.decode->step_f64(c, a);
  return o;
}

// k and v: (B, H_kv, n, D) of q's dtype and device, H_kv dividing q's H (grouped-query attention).
void check_keys(const KernelEntry &e, const at::Tensor &q, const at::Tensor &k, const at::Tensor &v) {
  if (const std::string problem = keys_problem(q, k, v); !problem.empty()) bad(e, problem);
}

// A step on a GPU: the new tokens copied into the cache's rows, then the CUDA forward over all of
// them from the first new row (CudaAttnArgs::first_row), reading the cache in place (ld; km, krel, tok: what the kernels keep).
at::Tensor decode_on_gpu(const KernelEntry &e, const Manifest &m, LayerCache &cache, int64_t capacity,
                         const at::Tensor &q, const at::Tensor &k, const at::Tensor &v,
                         const std::vector<at::Tensor> &features, const std::vector<at::Tensor> &params,
                         double scale, AttnLayer layer) {
  if (cache.f32.started() || cache.f64.started()) bad(e, "the cache holds CPU steps (one cache serves one device)");
  if (q.dim() != 4 || q.size(2) < 1) bad(e, "q must be (B, H, n, D) with n >= 1");
  check_keys(e, q, k, v);
  check_side_inputs(e, m, q, features, params, false);
  const int64_t L0 = cache.len(), n = q.size(2);
  if (L0 + n > capacity)
    bad(e, std::to_string(L0) + " cached + " + std::to_string(n) + " new tokens exceed the capacity " +
               std::to_string(capacity));
  if (cache.k.defined() && (cache.k.size(0) != q.size(0) || cache.gpu_heads != q.size(1) ||
                            cache.k.size(1) != k.size(1) || cache.k.size(3) != q.size(3) ||
                            cache.k.scalar_type() != q.scalar_type() || cache.k.device() != q.device()))
    bad(e, "the step's B, H, key heads, D, dtype or device differ from the cache's");
  if (cache.k.defined() && L0 + n > cache.k.size(2))
    bad(e, "the cache was made for " + std::to_string(cache.k.size(2)) + " tokens");
  // The kernels for q's dtype and head dim (throws where there are none) before the cache changes.
  if (const std::string problem = cuda_attention_problem(e, q.scalar_type(), q.size(3)); !problem.empty())
    bad(e, problem);
  if (!cache.k.defined()) {  // the buffers, once (all or none: an allocation may throw)
    // k and v per key head (grouped-query attention: the kernels read a query head's key head in
    // place); k' per key head too where the group shares it, else per query head.
    const std::vector<int64_t> shape = {q.size(0), k.size(1), capacity, q.size(3)};
    at::Tensor bk = at::zeros(shape, q.options());
    at::Tensor bv = at::zeros(shape, q.options());
    const CudaDecodeKeeps keeps = cuda_decode_keeps(e);
    const int64_t S = q.size(0) * q.size(1);
    const at::TensorOptions f32 = q.options().dtype(at::kFloat);
    CudaKeptRows kept;
    if (keeps.km)
      kept.km = at::zeros({q.size(0), keeps.km_per_key_head ? k.size(1) : q.size(1), capacity, q.size(3)},
                          q.options());
    if (keeps.krel_floats > 0) kept.krel = at::zeros({S * capacity * keeps.krel_floats}, f32);
    if (keeps.tok_seqs > 0) {
      kept.tok = at::zeros({S * keeps.tok_seqs * capacity}, f32);
      kept.tok_carry = at::zeros({S * keeps.tok_seqs * 2}, q.options().dtype(at::kDouble));
    }
    std::vector<at::Tensor> feats;  // (B, H, capacity) each: a step copies its own into place
    for (size_t i = 0; i < features.size(); ++i) feats.push_back(at::zeros({q.size(0), q.size(1), capacity}, f32));
    cache.k = bk, cache.v = bv, cache.kept = kept, cache.features = feats, cache.gpu_heads = q.size(1);
  }
  // The step's rows into place past the cached ones: a step that fails (a kernel's error, memory
  // running out) leaves the cache at its L0 tokens; the next step writes these rows again.
  cache.k.narrow(2, L0, n).copy_(k), cache.v.narrow(2, L0, n).copy_(v);
  for (size_t i = 0; i < features.size(); ++i) cache.features[i].narrow(2, L0, n).copy_(features[i]);
  // The prefill (the first step) of every encoding runs the flash forward over the step's own
  // tensors: the kernel made for P rows, and the one that applies an attention transition, which
  // transforms the prompt only, as on the CPU (it reads q', k', v with T rows a slice, k and v of
  // their key heads). Its k' and the kept rows are left to the next step, which computes them for
  // the whole prompt once (O(P·D) a layer, against the prefill's O(P²·D)). A step given no layer
  // (count 0: a direct caller's, outside a model) goes through the decode kernel from the start.
  at::Tensor o;
  if (L0 == 0 && layer.count > 0) {
    o = cuda_attention_forward(e, q, k, v, features, params, scale, 0, layer).first;
  } else {
    o = cuda_decode_forward(e, q, cache.k, cache.v, L0 + n, cache.features, params, scale, L0, cache.kept);
    cache.kept.rows = L0 + n;
  }
  cache.gpu_len = L0 + n;
  return o;
}

}  // namespace

at::Tensor decode_attention(const KernelEntry &e, LayerCache &cache, int64_t capacity,
                            const at::Tensor &q, const at::Tensor &k, const at::Tensor &v,
                            const std::vector<at::Tensor> &features,
                            const std::vector<at::Tensor> &params, double scale, AttnLayer layer) {
  const Manifest &m = manifest_of(e);
  if (q.defined() && q.is_cuda())
    return decode_on_gpu(e, m, cache, capacity, q, k, v, features, params, scale, layer);
  if (!e.decode) bad(e, "the kernel entry has no decode steps (rebuild the kernel with this apec)");
  const bool f32 = q.scalar_type() == at::kFloat;
  if (!q.defined() || q.dim() != 4 || !(f32 || q.scalar_type() == at::kDouble) || !q.device().is_cpu())
    bad(e, "q must be (B, H, n, D) float32 or float64 on the CPU");
  check_keys(e, q, k, v);
  check_side_inputs(e, m, q, features, params, true);
  if (cache.k.defined()) bad(e, "the cache holds GPU steps (one cache serves one device)");
  if ((f32 && cache.f64.started()) || (!f32 && cache.f32.started()))
    bad(e, "the cache holds the other precision (one cache serves one dtype)");
  return f32 ? run_step<float>(e, cache.f32, capacity, q, k, v, features, params, scale, layer)
             : run_step<double>(e, cache.f64, capacity, q, k, v, features, params, scale, layer);
}

}  // namespace ape
