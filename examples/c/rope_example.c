/* examples/c/rope_example.c: the RoPE attention kernel from plain C, through the C ABI that
 * `apec --emit=c-abi` writes (docs/frameworks.md).
 *
 * q, k and v are laid out as a projection writes them, (B, T, H, D), and handed to the kernel as
 * strided [B, H, T, D] views. The program checks o against a naive materialised RoPE attention,
 * dq against central finite differences of the loss L = sum(o * w), shows an error status, and
 * ends with one verdict line.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "ape_rope.h"

enum { B = 2, T = 9, H = 3, D = 8 };
#define N (B * T * H * D)

/* Element (b, h, t, d) of a (B, T, H, D) buffer. */
static int at(int b, int h, int t, int d) { return ((b * T + t) * H + h) * D + d; }

/* Rotate-half RoPE of row (b, h, t) of x: pairs (c, c + D/2), angle t * 10000^(-2c/D). */
static void rope_row(const double *x, int b, int h, int t, double *out) {
  for (int c = 0; c < D / 2; ++c) {
    double angle = t * pow(10000.0, -2.0 * c / D);
    double x1 = x[at(b, h, t, c)], x2 = x[at(b, h, t, c + D / 2)];
    out[c] = x1 * cos(angle) - x2 * sin(angle);
    out[c + D / 2] = x2 * cos(angle) + x1 * sin(angle);
  }
}

/* Naive causal RoPE attention, every logit materialised: o in (B, T, H, D) layout. */
static void naive_attention(const double *q, const double *k, const double *v, double scale,
                            double *o) {
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < H; ++h)
      for (int i = 0; i < T; ++i) {
        double qi[D], kj[D], logits[T], mx = -INFINITY, sum = 0;
        rope_row(q, b, h, i, qi);
        for (int j = 0; j <= i; ++j) {
          rope_row(k, b, h, j, kj);
          double s = 0;
          for (int d = 0; d < D; ++d) s += qi[d] * kj[d];
          logits[j] = scale * s;
          if (logits[j] > mx) mx = logits[j];
        }
        for (int j = 0; j <= i; ++j) sum += (logits[j] = exp(logits[j] - mx));
        for (int d = 0; d < D; ++d) {
          double acc = 0;
          for (int j = 0; j <= i; ++j) acc += logits[j] / sum * v[at(b, h, j, d)];
          o[at(b, h, i, d)] = acc;
        }
      }
}

static double loss(const double *q, const double *k, const double *v, const double *w,
                   double scale) {
  static double o[N];
  double l = 0;
  naive_attention(q, k, v, scale, o);
  for (int n = 0; n < N; ++n) l += o[n] * w[n];
  return l;
}

static double uniform(unsigned *state) { /* deterministic inputs in [-1, 1) */
  *state = *state * 1664525u + 1013904223u;
  return (*state >> 8) / 8388608.0 - 1.0;
}

int main(void) {
  static double q[N], k[N], v[N], w[N], o[N], want[N], dq[N], dk[N], dv[N], lse[B * H * T];
  unsigned seed = 7;
  for (int n = 0; n < N; ++n) {
    q[n] = uniform(&seed), k[n] = uniform(&seed), v[n] = uniform(&seed), w[n] = uniform(&seed);
  }
  /* The instruction-set level the library chose for this CPU (APE_CPU_LEVEL forces one). */
  printf("kernels: %s\n", ape_rope_cpu_level());
  /* [B, H, T, D] strides of (B, T, H, D) memory, in elements. */
  const int64_t strides[4] = {T * H * D, D, H * D, 1};

  ape_rope_args a = {0};
  a.B = B, a.H = H, a.T = T, a.D = D;
  a.scale = ape_rope_default_scale(D); /* 1/sqrt(D) */
  a.q = (ape_tensor){q, strides};
  a.k = (ape_tensor){k, strides};
  a.v = (ape_tensor){v, strides};
  a.o = (ape_tensor){o, strides};
  a.lse = lse; /* (B, H, T) contiguous; backward needs it */
  int status = ape_rope_forward_f64(&a);
  if (status != APE_OK) {
    fprintf(stderr, "forward: %s: %s\n", ape_rope_error_string(status), ape_rope_last_error());
    return 1;
  }
  naive_attention(q, k, v, a.scale, want);
  double o_err = 0;
  for (int n = 0; n < N; ++n) o_err = fmax(o_err, fabs(o[n] - want[n]));

  a.dout = (ape_tensor){w, strides}; /* dL/do for L = sum(o * w) */
  a.dq = (ape_tensor){dq, strides};
  a.dk = (ape_tensor){dk, strides};
  a.dv = (ape_tensor){dv, strides};
  status = ape_rope_backward_f64(&a);
  if (status != APE_OK) {
    fprintf(stderr, "backward: %s: %s\n", ape_rope_error_string(status), ape_rope_last_error());
    return 1;
  }
  double dq_err = 0, eps = 1e-6;
  for (int n = 0; n < N; n += 37) { /* a spread of q's elements */
    double keep = q[n];
    q[n] = keep + eps;
    double up = loss(q, k, v, w, a.scale);
    q[n] = keep - eps;
    double down = loss(q, k, v, w, a.scale);
    q[n] = keep;
    dq_err = fmax(dq_err, fabs(dq[n] - (up - down) / (2 * eps)));
  }

  a.D = 0; /* a bad argument is a status and a message, never a crash */
  status = ape_rope_forward_f64(&a);
  printf("bad call: status %d (%s): %s\n", status, ape_rope_error_string(status),
         ape_rope_last_error());

  int ok = o_err < 1e-12 && dq_err < 1e-7 && status == APE_ERROR_INVALID_SHAPE;
  printf("rope_example: max |o - naive| = %.1e, max |dq - finite difference| = %.1e: %s\n", o_err,
         dq_err, ok ? "ok" : "FAILED");
  return ok ? 0 : 1;
}
