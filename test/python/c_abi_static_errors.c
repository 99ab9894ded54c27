/* Two encodings' C ABIs linked into one program from their objects, as a static link makes it
 * (test_c_abi.py::test_each_library_keeps_its_own_last_error_linked_statically): a failed call of
 * each, then each library's ape_NAME_last_error() must name its own call. Exit 0 when they do. */
#include <stdio.h>
#include <string.h>

#include "ape_alibi.h"
#include "ape_rope.h"

int main(void) {
  ape_rope_args bad;
  memset(&bad, 0, sizeof bad);
  bad.B = -1, bad.H = 1, bad.T = 1, bad.D = 4;
  const int rope = ape_rope_forward_f32(&bad);
  const int alibi = ape_alibi_backward_f64(NULL);
  const char *rope_msg = ape_rope_last_error(), *alibi_msg = ape_alibi_last_error();
  printf("rope: %d %s\nalibi: %d %s\n", rope, rope_msg, alibi, alibi_msg);
  if (rope == 0 || alibi == 0) return 2;
  if (!strstr(rope_msg, "ape_rope_forward_f32") || !strstr(alibi_msg, "ape_alibi_backward_f64")) {
    printf("FAIL: a library reports another's message\n");
    return 1;
  }
  printf("ok\n");
  return 0;
}
