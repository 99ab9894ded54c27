// Copied by apec --emit=torch-library. The operator code of the library, the same for every
// encoding (ape/torch/ops_impl.h); CMakeLists.txt compiles it once per project.
#include "ape/torch/ops_impl.h"
