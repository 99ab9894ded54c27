# ape-check (docs/ape-check.md), included from test/CMakeLists.txt:
#   ape_check.<encoding>  every example spec passes against the kernel this build compiled from it
#                         (~1.6 s each, the 32 in ~50 s on the shared 2-core machine);
#   ape_check.spec_file   a spec outside examples/, compiled at run time (~15 s once, then cached);
#   ape_check.mutant_*    a deliberately wrong spec (Inputs/) checked against an example's kernel
#                         (--kernel) must fail with a readable table, in the rows that differ;
#   ape_check.error_*     bad input: a clear message and exit status 2 (1 for a mismatch);
#   ape_check.cuda_*      --cuda: a spec's CUDA kernels on the SIMT emulator (compiled now), and a
#                         mutant against the build's emulated kernels, whose CUDA rows fail.
set(_check ${CMAKE_CURRENT_LIST_DIR})
set(_expect bash ${_check}/expect.sh)
# ape_check.NAME: expect.sh's STATUS, line patterns, -- and ape-check's command, for a spec compiled
# now (SpecLibrary) into the build's spec cache, shared by these tests.
function(ape_spec_check name)
  add_test(NAME ape_check.${name} COMMAND ${_expect} ${ARGN})
  set_tests_properties(ape_check.${name} PROPERTIES ENVIRONMENT "APE_CACHE_DIR=${CMAKE_BINARY_DIR}/spec-cache")
