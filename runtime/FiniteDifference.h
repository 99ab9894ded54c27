// Central differences: the one routine behind `ape-check`'s gradient rows (runtime/SpecCheck.cpp)
// and the kernel suite's finite-difference checks (test/unit/kernels/harness.cpp).
//
//   d/dt f(x + t u) at t = 0  ≈  (f(x + h u) - f(x - h u)) / 2h
//
// for u a unit vector e_p (one element of x) or any direction. The error is the truncation
// h²|f'''|/6 plus rounding ≈ eps |f| / h; for fp64 kernels and h = 1e-5 both are about 1e-10.
// x is left as it was found (bit for bit: the element is restored from a saved copy).
#pragma once

#include <cstdint>

#include <ATen/ATen.h>

namespace ape {

// Along element p of the contiguous fp64 buffer x; f() reads x.
template <typename F> double central_difference(double *x, int64_t p, double h, F &&f) {
  const double x0 = x[p];
  x[p] = x0 + h;
  const double plus = f();
  x[p] = x0 - h;
  const double minus = f();
  x[p] = x0;
  return (plus - minus) / (2 * h);
}

// Along the direction u (same shape as x, fp64); f() reads x.
template <typename F> double central_difference(at::Tensor &x, const at::Tensor &u, double h, F &&f) {
  const at::Tensor x0 = x.clone();
  x.copy_(x0 + h * u);
  const double plus = f();
  x.copy_(x0 - h * u);
  const double minus = f();
  x.copy_(x0);
  return (plus - minus) / (2 * h);
}

}  // namespace ape
