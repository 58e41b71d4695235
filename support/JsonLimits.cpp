//===- JsonLimits.cpp - bounds checked before a JSON document is parsed ---===//

#include "support/JsonLimits.h"

#include <cstdint>
#include <unordered_map>
#include <vector>

using namespace ap::support;

namespace {

void appendUtf8(uint32_t cp, std::string &out) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

/// The four hex digits at `at`, or nullopt.
std::optional<uint32_t> hex4(std::string_view s, size_t at) {
  if (at + 4 > s.size())
    return std::nullopt;
  uint32_t v = 0;
  for (size_t i = at; i < at + 4; ++i) {
    char c = s[i];
    v <<= 4;
    if (c >= '0' && c <= '9')
      v |= c - '0';
    else if (c >= 'a' && c <= 'f')
      v |= c - 'a' + 10;
    else if (c >= 'A' && c <= 'F')
      v |= c - 'A' + 10;
    else
      return std::nullopt;
  }
  return v;
}

/// Decodes the body of a JSON string (between the quotes) so that keys
/// spelled with different escapes compare equal, as they do once parsed.
/// Malformed escapes are kept as written; the parser rejects them later.
std::string decodeString(std::string_view body) {
  std::string out;
  for (size_t i = 0; i < body.size(); ++i) {
    char c = body[i];
    if (c != '\\' || i + 1 == body.size()) {
      out += c;
      continue;
    }
    char e = body[++i];
    if (e != 'u') {
      // The one-letter escapes; '"', '\\', '/' (and anything the parser
      // will refuse) stand for themselves.
      static constexpr std::string_view from = "bfnrt", to = "\b\f\n\r\t";
      size_t k = from.find(e);
      out += k == std::string_view::npos ? e : to[k];
      continue;
    }
    std::optional<uint32_t> cp = hex4(body, i + 1);
    if (!cp) {
      out += "\\u";
      continue;
    }
    i += 4;
    // A high surrogate followed by an escaped low one is one code point.
    if (*cp >= 0xD800 && *cp < 0xDC00 && i + 2 < body.size() &&
        body[i + 1] == '\\' && body[i + 2] == 'u')
      if (std::optional<uint32_t> lo = hex4(body, i + 3);
          lo && *lo >= 0xDC00 && *lo < 0xE000) {
        *cp = 0x10000 + ((*cp - 0xD800) << 10) + (*lo - 0xDC00);
        i += 6;
      }
    appendUtf8(*cp, out);
  }
  return out;
}

struct Frame {
  bool isObject = false;
  /// In an object: the next string is a key (after '{' or ',').
  bool expectKey = false;
  /// Decoded key -> the line it first occurs on.
  std::unordered_map<std::string, unsigned> keys;
};

} // namespace

std::optional<JsonScanProblem>
ap::support::scanJsonLimits(std::string_view text, unsigned maxNesting,
                            bool rejectDuplicateKeys) {
  std::vector<Frame> stack;
  unsigned line = 1;
  size_t lineStart = 0;
  auto problem = [&](unsigned atLine, size_t offset, size_t atLineStart,
                     std::string message) {
    return JsonScanProblem{atLine,
                           static_cast<unsigned>(offset - atLineStart + 1),
                           std::move(message)};
  };
  for (size_t i = 0; i < text.size(); ++i) {
    char c = text[i];
    switch (c) {
    case '\n':
      ++line;
      lineStart = i + 1;
      break;
    case '"': {
      size_t start = i;
      unsigned startLine = line;
      size_t startLineStart = lineStart;
      for (++i; i < text.size() && text[i] != '"'; ++i) {
        if (text[i] == '\\')
          ++i;
        else if (text[i] == '\n') {
          ++line;
          lineStart = i + 1;
        }
      }
      if (i >= text.size())
        return std::nullopt; // unterminated string: the parser says so
      if (stack.empty() || !stack.back().isObject || !stack.back().expectKey)
        break;
      stack.back().expectKey = false;
      if (!rejectDuplicateKeys)
        break;
      std::string_view raw = text.substr(start + 1, i - start - 1);
      auto [it, inserted] =
          stack.back().keys.emplace(decodeString(raw), startLine);
      if (!inserted) {
        std::string shown(raw.substr(0, 80));
        if (raw.size() > 80)
          shown += "...";
        return problem(startLine, start, startLineStart,
                       "duplicate key \"" + shown + "\" (first at line " +
                           std::to_string(it->second) +
                           "); each key may occur once per object");
      }
      break;
    }
    case '[':
    case '{':
      if (stack.size() >= maxNesting)
        return problem(line, i, lineStart,
                       "arrays and objects nested deeper than " +
                           std::to_string(maxNesting) + " levels (the limit)");
      stack.emplace_back();
      stack.back().isObject = c == '{';
      stack.back().expectKey = c == '{';
      break;
    case ']':
    case '}':
      // A stray closer is a syntax error the parser names.
      if (!stack.empty())
        stack.pop_back();
      break;
    case ',':
      if (!stack.empty() && stack.back().isObject)
        stack.back().expectKey = true;
      break;
    default:
      break;
    }
  }
  return std::nullopt;
}
