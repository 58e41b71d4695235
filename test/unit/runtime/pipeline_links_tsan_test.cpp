//===- pipeline_links_tsan_test.cpp - Pipeline links, scripted peer ------===//
//
// The host form of runtime/pipeline.h in one process, over a communicator
// whose sends block until the test releases them (a receiver that has not
// posted its receive yet): the comm stream goes on past a send that cannot
// complete (a receive after it finishes first), drain() waits for it, the
// messages leave in issue order with the bytes the arena held when the
// comm stream reached each send, and a failed send is reported by drain()
// naming the peer. Also built with ThreadSanitizer (the sender threads).
//
//===----------------------------------------------------------------------===//
#include "runtime/pipeline.h"

#include "runtime/error.h"

#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <future>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

using namespace ap::rt;

using ap::kernels::DType;

namespace {

/// Stage `rank` of two; sends wait for release() (or fail with `error`),
/// receives deliver `incoming` at once.
class ScriptedPeer final : public Communicator {
public:
  explicit ScriptedPeer(int rank) : rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return 2; }
  ap::kernels::Backend backend() const override {
    return ap::kernels::Backend::Host;
  }
  const char *kind() const override { return "scripted"; }

  void send(const void *buf, size_t count, DType dtype, int peer,
            void *) override {
    std::unique_lock<std::mutex> lock(mutex_);
    released_.wait(lock, [&] { return open_; });
    if (!error.empty())
      fail(error);
    const char *p = static_cast<const char *>(buf);
    sent.push_back({peer, std::string(p, p + count * dtypeBytes(dtype))});
  }
  void recv(void *buf, size_t count, DType dtype, int, void *) override {
    std::memset(buf, incoming, count * dtypeBytes(dtype));
  }
  void release() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      open_ = true;
    }
    released_.notify_all();
  }

  void allReduceSum(const void *, void *, size_t, DType, void *) override {
    fail("unused");
  }
  void reduceScatterSum(const void *, void *, size_t, DType, void *) override {
    fail("unused");
  }
  void reduceScatterSumAdd(void *, void *, size_t, DType, void *) override {
    fail("unused");
  }
  void reduceScatterSumAddBf16(float *, ap::kernels::bf16 *, size_t,
                               void *) override {
    fail("unused");
  }
  void allGather(const void *, void *, size_t, DType, void *) override {
    fail("unused");
  }
  void broadcast(void *, size_t, DType, int, void *) override {
    fail("unused");
  }
  void barrier() override {}
  bool allTrue(bool v) override { return v; }
  std::unique_ptr<Communicator> split(int, int) override { fail("unused"); }

  std::vector<std::pair<int, std::string>> sent; ///< (peer, bytes)
  std::string error;
  char incoming = 7;

private:
  int rank_;
  std::mutex mutex_;
  std::condition_variable released_;
  bool open_ = false;
};

class PipelineLinksTest : public ::testing::Test {
protected:
  void SetUp() override {
    DeviceOptions options;
    options.device = DeviceKind::Host;
    options.quiet = true;
    dev = std::make_unique<Device>(options);
    dev->allocateArena(4096);
  }
  char *at(uint64_t offset) { return static_cast<char *>(dev->at(offset)); }
  /// Whether the comm stream's work completes within a few seconds (a send
  /// that blocked it would not); if not, `peer`'s sends are released so the
  /// test can end.
  bool commCompletes(ScriptedPeer &peer) {
    auto done =
        std::async(std::launch::async, [&] { dev->synchronize(Stream::Comm); });
    bool ok =
        done.wait_for(std::chrono::seconds(5)) == std::future_status::ready;
    if (!ok)
      peer.release();
    return ok;
  }
  std::unique_ptr<Device> dev;
};

TEST_F(PipelineLinksTest, SendsDoNotBlockTheCommStream) {
  ScriptedPeer peer(0);
  auto links = createPipelineLinks(*dev, peer);
  std::memset(at(0), 'a', 64);
  links->send(at(0), 64, PipelinePeer::Next);
  // The next send's bytes are written after the comm stream passed the
  // first send: the first message keeps what the arena held then.
  ASSERT_TRUE(commCompletes(peer)) << "a send blocked the comm stream";
  std::memset(at(0), 'b', 64);
  links->send(at(0), 64, PipelinePeer::Next);
  links->recv(at(256), 64, PipelinePeer::Next);
  // Both sends are still waiting for their receiver; the receive behind
  // them on the comm stream completed.
  ASSERT_TRUE(commCompletes(peer)) << "a send blocked the comm stream";
  EXPECT_EQ(at(256)[0], 7);
  EXPECT_EQ(at(256)[63], 7);
  EXPECT_TRUE(peer.sent.empty());
  auto drained = std::async(std::launch::async, [&] { links->drain(); });
  EXPECT_EQ(drained.wait_for(std::chrono::milliseconds(100)),
            std::future_status::timeout)
      << "drain returned before the sends completed";
  peer.release();
  drained.get();
  ASSERT_EQ(peer.sent.size(), 2u);
  EXPECT_EQ(peer.sent[0], std::make_pair(1, std::string(64, 'a')));
  EXPECT_EQ(peer.sent[1], std::make_pair(1, std::string(64, 'b')));
}

TEST_F(PipelineLinksTest, AFailedSendIsReportedNamingThePeer) {
  ScriptedPeer peer(1);
  peer.error = "the link went down";
  peer.release();
  auto links = createPipelineLinks(*dev, peer);
  links->send(at(0), 64, PipelinePeer::Prev);
  try {
    links->drain();
    FAIL() << "a failed send was not reported";
  } catch (const Error &e) {
    EXPECT_NE(std::string(e.what()).find(
                  "pipeline: stage 1: a send to the previous stage (stage 0) "
                  "failed: the link went down"),
              std::string::npos)
        << e.what();
  }
  // Stage 1 of 2 has no next stage; odd byte counts are no message.
  EXPECT_THROW(links->send(at(0), 64, PipelinePeer::Next), Error);
  EXPECT_THROW(links->recv(at(0), 63, PipelinePeer::Prev), Error);
}

} // namespace
