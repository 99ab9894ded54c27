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

// A step on a GPU: the new tokens copied into the cache's rows, then the CUDA forward over all of
// them from the first new row (CudaAttnArgs::first_row), reading the cache in place (ld; km, krel, tok: what the kernels keep).
at::Tensor decode_on_gpu(const KernelEntry &e, const Manifest &m, LayerCache &cache, int64_t capacity,
                         const at::Tensor &q, const at::Tensor &k, const at::Tensor &v,
                         const std::vector<at::Tensor> &features, const std::vector<at::Tensor> &params,
                         double scale, AttnLayer layer) {
  if (cache.f32.started() || cache.f64.started()) bad(e, "the cache holds CPU steps (one cache serves one device)");
  if (q.dim() != 4) bad(e, "q must be (B, H, n, D)");
  for (const at::Tensor *t : {&k, &v})
    if (!t->defined() || t->sizes() != q.sizes() || t->scalar_type() != q.scalar_type() || t->device() != q.device())
      bad(e, "k and v must match q");
  if (int64_t(features.size()) != m.num_features())
    bad(e, "expected " + std::to_string(m.num_features()) + " feature tensors, got " +
               std::to_string(features.size()));
  const int64_t L0 = cache.len(), n = q.size(2);
  if (L0 + n > capacity)
    bad(e, std::to_string(L0) + " cached + " + std::to_string(n) + " new tokens exceed the capacity " +
               std::to_string(capacity));
  if (cache.q.defined() && (cache.q.size(0) != q.size(0) || cache.q.size(1) != q.size(1) ||
                            cache.q.size(3) != q.size(3) || cache.q.scalar_type() != q.scalar_type() ||
                            cache.q.device() != q.device()))
    bad(e, "the step's B, H, D, dtype or device differ from the cache's");
  if (cache.q.defined() && L0 + n > cache.q.size(2))
    bad(e, "the cache was made for " + std::to_string(cache.q.size(2)) + " tokens");
  if (!cache.q.defined()) {  // the buffers, once (all or none: an allocation may throw)
    const std::vector<int64_t> shape = {q.size(0), q.size(1), capacity, q.size(3)};
    at::Tensor bq = at::zeros(shape, q.options()), bk = at::zeros(shape, q.options());
    at::Tensor bv = at::zeros(shape, q.options());
    const CudaDecodeKeeps keeps = cuda_decode_keeps(e);
    const int64_t S = q.size(0) * q.size(1);
    const at::TensorOptions f32 = q.options().dtype(at::kFloat);
    CudaKeptRows kept;
    if (keeps.km) kept.km = at::zeros(shape, q.options());
    if (keeps.krel_floats > 0) kept.krel = at::zeros({S * capacity * keeps.krel_floats}, f32);
    if (keeps.tok_seqs > 0) {
      kept.tok = at::zeros({S * keeps.tok_seqs * capacity}, f32);
      kept.tok_carry = at::zeros({S * keeps.tok_seqs * 2}, q.options().dtype(at::kDouble));
    }
    cache.q = bq, cache.k = bk, cache.v = bv, cache.kept = kept;
  }
  cache.q.narrow(2, L0, n).copy_(q), cache.k.narrow(2, L0, n).copy_(k), cache.v.narrow(2, L0, n).copy_(v);
  cache.gpu_len = L0 + n;
  auto append = [](at::Tensor &all, const at::Tensor &t) { all = all.defined() ? at::cat({all, t}, 2) : t.clone(); };
  cache.features.resize(features.size());
  for (size_t i = 0; i < features.size(); ++i) append(cache.features[i], features[i]);
  // An attention transition transforms the prompt only (the prefill, the first step), as on the
  // CPU: from the step's own tensors (the transition reads q', k', v as (B, H, T, D)); k' is then
  // left to the next step.
  if (L0 == 0 && layer.count > 0)
    return cuda_attention_forward(e, q, k, v, cache.features, params, scale, 0, layer).first;
  at::Tensor o = cuda_decode_forward(e, cache.q, cache.k, cache.v, L0 + n, cache.features, params, scale, L0,
                                     cache.kept);
  cache.kept.rows = L0 + n;
  return o.narrow(2, L0, n);
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
  for (const at::Tensor *t : {&k, &v})
    if (!t->defined() || t->sizes() != q.sizes() || t->scalar_type() != q.scalar_type() || !t->device().is_cpu())
      bad(e, "k and v must match q");
  const int64_t B = q.size(0), H = q.size(1), n = q.size(2), D = q.size(3);
  if (int64_t(features.size()) != m.num_features())
    bad(e, "expected " + std::to_string(m.num_features()) + " feature tensors, got " +
               std::to_string(features.size()));
  for (const auto &f : features)
    if (!f.defined() || f.dim() != 3 || f.size(0) != B || f.size(1) != H || f.size(2) != n ||
        f.scalar_type() != q.scalar_type())
      bad(e, "every feature must be (B, H, n) like q");
  if (int64_t(params.size()) != m.num_params())
    bad(e, "expected " + std::to_string(m.num_params()) + " param tensors, got " + std::to_string(params.size()));
  for (size_t i = 0; i < params.size(); ++i)
    if (!params[i].defined() || params[i].numel() != m.params[i].numel(H, D) ||
        params[i].scalar_type() != q.scalar_type())
      bad(e, "param '" + m.params[i].name + "' must have " + std::to_string(m.params[i].numel(H, D)) +
                 " elements of q's dtype");
  if ((f32 && cache.f64.started()) || (!f32 && cache.f32.started()))
    bad(e, "the cache holds the other precision (one cache serves one dtype)");
  return f32 ? run_step<float>(e, cache.f32, capacity, q, k, v, features, params, scale, layer)
             : run_step<double>(e, cache.f64, capacity, q, k, v, features, params, scale, layer);
}

}  // namespace ape
