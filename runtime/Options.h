// Options: the accepted range of every numeric setting, checked in one place with one message.
//
// The model, training and evaluation configs validate themselves with these (config.validate()),
// both for the command line of ape-train / ape-eval and for a config read back from a checkpoint,
// so a bad value names the option and its range the same way wherever it comes from:
//   "--batch must be a whole number in [1, 65536]; got 0"
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <stdexcept>
#include <string>

namespace ape {

// Throws std::invalid_argument("<option> must be a whole number in [lo, hi]; got v").
inline void require_in(const char *option, int64_t v, int64_t lo, int64_t hi) {
  if (v >= lo && v <= hi) return;
  throw std::invalid_argument(std::string(option) + " must be a whole number in [" + std::to_string(lo) + ", " +
                              std::to_string(hi) + "]; got " + std::to_string(v));
}

// Real-valued: [lo, hi], or (lo, hi] with `open_low` ("a number in (0, 10]"); never NaN or inf.
inline void require_in(const char *option, double v, double lo, double hi, bool open_low = false) {
  if (std::isfinite(v) && (open_low ? v > lo : v >= lo) && v <= hi) return;
  char buf[256];
  std::snprintf(buf, sizeof buf, "%s must be a number in %c%g, %g]; got %.17g", option, open_low ? '(' : '[', lo, hi,
                v);
  throw std::invalid_argument(buf);
}

// CPU threads (--threads): 0 means every hardware thread.
constexpr int64_t kMaxThreads = 1024;

}  // namespace ape
