//===- sha256_test.cpp - SHA-256 against FIPS 180 vectors -----------------===//
#include "runtime/sha256.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

using ap::rt::Sha256;
using ap::rt::sha256Hex;

namespace {

std::string digestOf(const std::string &s) {
  return sha256Hex(s.data(), s.size());
}

// Vectors from FIPS 180-2 Appendix B and the NIST CSRC example values.
TEST(Sha256, Empty) {
  EXPECT_EQ(digestOf(""),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(sha256Hex(nullptr, 0),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
}

TEST(Sha256, Abc) {
  EXPECT_EQ(digestOf("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

TEST(Sha256, Message448Bits) {
  EXPECT_EQ(
      digestOf("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
      "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
}

TEST(Sha256, Message896Bits) {
  EXPECT_EQ(
      digestOf("abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmn"
               "hijklmnoijklmnopjklmnopqklmnopqrlmnopqrsmnopqrstnopqrstu"),
      "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1");
}

TEST(Sha256, OneMillionA) {
  std::string a(1000000, 'a');
  const char *expect =
      "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0";
  EXPECT_EQ(digestOf(a), expect);
  // The same message fed in awkward chunk sizes must give the same digest:
  // this exercises the partial-block buffering in update().
  Sha256 h;
  size_t off = 0, chunk = 1;
  while (off < a.size()) {
    size_t take = std::min(chunk, a.size() - off);
    h.update(a.data() + off, take);
    off += take;
    chunk = chunk * 7 % 131 + 1;
  }
  EXPECT_EQ(Sha256::hex(h.finish()), expect);
}

TEST(Sha256, PaddingBoundaries) {
  // Lengths at the 55/56/64-byte padding edges (one vs two final blocks);
  // expected digests from coreutils sha256sum.
  EXPECT_EQ(digestOf(std::string(55, 'a')),
            "9f4390f8d30c2dd92ec9f095b65e2b9ae9b0a925a5258e241c9f1e910f734318");
  EXPECT_EQ(digestOf(std::string(56, 'a')),
            "b35439a4ac6f0948b6d6f9e3c6af0f5f590ce20f1bde7090ef7970686ec6738a");
  EXPECT_EQ(digestOf(std::string(64, 'a')),
            "ffe054fe7ae0cb6dc65c3af9b61d5209f439851db43d0ba5997337df154668eb");
}

TEST(Sha256, FinishResets) {
  Sha256 h;
  h.update("abc", 3);
  auto first = h.finish();
  h.update("abc", 3);
  EXPECT_EQ(h.finish(), first);
}

} // namespace
