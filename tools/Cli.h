// The command-line conventions every tool shares (ape-train, ape-eval, ape-generate, ape-check).
#pragma once

#include <cerrno>
#include <cstdlib>
#include <string>

#include <CLI/CLI.hpp>

namespace ape::cli {

// Refuses a whole number that does not fit a 64-bit integer: CLI11 would saturate it to the
// nearest end (a --seed of 2^64 - 1 ran as 2^63 - 1, with the range check none the wiser).
inline CLI::Validator fits_int64() {
  return CLI::Validator(
      [](std::string &s) -> std::string {
        errno = 0;
        char *end = nullptr;
        std::strtoll(s.c_str(), &end, 0);
        if (errno == ERANGE) return "the value " + s + " does not fit a 64-bit integer";
        return "";
      },
      "INT64");
}

}  // namespace ape::cli

// CLI11_PARSE with the tools' exit status: 0 for --help, 1 for a bad command line (CLI11's own
// codes are 100-120), as for every other error of the tools.
#define APE_CLI_PARSE(app, argc, argv)                 \
  try {                                                \
    (app).parse((argc), (argv));                       \
  } catch (const CLI::ParseError &ape_cli_error_) {    \
    return (app).exit(ape_cli_error_) == 0 ? 0 : 1;    \
  }
