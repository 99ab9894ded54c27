// The log-sum-exp that the tests' references compare a kernel's lse with: over the last dimension,
// in long double, one scalar loop per row (max, then sum of exp(x - max), then the log).
//
// Why not torch::logsumexp: the PyTorch the project installs (2.15, AVX512 dispatch) returns, in
// some runs of the same fp64 input and not in others (about 1 in 50 under two concurrent
// processes, never alone), a result whose log step is off by up to 4e-10 relative (measured:
// max and sum of exp exact to 1 ulp, torch::log of that sum exact, logsumexp 3e-10 away), which
// the fp64 tolerance of 1e-10 catches as a kernel error that is not there. A row whose every entry
// is -inf gives -inf, as logsumexp does; a NaN propagates.
#pragma once

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace ape_test {

inline torch::Tensor reference_logsumexp(const torch::Tensor &x) {
  const torch::Tensor in = x.detach().to(torch::kFloat64).contiguous();
  const int64_t n = in.dim() == 0 ? 1 : in.size(-1);
  std::vector<int64_t> shape(in.sizes().begin(), in.sizes().end());
  if (!shape.empty()) shape.pop_back();
  torch::Tensor out = torch::empty(shape, in.options());
  const double *p = in.data_ptr<double>();
  double *o = out.data_ptr<double>();
  const int64_t rows = n == 0 ? out.numel() : in.numel() / n;
  for (int64_t r = 0; r < rows; ++r, p += n) {
    long double m = -std::numeric_limits<long double>::infinity();
    bool nan = false;
    for (int64_t j = 0; j < n; ++j) {
      nan |= std::isnan(p[j]);
      m = std::max<long double>(m, p[j]);
    }
    if (nan) {
      o[r] = std::numeric_limits<double>::quiet_NaN();
      continue;
    }
    if (std::isinf(m)) {  // every entry -inf (or a +inf): the max is the answer
      o[r] = static_cast<double>(m);
      continue;
    }
    long double sum = 0;
    for (int64_t j = 0; j < n; ++j) sum += std::exp(static_cast<long double>(p[j]) - m);
    o[r] = static_cast<double>(m + std::log(sum));
  }
  return out.to(x.scalar_type());
}

}  // namespace ape_test
