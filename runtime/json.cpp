//===- json.cpp - JSON documents of the runtime (nlohmann-json) -----------===//
#include "runtime/json.h"

#include "runtime/error.h"

#include <set>
#include <vector>

namespace ap::rt {

namespace {

/// The reason of a nlohmann exception without its "[json.exception...]"
/// tag and, for parse errors, its "parse error at line 1, column N: "
/// prefix (the caller gives the byte offset).
std::string reasonOf(const nlohmann::json::exception &e) {
  std::string text = e.what();
  size_t tag = text.find("] ");
  if (tag != std::string::npos)
    text = text.substr(tag + 2);
  if (text.rfind("parse error", 0) == 0) {
    size_t colon = text.find(": ");
    if (colon != std::string::npos)
      text = text.substr(colon + 2);
  }
  return text;
}

} // namespace

Json parseJson(const std::string &text, const std::string &what) {
  // nlohmann's parser keeps one of two equal keys and has no depth bound of
  // its own; its callback sees every key and container as it is read, with
  // the number of containers around it.
  std::vector<std::set<std::string>> keys; // one per open object
  auto check = [&](int depth, Json::parse_event_t event, Json &parsed) {
    if (depth > kMaxJsonDepth)
      fail(what, ": malformed JSON: values nested deeper than ", kMaxJsonDepth,
           " levels");
    switch (event) {
    case Json::parse_event_t::object_start:
      keys.emplace_back();
      break;
    case Json::parse_event_t::object_end:
      keys.pop_back();
      break;
    case Json::parse_event_t::key: {
      const std::string &key = parsed.get_ref<const std::string &>();
      if (!keys.back().insert(key).second)
        fail(what, ": malformed JSON: duplicate key \"", key, "\"");
      break;
    }
    default:
      break;
    }
    return true;
  };
  try {
    return Json::parse(text, check);
  } catch (const Json::parse_error &e) {
    fail(what, ": malformed JSON at byte ", e.byte, ": ", reasonOf(e));
  }
}

std::string dumpJson(const Json &value, const std::string &what, int indent) {
  try {
    return value.dump(indent);
  } catch (const Json::type_error &e) {
    fail(what, ": cannot be written as JSON: ", reasonOf(e));
  }
}

} // namespace ap::rt