endfunction()
file(GLOB _specs CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/examples/encodings/*.mlir)
foreach(spec ${_specs})
  get_filename_component(name ${spec} NAME_WE)
  add_test(NAME ape_check.${name} COMMAND ape-check ${spec})
  set_tests_properties(ape_check.${name} PROPERTIES LABELS check TIMEOUT 120)
endforeach()

# T5 with max_distance 64 instead of 128: other buckets from distance 20 on. Every quantity fails
# in both precisions; the kernel's own central differences still agree (the kernel is
# self-consistent: it computes another encoding).
add_test(NAME ape_check.mutant_t5_max_distance
  COMMAND ${_expect} 1 "^o +fp64 +[0-9x]+ .* FAIL$" "^dparam:t5_table +fp64 .* FAIL$"
          "^dq +fp32 .* FAIL$" "^fd:param:t5_table +fp64 .* pass$" "^ape-check: FAIL"
          -- $<TARGET_FILE:ape-check> ${_check}/Inputs/t5_mutant.mlir --kernel t5)
# ALiBi's slopes 1.000001 times too large: fp64 (1e-10) catches it (grouped rows too), fp32 rounding
# hides it.
add_test(NAME ape_check.mutant_alibi_slope_1e-6
  COMMAND ${_expect} 1 "^o +fp64 .* FAIL$" "^dk +fp64 .* FAIL$" "^o +fp32 .* pass$"
          "^decode:o +fp64 .* FAIL  \\(decode steps of [0-9+]+ tokens\\)$" "^grouped:o +fp64 +2x6x37x16 kv3 .* FAIL$"
          "^grouped-decode:o +fp64 .* FAIL" "^ape-check: FAIL \\(14 of 35 checks\\)"
          -- $<TARGET_FILE:ape-check> ${_check}/Inputs/alibi_off_by_1e-6.mlir --kernel alibi)
# The attention transition (inference only: o and lse at each of 6 layers) with beta 0.11
# instead of 0.1: o fails at a transformed layer, lse (the softmax's) passes.
add_test(NAME ape_check.mutant_transition_beta
  COMMAND ${_expect} 1 "^o +fp64 +[0-9x]+ L[123] .* FAIL$" "^lse +fp64 .* pass$"
          "^decode:o +fp64 +[0-9x]+ L[123] .* FAIL" "^ape-check: FAIL \\(4 of 8 checks\\)"
          -- $<TARGET_FILE:ape-check> ${_check}/Inputs/transition_beta_mutant.mlir
             --kernel rope_transition)
# skip_last 1 instead of 2: the reference transforms layer 4 of 6 as well; only layer 4 fails.
add_test(NAME ape_check.mutant_transition_layers
  COMMAND ${_expect} 1 "^o +fp64 +[0-9x]+ L4 .* FAIL$" "^o +fp32 +[0-9x]+ L4 .* FAIL$"
          "^decode:o +fp64 +[0-9x]+ L4 .* FAIL" "^ape-check: FAIL \\(4 of 8 checks\\)"
          -- $<TARGET_FILE:ape-check> ${_check}/Inputs/transition_layers_mutant.mlir
             --kernel rope_transition)
# A training spec against the inference-only kernel, and the reverse: an interface mismatch.
add_test(NAME ape_check.error_transition_interface
  COMMAND ${_expect} 1
          "^interface mismatch: the spec has no attention transition, the kernel is inference-only$"
          -- $<TARGET_FILE:ape-check> ${CMAKE_SOURCE_DIR}/examples/encodings/rope.mlir
             --kernel rope_transition)
# T = 20 is too short for any transformed row at 6 layers (I = 20 / 7 < 5): the check could not
# fail there, so it fails.
add_test(NAME ape_check.error_transition_unreached
  COMMAND ${_expect} 1 "^not checked: no shape of the grid reaches a row the attention transition"
          -- $<TARGET_FILE:ape-check> ${CMAKE_SOURCE_DIR}/examples/encodings/rope_transition.mlir
             --shapes 1x1x20x16)
# A spec file outside examples/: compiled now (SpecLibrary, cached in the build's spec cache, as
# scripts/test.sh sets it), with -inf masks that leave the first rows without a visible key.
ape_spec_check(spec_file
  0 "kernel: +compiled from .*masked_mix.mlir" "^lse +fp64 .* pass$"
          "^fd:feature:gate +fp64 .* pass$" "^decode:lse +fp64 .* pass$" "^grouped:dfeature:gate +fp64 .* pass$" "^ape-check: PASS \\(60 checks\\)"
          -- $<TARGET_FILE:ape-check> ${_check}/Inputs/masked_mix.mlir)
# i1 read as MLIR reads it (true -1 signed, 1 unsigned) and a param index clamped to its dimension:
# the kernel compiled now against the reference (runtime/SpecReference.cpp).
ape_spec_check(spec_i1_and_indices
  0 "^o +fp64 .* pass$" "^dparam:pos_bias +fp64 .* pass$" "^ape-check: PASS"
          -- $<TARGET_FILE:ape-check> ${_check}/Inputs/i1_and_indices.mlir)
# Constants exact at every precision: a rotated count that float rounding put one pair short, and
# constant arithmetic (ln 4, 1/3) that the canonicalizer folded in f32 for the fp64 kernel; at T = 1
# the trainable table's gradient is exactly 0, which the fp32 kernel's rounding at D 240 passed
# only with the param floor scaled by the head dim.
ape_spec_check(spec_exact_constants
  0 "^o +fp64 .* pass$" "^o +fp32 .* pass$" "^dq +fp64 .* pass$"
          "^dparam:tab +fp64 .* pass$" "^dparam:tab +fp32 .* pass$" "^ape-check: PASS"
          -- $<TARGET_FILE:ape-check> ${_check}/Inputs/exact_constants.mlir
             --shapes 1x1x1x240,1x2x37x240,2x1x20x240)
# A row term w C_i with C a cumulative sum: its gradient cancels to 0, and the fp32 kernel's
# rounding times C_i (2.3e-3) is within the param floor only when the floor follows the param's
# sensitivity to the logits (it was 1.2e-3 counted in query-key pairs).
ape_spec_check(spec_row_term
  0 "^dparam:w +fp64 .* pass$" "^dparam:w +fp32 .* pass$" "^ape-check: PASS"
          -- $<TARGET_FILE:ape-check> ${_check}/Inputs/row_term.mlir)
# Derivatives at the edges of floating point (0 · inf and 0/0 in the tangents: masked pairs, an
# overflowing e^x, sqrt at 0, a token map log(max(g, 0))), maxnumf beside a NaN, and i64
# arithmetic that wraps: the CPU kernel and the CUDA kernels (emulated) against the reference. sa's
# gradient (through e^(sa + 2 (n - 20)), a few 1e-6) is below what bf16 resolves: its bf16 rows
# pass but are listed apart, not counted as checks (zeros would pass them too).
ape_spec_check(spec_derivative_edges
  0 "^dparam:lw +fp32 .* pass$" "^dparam:sa +fp32 .* pass$" "^dparam:sq +fp64 .* pass$"
          "^dparam:na +fp64 .* pass$" "^dfeature:gate +fp32 .* pass$" "^dparam:sq +cuda-bf16 .* pass$"
          "^  dparam:sa cuda-bf16 \\(1x2x64x32, 2x2x150x64, 1x2x150x128\\)$" "^ape-check: PASS"
          -- $<TARGET_FILE:ape-check> ${_check}/Inputs/derivative_edges.mlir --cuda)
# A -inf mask, then a learned temperature and a later nonlinear use of the masked logit: every
# gradient was NaN (0·-inf in the derived products) until the derivative pass kept 0·inf = 0 there.
ape_spec_check(spec_masked_temperature
  0 "^dparam:temp +fp64 .* pass$" "^dq +fp32 .* pass$" "^ape-check: PASS"
          -- $<TARGET_FILE:ape-check> ${_check}/Inputs/masked_temperature.mlir)
# Integer division and remainder by i - j, 0 on the diagonal: total in the kernel and the reference
# (contract/int_math.h: x / 0 = 0, x % 0 = x), where C++ traps.
ape_spec_check(spec_int_division
  0 "^o +fp64 .* pass$" "^ape-check: PASS"
          -- $<TARGET_FILE:ape-check> ${_check}/Inputs/int_division.mlir)
# NaN through maxnumf, maximumf, the unordered and ordered cmpf predicates and fptosi, and fptosi
# saturating: the kernels (contract/float_math.h) and the reference agree on MLIR's meanings; a
# param's gradient through a select that discards log(0) is the kept branch's in both.
ape_spec_check(spec_nan_semantics
  0 "^o +fp64 .* pass$" "^dq +fp64 .* pass$" "^dparam:a +fp64 .* pass$"
          "^dparam:a +fp32 .* pass$" "^ape-check: PASS"
          -- $<TARGET_FILE:ape-check> ${_check}/Inputs/nan_semantics.mlir)
# A type outside f32, i1, i64 and index in a region (i32 arithmetic that would wrap): refused with
# its location, where it was computed in int64.
ape_spec_check(error_i32_region
  2 "i32wrap.mlir:[0-9]+:[0-9]+: error: 'arith\\.[a-z_]+' op uses type i32: region bodies compute on f32, i1, i64 and index only"
          -- $<TARGET_FILE:ape-check> ${_check}/Inputs/i32wrap.mlir)
# A power with base 0 on the diagonal and a trainable base scale and exponent: finite gradients
# (torch.pow's at 0), against the reference and central differences.
ape_spec_check(spec_powf_zero_base
  0 "^dparam:pw_c +fp64 .* pass$" "^dparam:pw_p +fp64 .* pass$" "^fd:param:pw_p +fp64 .* pass$"
          "^ape-check: PASS"
          -- $<TARGET_FILE:ape-check> ${_check}/Inputs/powf_zero_base.mlir)
# A spec computing NaN fails, though the kernel computes the same NaNs as the reference.
ape_spec_check(error_nan_spec
  1 "^o +fp64 .* FAIL$" "^ape-check: FAIL"
          -- $<TARGET_FILE:ape-check> ${_check}/Inputs/nan_score.mlir)
# Two fused distance terms (learned ALiBi + T5): the CPU template's per-distance table and
# diagonal gradient sums against the reference's per-element evaluation.
ape_spec_check(distance_sum
  0 "^dparam:alibi_slopes +fp64 .* pass$" "^dparam:t5_table +fp32 .* pass$"
          "^ape-check: PASS \\(41 checks\\)"
          -- $<TARGET_FILE:ape-check> ${_check}/Inputs/alibi_t5_sum.mlir)
# Params nothing reads once the regions are composed: left out of the kernel, noted, checked to
# be dead in the reference (they had made an "interface mismatch"); and a kernel that leaves out a
# param the spec reads fails.
ape_spec_check(spec_dead_after_composition
  0 "^note: not in the kernel: param 'w', param 'u' \\(nothing reads it" "^ape-check: PASS"
          -- $<TARGET_FILE:ape-check> ${_check}/Inputs/dead_after_composition.mlir)
add_test(NAME ape_check.error_live_param_left_out
  COMMAND ${_expect} 1 "^interface mismatch: the kernel leaves out param 'alibi_slopes', but the spec's output depends on it"
          -- $<TARGET_FILE:ape-check> ${CMAKE_SOURCE_DIR}/examples/encodings/alibi_learned.mlir --kernel nope)
# A kernel whose params are not the spec's: no numbers, the mismatch.
add_test(NAME ape_check.error_interface
  COMMAND ${_expect} 1 "^interface mismatch: the spec declares 0 params, the kernel's manifest 1$"
          -- $<TARGET_FILE:ape-check> ${CMAKE_SOURCE_DIR}/examples/encodings/rope.mlir
             --kernel alibi)
add_test(NAME ape_check.error_malformed_spec
  COMMAND ${_expect} 2 "bad_region.mlir:3:3: error: 'ape.score_mod' op body region must take"
          "^ape-check: error: apec could not compile"
          -- $<TARGET_FILE:ape-check> ${_check}/Inputs/bad_region.mlir)
add_test(NAME ape_check.error_missing_file
  COMMAND ${_expect} 2 "^ape-check: error: cannot read no/such.mlir: no such file$"
          -- $<TARGET_FILE:ape-check> no/such.mlir)
add_test(NAME ape_check.error_shapes
  COMMAND ${_expect} 2 "--shapes: '2x3' is not BxHxTxD"
          -- $<TARGET_FILE:ape-check> ${CMAKE_SOURCE_DIR}/examples/encodings/rope.mlir --shapes 2x3)
add_test(NAME ape_check.error_unknown_kernel
  COMMAND ${_expect} 2 "^ape-check: error: unknown encoding 'nosuch'"
          -- $<TARGET_FILE:ape-check> ${CMAKE_SOURCE_DIR}/examples/encodings/rope.mlir
             --kernel nosuch)
# A bad command line is status 2 too (1 would read as a failed check), and an integer is decimal
# (0x10 was 16).
add_test(NAME ape_check.error_command_line
  COMMAND ${_expect} 2 "--seed: the value 0x10 is not a whole decimal number"
          -- $<TARGET_FILE:ape-check> ${CMAKE_SOURCE_DIR}/examples/encodings/rope.mlir --seed 0x10)
# A list option refuses an empty item (CLI11's delimiter had dropped it: --cuda-archs 80, ran sm_80
# alone without a word) and reads each item as a whole decimal number.
add_test(NAME ape_check.error_list_item
  COMMAND ${_expect} 2 "--cuda-archs: an empty item in the list '80,,90'"
          -- $<TARGET_FILE:ape-check> ${CMAKE_SOURCE_DIR}/examples/encodings/rope.mlir --cuda-archs 80,,90)
add_test(NAME ape_check.error_list_number
  COMMAND ${_expect} 2 "--cuda-archs: the value 090 starts with 0"
          -- $<TARGET_FILE:ape-check> ${CMAKE_SOURCE_DIR}/examples/encodings/rope.mlir --cuda-archs 80,090)
add_test(NAME ape_check.help
  COMMAND ${_expect} 0 "--kernel NAME" "--fp32-param-floor" "independent path" "--layers"
          -- $<TARGET_FILE:ape-check> --help)
set_tests_properties(ape_check.mutant_t5_max_distance ape_check.mutant_alibi_slope_1e-6
  ape_check.mutant_transition_beta ape_check.mutant_transition_layers
  ape_check.error_transition_interface ape_check.error_transition_unreached ape_check.spec_file ape_check.distance_sum ape_check.error_interface ape_check.error_malformed_spec
  ape_check.error_missing_file ape_check.error_shapes ape_check.error_unknown_kernel
  ape_check.error_command_line ape_check.error_list_item ape_check.error_list_number ape_check.help
  PROPERTIES LABELS check TIMEOUT 120)
# --cuda: the spec's CUDA kernels on the SIMT emulator beside its CPU kernel. K-Cable marked
# fast_math (its score mod by the GPU's approximate functions), compiled now (f32 and bf16 at
# head dim 32; ~25 s once, then cached), against the same reference.
ape_spec_check(cuda_spec_file
  0 "CUDA: +compiled from .*kcable_fast.mlir for the SIMT emulator \\(f32, bf16 at head dim 32\\)"
          "^o +cuda-f32 .* pass$" "^dfeature:cable +cuda-f32 .* pass$" "^dq +cuda-bf16 .* pass$"
          "^decode:o +cuda-bf16 .* pass$" "^decode:lse +cuda-f32 .* pass$" "^decode-split:o +cuda-bf16 .* pass$"
          "^ape-check: PASS"
          -- $<TARGET_FILE:ape-check> ${CMAKE_SOURCE_DIR}/test/unit/Inputs/kcable_fast.mlir --cuda
             --shapes 2x2x70x32)
# The linear mod kernels' run shapes (side_kernels.cuh, RunShape): partners one by one (bf16 at
# head dim 32), paired runs (f32; head dim 64) and unrotated runs, against the reference.
ape_spec_check(cuda_linear_mod_runs
  0 "^dq +cuda-bf16 .* pass$" "^dk +cuda-f32 .* pass$" "^dq +sm90-bf16 .* pass$"
          "^grouped:dk +cuda-bf16 .* kv5 .* pass$" "^ape-check: PASS"
          -- $<TARGET_FILE:ape-check> ${_check}/Inputs/rope_three_quarters.mlir --cuda
             --shapes 2x3x70x32,1x5x33x64)
# A q mod that amplifies q 40-fold: the bf16 rows' tolerance follows the yardstick (the reference
# with q' and k' rounded to bf16 as the kernels read them), where the fixed 3e-2 failed a correct
# kernel (o 4.0e-2 off at this shape).
ape_spec_check(cuda_amplifying_q_mod
  0 "^o +cuda-bf16 .* pass$" "^dk +cuda-bf16 .* pass$" "^decode:o +cuda-bf16 .* pass$"
          "^ape-check: PASS"
          -- $<TARGET_FILE:ape-check> ${_check}/Inputs/amplifying_q_mod.mlir --cuda --shapes 1x2x64x32)
# A spec under a built-in encoding's name (ALiBi with steeper slopes, @alibi): its own compiled
# kernels are checked, CPU and emulated CUDA, not the build's alibi (ape-check exports its
# symbols; the libraries bind to their own code: SpecLibrary.cpp, kSelfBound).
ape_spec_check(cuda_spec_named_like_a_builtin
  0 "^o +fp64 .* pass$" "^o +cuda-f32 .* pass$" "^dk +cuda-bf16 .* pass$" "^ape-check: PASS"
          -- $<TARGET_FILE:ape-check> ${_check}/Inputs/alibi_steeper.mlir --cuda --shapes 1x2x70x32)
# The T5 mutant against the build's emulated T5 kernels (--kernel t5 --cuda): the CUDA rows fail
# as the CPU rows do, the CUDA decode steps' too.
add_test(NAME ape_check.cuda_mutant_t5
  COMMAND ${_expect} 1 "CUDA: +the emulated kernels of t5 compiled into this build"
          "^o +cuda-bf16 .* FAIL$" "^dparam:t5_table +cuda-f32 .* FAIL$" "^decode:o +cuda-f32 .* FAIL"
          "^o +sm90-bf16 .* FAIL$"
          "^decode-split:o +cuda-bf16 .* FAIL"
          "^ape-check: FAIL"
          -- $<TARGET_FILE:ape-check> ${_check}/Inputs/t5_mutant.mlir --kernel t5 --cuda --shapes 2x3x70x64)
add_test(NAME ape_check.error_cuda_inference_only
  COMMAND ${_expect} 2 "--cuda: an inference-only spec"
          -- $<TARGET_FILE:ape-check> ${CMAKE_SOURCE_DIR}/examples/encodings/rope_transition.mlir --cuda)
add_test(NAME ape_check.error_cuda_head_dim
  COMMAND ${_expect} 2 "--cuda: no shape of the grid has a CUDA head dim"
          -- $<TARGET_FILE:ape-check> ${CMAKE_SOURCE_DIR}/examples/encodings/alibi.mlir --cuda --shapes 1x1x8x16)
# A shape asked for with --shapes is never changed: one the spec's hints or rotation refuse is an
# error named before the kernels are compiled (the default grid is fitted to them instead).
add_test(NAME ape_check.error_shape_against_hint
  COMMAND ${_expect} 2 "^ape-check: error: --shapes 1x2x5x32: the spec pins head_dim 64 \\(give D = 64\\)$"
          -- $<TARGET_FILE:ape-check> ${_check}/Inputs/pinned_head_dim.mlir --shapes 1x2x5x32)
add_test(NAME ape_check.error_shape_against_rotation
  COMMAND ${_expect} 2 "^ape-check: error: --shapes 1x2x5x6: fraction 0.5 of head_dim 6 gives 3 rotated"
          -- $<TARGET_FILE:ape-check> ${CMAKE_SOURCE_DIR}/examples/encodings/rope_partial.mlir --shapes 1x2x5x6)
set_tests_properties(ape_check.error_shape_against_hint ape_check.error_shape_against_rotation
                     PROPERTIES LABELS check TIMEOUT 60)
# RoPE with base 9,700 against the build's emulated RoPE kernels: the bf16 rows fail, sm_90's
# too (a fixed tolerance of 3e-2 had passed every one of them: o 1.25e-2 off).
add_test(NAME ape_check.cuda_mutant_rope_base
  COMMAND ${_expect} 1 "^o +cuda-bf16 .* FAIL$" "^dq +cuda-bf16 .* FAIL$" "^o +sm90-bf16 .* FAIL$"
          "^dk +sm90-bf16 .* FAIL$" "^o +cuda-f32 .* FAIL$"
          -- $<TARGET_FILE:ape-check> ${_check}/Inputs/rope_base_9700.mlir --kernel rope --cuda --shapes 2x3x70x64)
foreach(t cuda_mutant_rope_base cuda_spec_file cuda_linear_mod_runs cuda_amplifying_q_mod cuda_spec_named_like_a_builtin cuda_mutant_t5 error_cuda_inference_only error_cuda_head_dim)
  set_tests_properties(ape_check.${t} PROPERTIES LABELS check TIMEOUT 300)
endforeach()
unset(_check)
unset(_expect)
unset(_specs)
