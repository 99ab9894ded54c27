// torch.ops.ape_test_reference.attention: the independent fp64 reference of every example
// encoding (test/unit/kernel_reference.cpp, written from the spec's math, never from the generated
// kernels), so that the operator libraries of all of them are checked against it from Python, not
// only the few that reference.py writes out again. CPU only: the inputs are copied to the CPU in
// fp64, the results are fp64 CPU tensors.
//
//   attention(encoding, q, k, v, features, param_names, params, trainable, scale, dout, rounding)
//     -> [o, lse] without dout; with dout: [o, lse, dq, dk, dv, dfeature..., dparam...] (one per
//        name of `trainable`, in its order; gradients by autograd on the materialised graph).
//   rounding (torch.bfloat16 or torch.float16): the same-precision baseline of FlashAttention's
//        error rule, rounded where a flash kernel rounds (kernel_reference.h, RefRounding).
#include "kernel_reference.h"

#include <torch/library.h>

#include <stdexcept>

namespace {

std::vector<at::Tensor> attention(const std::string &encoding, const at::Tensor &q,
                                  const at::Tensor &k, const at::Tensor &v,
                                  const std::vector<at::Tensor> &features,
                                  const std::vector<std::string> &param_names,
                                  const std::vector<at::Tensor> &params,
                                  const std::vector<std::string> &trainable, double scale,
                                  const c10::optional<at::Tensor> &dout,
                                  c10::optional<at::ScalarType> rounding) {
  TORCH_CHECK(param_names.size() == params.size(), "ape_test_reference: ", param_names.size(),
              " param names for ", params.size(), " params");
  auto cpu = [](const at::Tensor &t) { return t.detach().to(at::kCPU, at::kDouble); };
  ape_test::RefInputs in;
  in.q = cpu(q);
  in.k = cpu(k);
  in.v = cpu(v);
  for (const auto &f : features) in.features.push_back(cpu(f));
  for (size_t i = 0; i < params.size(); ++i) in.params[param_names[i]] = cpu(params[i]);
  in.trainable = trainable;
  in.scale = scale;
  const at::Tensor d = dout.has_value() ? cpu(*dout) : at::Tensor();
  ape_test::RefOutputs out;
  try {
    ape_test::RefRounding round;
    if (rounding.has_value()) round.dtype = *rounding;
    TORCH_CHECK(round.dtype == at::kDouble || round.dtype == at::kBFloat16 || round.dtype == at::kHalf,
                "ape_test_reference: rounding to ", round.dtype, " (bfloat16 or float16 only)");
    out = ape_test::reference_attention(encoding, in, d, round);
  } catch (const std::invalid_argument &e) {
    TORCH_CHECK(false, "ape_test_reference: ", e.what());
  }
  std::vector<at::Tensor> result = {out.o, out.lse};
  if (!d.defined()) return result;
  result.insert(result.end(), {out.dq, out.dk, out.dv});
  for (const auto &g : out.dfeatures) result.push_back(g);
  for (const auto &name : trainable) {
    auto it = out.dparams.find(name);
    TORCH_CHECK(it != out.dparams.end(), "ape_test_reference: no gradient for param ", name);
    result.push_back(it->second);
  }
  return result;
}

}  // namespace

TORCH_LIBRARY(ape_test_reference, m) {
  // A catch-all kernel (CompositeImplicitAutograd): the reference runs with autograd on, which
  // its own gradients need (a kernel below the Autograd key would record no graph).
  m.def("attention(str encoding, Tensor q, Tensor k, Tensor v, Tensor[] features, "
        "str[] param_names, Tensor[] params, str[] trainable, float scale, Tensor? dout, "
        "ScalarType? rounding=None) -> Tensor[]",
        TORCH_FN(attention));
}
