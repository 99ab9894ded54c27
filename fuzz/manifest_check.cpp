// The runtime's manifest reader (runtime/Manifest.cpp, plain C++ with exceptions), for the fuzzer:
// every manifest apec writes must be one the runtime accepts (the contract of docs/internals.md).
#include "fuzz/manifest_check.h"

#include <exception>

#include "runtime/Manifest.h"

bool apeFuzzRuntimeAcceptsManifest(const std::string &json, std::string *why) {
  try {
    ape::Manifest::parse(json, "fuzz");
    return true;
  } catch (const std::exception &e) {
    *why = e.what();
    return false;
  }
}
