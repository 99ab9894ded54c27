// The command-line conventions every tool shares (ape-train, ape-eval, ape-generate, ape-check).
#pragma once

#include <cerrno>
#include <algorithm>
#include <cstdlib>
#include <iostream>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>

#include "runtime/Util.h"

namespace ape::cli {

// Whole numbers as a user writes them: CLI11 reads a leading 0 as octal (`-n 010` sampled 8
// tokens, `--eval-multiples 010` meant 10) and saturates what does not fit 64 bits (a --seed of
// 2^64 - 1 ran as 2^63 - 1, an --eval-tokens of 10^20 was reported as 2^63 - 1), and takes 0x10 as
// 16 (a hex value past 64 bits capped at 2^63 - 1 too). Refuses all three: a whole number here is
// an optional sign and decimal digits. No description: --help's type names stay as they are.
inline CLI::Validator whole_decimal() {
  return CLI::Validator(
      [](std::string &s) -> std::string {
        const size_t i = !s.empty() && (s[0] == '-' || s[0] == '+') ? 1 : 0;
        if (i >= s.size()) return "";
        for (size_t j = i; j < s.size(); ++j)
          if (s[j] < '0' || s[j] > '9') return "the value " + s + " is not a whole decimal number";
        if (s.size() - i > 1 && s[i] == '0')
          return "the value " + s + " starts with 0 (numbers are decimal here): write it without the leading zeros";
        errno = 0;
        char *end = nullptr;
        std::strtoll(s.c_str(), &end, 10);
        if (errno == ERANGE) return "the value " + s + " does not fit a 64-bit integer";
        return "";
      },
      "");
}

// Real numbers as a user writes them: CLI11 also takes C's other forms, a hex float (`--minutes
// 0x10` ran for 16 minutes, `--lr 0x1p-8` at 0.0039) and leading spaces (`--minutes " 5"`). Here a
// real number is an optional sign, decimal digits with at most one '.', and an optional exponent
// (e or E, an optional sign, digits); nan and inf pass on to the option's own range check, which
// names them. No description: --help's type names stay as they are.
inline CLI::Validator real_decimal() {
  return CLI::Validator(
      [](std::string &s) -> std::string {
        return ape::is_decimal_real(s) ? std::string() : "the value " + s + " is not a decimal number";
      },
      "");
}

// "a,,b," -> {"a", "", "b", ""}: every item, the empty ones too (CLI::detail::split drops a
// trailing one).
inline std::vector<std::string> split_items(const std::string &value) {
  std::vector<std::string> items;
  for (size_t begin = 0;;) {
    const size_t end = value.find(',', begin);
    items.push_back(value.substr(begin, end == std::string::npos ? std::string::npos : end - begin));
    if (end == std::string::npos) return items;
    begin = end + 1;
  }
}

// Options made by add_list_option (below) carry a validator of this name.
constexpr const char *kListValidator = "ape-list";
inline bool is_list_option(CLI::Option &o) {
  try {
    o.get_validator(kListValidator);
    return true;
  } catch (const CLI::OptionNotFound &) {
    return false;
  }
}

// whole_decimal on every integer option of `app` (CLI11's type names INT and UINT, with or
// without validators' suffixes) and real_decimal on every real one (FLOAT): called by
// APE_CLI_PARSE, so no tool's option goes without them.
inline void check_whole_numbers(CLI::App &app) {
  for (CLI::Option *o : app.get_options()) {
    const std::string t = o->get_type_name();
    auto is = [&](const char *name) {
      const size_t n = std::char_traits<char>::length(name);
      return t.compare(0, n, name) == 0 && (t.size() == n || t[n] == ':');
    };
    if (is_list_option(*o)) continue;  // (each item checked by add_list_option)
    if (is("INT") || is("UINT")) o->check(whole_decimal());
    else if (is("FLOAT")) o->check(real_decimal());
  }
}

// An empty value: `--out ''` failed later with "output folder  cannot be created", `--resume ''`
// trained from scratch as if no --resume had been given, `--csv ''` said it could not write "".
// Refused on every option of `app` that takes a value (an empty --prompt too: it had its own
// refusal, "the prompt is empty").
inline void check_nonempty_values(CLI::App &app) {
  for (CLI::Option *o : app.get_options()) {
    if (o->get_expected_min() < 1) continue;  // (a flag)
    o->check(CLI::Validator([](std::string &s) { return s.empty() ? std::string("the value is empty") : std::string(); }, ""));
  }
}

// A comma-separated list option (repeatable too): `-e rope,cable` or `-e rope -e cable`. CLI11's
// own delimiter drops empty items, so `-e rope,,cable` and `--cuda-archs 80,` ran with what was
// left without a word; here an empty item is refused with the option's other errors, and each item
// converts as the option's own type would (a whole number by whole_decimal). The list replaces
// `target` when the option is given; `target`'s value stands as the default otherwise (shown by
// --help where `show_default`).
template <class T>
CLI::Option *add_list_option(CLI::App &app, const std::string &name, std::vector<T> &target, const std::string &help,
                             bool show_default = false) {
  CLI::Option *o = app.add_option_function<std::vector<std::string>>(
      name,
      [&target](const std::vector<std::string> &values) {
        std::vector<T> items;
        for (const std::string &value : values)
          for (const std::string &item : split_items(value)) {
            T converted{};
            if (!CLI::detail::lexical_cast(item, converted)) throw CLI::ConversionError(item, "");
            items.push_back(std::move(converted));
          }
        target = std::move(items);
      },
      help);
  o->check(CLI::Validator(
      [](std::string &value) -> std::string {
        const std::vector<std::string> items = split_items(value);
        for (const std::string &item : items) {
          if (item.empty())
            return "an empty item in the list '" + value + "' (items are separated by single commas)";
          if constexpr (std::is_integral_v<T>)
            if (std::string bad = whole_decimal()(item); !bad.empty()) return bad;
          T converted{};
          if (!CLI::detail::lexical_cast(item, converted))
            return "the value " + item + (std::is_integral_v<T> ? " is not a whole number of this option's range" : " is not valid here");
        }
        return "";
      },
      "", kListValidator));
  o->type_name(std::is_integral_v<T> ? "INT" : "TEXT");
  if (show_default) {
    std::string shown;
    for (size_t n = 0; n < target.size(); ++n) shown += (n ? "," : "") + CLI::detail::to_string(target[n]);
    o->default_str(shown);
  }
  return o;
}

// A command line's unknown options, each with the closest option of `app` when one is near (an edit
// distance of at most a third of the name, and 3): "unknown option '--step' (did you mean
// '--steps'?)"; "" when the error has none (CLI11's own message then stands).
inline std::string unknown_options_message(const CLI::App &app, const CLI::ParseError &e) {
  if (dynamic_cast<const CLI::ExtrasError *>(&e) == nullptr) return "";
  auto distance = [](const std::string &a, const std::string &b) {
    std::vector<size_t> row(b.size() + 1);
    for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
    for (size_t i = 1; i <= a.size(); ++i) {
      size_t diag = row[0];
      row[0] = i;
      for (size_t j = 1; j <= b.size(); ++j) {
        const size_t up = row[j];
        row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
        diag = up;
      }
    }
    return row[b.size()];
  };
  std::vector<std::string> names;
  for (const CLI::Option *o : app.get_options()) {
    for (const std::string &n : o->get_lnames()) names.push_back("--" + n);
    for (const std::string &n : o->get_snames()) names.push_back("-" + n);
  }
  std::vector<std::string> extras = app.remaining();
  std::string out, others;  // the unknown options; the arguments that are not options
  for (const std::string &raw : extras) {
    if (raw.size() < 2 || raw[0] != '-' || (raw[1] >= '0' && raw[1] <= '9') || raw[1] == '.') {
      others += (others.empty() ? "" : " ") + raw;
      continue;
    }
    const std::string arg = raw.substr(0, raw.find('='));
    std::string best;
    size_t best_d = std::string::npos;
    for (const std::string &n : names)
      if (const size_t d = distance(arg, n); d < best_d) best_d = d, best = n;
    out += std::string(out.empty() ? "" : "; ") + "unknown option '" + arg + "'";
    if (!best.empty() && best_d <= std::min<size_t>(3, std::max<size_t>(1, arg.size() / 3)))
      out += " (did you mean '" + best + "'?)";
  }
  if (!others.empty())  // (an unknown option's value among them, or arguments where none is taken)
    out += std::string(out.empty() ? "" : "; ") + "unexpected argument(s): " + others;
  return out;
}

// What a tool does with a refused command line: --help (exit status 0) and CLI11's errors as CLI11
// prints them, unknown options as "TOOL: error: unknown option '--step' (did you mean '--steps'?)".
// Returns CLI11's exit status (0 for --help).
inline int report_parse_error(const CLI::App &app, const CLI::ParseError &e, const char *argv0) {
  const std::string unknown = unknown_options_message(app, e);
  if (unknown.empty()) return app.exit(e);
  std::string tool = argv0 ? argv0 : "ape";
  tool = tool.substr(tool.find_last_of('/') == std::string::npos ? 0 : tool.find_last_of('/') + 1);
  std::cerr << tool << ": error: " << unknown << "; run " << tool << " --help for the options\n";
  return e.get_exit_code();
}

}  // namespace ape::cli

// CLI11_PARSE with every number option decimal (integers within 64 bits: check_whole_numbers), no empty
// value (check_nonempty_values), and the tools' exit status: 0 for --help, 1 for a bad command line (CLI11's own
// codes are 100-120), as for every other error of the tools; APE_CLI_PARSE_STATUS gives another
// status for a bad command line (ape-check's 2: 1 is its failed check).
#define APE_CLI_PARSE_STATUS(app, argc, argv, status)        \
  try {                                                      \
    ape::cli::check_whole_numbers(app);                      \
    ape::cli::check_nonempty_values(app);                    \
    (app).parse((argc), (argv));                             \
  } catch (const CLI::ParseError &ape_cli_error_) {          \
    return ape::cli::report_parse_error((app), ape_cli_error_, (argv)[0]) == 0 ? 0 : (status); \
  }
#define APE_CLI_PARSE(app, argc, argv) APE_CLI_PARSE_STATUS(app, argc, argv, 1)
