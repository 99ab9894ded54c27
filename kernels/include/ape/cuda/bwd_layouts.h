// The flash backward's layouts (cuda/flash_backward.cuh, BwdTiles): their ids, which are the
// kernel's last template argument (flash_backward_kernel<..., kLayout>), and their names as the
// tests and tools print them. Host-only code (the emulated tests, bench/cuda_traffic.cpp) reads a
// launched kernel's layout back from its name through bwd_layout_name.
#pragma once

#include "ape/cuda/symbols.h"

namespace ape::cuda {
APE_CUDA_ABI_BEGIN
namespace detail {

inline constexpr int kBwdNarrow = 0, kBwdWide = 1, kBwdWgmma = 2, kBwdWideSub = 3, kBwdWideTma = 4, kBwdSquare = 5,
                     kBwdSquareTma = 6, kBwdLayouts = 7;

// "narrow", "wide", "wgmma", "wide_sub", "wide_tma", "square", "square_tma" for the ids above;
// nullptr for any other.
constexpr const char *bwd_layout_name(int layout) {
  constexpr const char *kNames[kBwdLayouts] = {"narrow", "wide", "wgmma", "wide_sub", "wide_tma", "square", "square_tma"};
  return layout >= 0 && layout < kBwdLayouts ? kNames[layout] : nullptr;
}

}  // namespace detail
APE_CUDA_ABI_END
}  // namespace ape::cuda
