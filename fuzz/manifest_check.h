// The runtime's manifest reader behind a no-exception interface (fuzz/manifest_check.cpp).
#ifndef APE_FUZZ_MANIFEST_CHECK_H
#define APE_FUZZ_MANIFEST_CHECK_H

#include <string>

// True when runtime/Manifest.cpp parses and validates `json`; else false with its message.
bool apeFuzzRuntimeAcceptsManifest(const std::string &json, std::string *why);

#endif // APE_FUZZ_MANIFEST_CHECK_H
