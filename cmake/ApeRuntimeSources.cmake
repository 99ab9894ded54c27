# The sources of ape_runtime (the LibTorch side), in one list for both builds that make it: the
# main build (runtime/CMakeLists.txt) and the GPU check's standalone build without MLIR
# (test/cuda/standalone/CMakeLists.txt, on the lent GPU machines). DistributedNccl.cpp joins where
# NCCL's headers are found (each build decides). Names relative to runtime/.
set(APE_RUNTIME_SOURCES
  Manifest.cpp
  Registry.cpp
  Attention.cpp
  Decode.cpp
  Generate.cpp
  Model.cpp
  LmLoss.cpp
  Tokenizer.cpp
  Threads.cpp
  Data.cpp
  AtomicFile.cpp
  Checkpoint.cpp
  CudaAttention.cpp
  Device.cpp
  Train.cpp
  Eval.cpp
  SpecLibrary.cpp
  Distributed.cpp
  SpecReference.cpp
  SpecCheck.cpp
  Util.cpp
)
