//===- GuardReplay.cpp - replay fuzz inputs against an unreadable page ----===//
//
// The main of TARGET-guard (fuzz/CMakeLists.txt): the same
// LLVMFuzzerTestOneInput as TARGET, without libFuzzer, called on each input
// file with the input's last byte at the end of a readable page and the page
// after it mapped PROT_NONE. Code that reads past the end of the input then
// faults on every run. Under libFuzzer such a read goes past a heap buffer:
// AddressSanitizer sees it only when the reading code is instrumented or
// hands the range to an intercepted libc call (Debian's libMLIR.so is not
// instrumented), and what the code reads there, so whether it stops, depends
// on what the heap held, so the finding need not reproduce when replayed.
//
//   fuzz_ir-guard FILE...   exit 0 when every input ran; a crash otherwise
//
// tools/scripts/fuzz.sh runs it on fuzz/regressions/TARGET/ before fuzzing,
// and on the inputs of --replay (docs/fuzzing.md).
//
//===----------------------------------------------------------------------===//

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <sys/mman.h>
#include <unistd.h>
#include <vector>

extern "C" int LLVMFuzzerInitialize(int *argc, char ***argv);
extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

namespace {

/// Runs the target on `bytes`, placed so that the byte after the last one is
/// the first byte of an unreadable page. False when the pages cannot be
/// mapped.
bool runGuarded(const std::vector<char> &bytes) {
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  const size_t readable = (bytes.size() + page - 1) / page * page;
  void *map = ::mmap(nullptr, readable + page, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (map == MAP_FAILED)
    return false;
  char *base = static_cast<char *>(map);
  if (::mprotect(base + readable, page, PROT_NONE) != 0) {
    ::munmap(map, readable + page);
    return false;
  }
  char *data = base + readable - bytes.size();
  if (!bytes.empty())
    std::memcpy(data, bytes.data(), bytes.size());
  // The target only reads the input, as under libFuzzer (which checks that).
  ::mprotect(base, readable, PROT_READ);
  LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t *>(data), bytes.size());
  ::munmap(map, readable + page);
  return true;
}

} // namespace

int main(int argc, char **argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s FILE...\n", argv[0]);
    return 2;
  }
  LLVMFuzzerInitialize(&argc, &argv);
  for (int i = 1; i < argc; ++i) {
    std::ifstream in(argv[i], std::ios::binary);
    if (!in) {
      std::fprintf(stderr, "%s: cannot read input '%s': %s\n", argv[0], argv[i],
                   std::strerror(errno));
      return 2;
    }
    std::vector<char> bytes((std::istreambuf_iterator<char>(in)),
                            std::istreambuf_iterator<char>());
    std::fprintf(stderr, "guarded replay: %s (%zu bytes)\n", argv[i],
                 bytes.size());
    if (!runGuarded(bytes)) {
      std::fprintf(stderr, "%s: cannot map %zu bytes and a guard page: %s\n",
                   argv[0], bytes.size(), std::strerror(errno));
      return 2;
    }
  }
  std::fprintf(stderr,
               "guarded replay: %d input(s) ran without reading past their "
               "end\n",
               argc - 1);
  return 0;
}
