//===- ByteSize.h - byte counts written with units ------------------------===//
//
// "18GiB", "19.5 GB", "512MiB", "4096": the one reader of sizes that users
// write, for the compiler (--memory-budget) and the training binary
// (--device-memory). Header-only and free of LLVM, so the runtime, which
// generated binaries link, needs no further library.
//
//===----------------------------------------------------------------------===//
#ifndef ACTPLACE_SUPPORT_BYTESIZE_H
#define ACTPLACE_SUPPORT_BYTESIZE_H

#include <cctype>
#include <cmath>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>

namespace ap::support {

/// Bytes of a positive number with an optional unit after it (spaces
/// allowed around both): B, KB, MB, GB, TB (powers of 1000), KiB, MiB, GiB,
/// TiB (powers of 1024). nullopt for anything else (no number, a sign, zero,
/// an unknown unit, not finite).
inline std::optional<double> parseByteSize(std::string_view text) {
  auto trim = [](std::string_view s) {
    while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front())))
      s.remove_prefix(1);
    while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back())))
      s.remove_suffix(1);
    return s;
  };
  std::string_view s = trim(text);
  static constexpr std::pair<std::string_view, double> kUnits[] = {
      {"KiB", 1024.0},
      {"MiB", 1048576.0},
      {"GiB", 1073741824.0},
      {"TiB", 1099511627776.0},
      {"KB", 1e3},
      {"MB", 1e6},
      {"GB", 1e9},
      {"TB", 1e12},
      {"B", 1.0}};
  double scale = 1.0;
  for (const auto &[unit, factor] : kUnits)
    if (s.size() > unit.size() && s.substr(s.size() - unit.size()) == unit) {
      s = trim(s.substr(0, s.size() - unit.size()));
      scale = factor;
      break;
    }
  // A plain decimal number: digits first (no sign, hex, inf or nan).
  if (s.empty() || !(std::isdigit(static_cast<unsigned char>(s.front())) ||
                     s.front() == '.'))
    return std::nullopt;
  std::string number(s);
  char *end = nullptr;
  double value = std::strtod(number.c_str(), &end);
  if (end != number.c_str() + number.size() || !(value > 0) ||
      !std::isfinite(value * scale))
    return std::nullopt;
  return value * scale;
}

} // namespace ap::support

#endif // ACTPLACE_SUPPORT_BYTESIZE_H
