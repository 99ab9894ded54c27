# lit configuration of the APE compiler tests (dialect, passes, codegen, tools).
import os
import sys

import lit.formats

config.name = "APE"
config.test_format = lit.formats.ShTest(True)
config.suffixes = [".mlir", ".test"]
config.excludes = ["lit.cfg.py", "lit.site.cfg.py.in", "Inputs"]
config.test_source_root = os.path.dirname(__file__)
config.test_exec_root = os.path.join(config.ape_obj_root, "test", "lit")

config.environment["PATH"] = os.pathsep.join(
    [config.ape_tools_dir, config.llvm_tools_dir, config.environment.get("PATH", "")])
config.environment["FILECHECK_OPTS"] = "--enable-var-scope"

config.substitutions.append(("%ape_src", config.ape_src_root))
config.substitutions.append(("%python", sys.executable))
config.substitutions.append(("%ape_templates", os.path.join(config.ape_src_root, "kernels", "include")))
config.substitutions.append(("%cxx", config.cxx_compiler))
# Clang, where installed with its OpenMP header (libomp-dev): the emitted sources are checked
# against its warnings too (REQUIRES: clang).
import shutil
import subprocess
_clang = shutil.which("clang++")
if _clang and subprocess.run([_clang, "-fopenmp", "-fsyntax-only", "-x", "c++", "-"], input=b"#include <omp.h>\n",
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode == 0:
    config.available_features.add("clang")
    config.substitutions.append(("%clangxx", _clang))
