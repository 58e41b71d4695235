//===- vocab_threads.h - split-vocabulary ranks as threads ------*- C++ -*-===//
//
// The kernel tests of a split vocabulary (kernels/dense.h VocabGroup) run
// the R ranks as R threads of one process. ThreadVocabGroup is their group:
// each rank's allGather copies its send buffer into its host slot, waits for
// every rank, copies the slots in rank order into recv, and waits again so
// that no slot is rewritten before every rank has read it. `Slots` moves the
// bytes: HostSlots for host buffers; the CUDA tests give their own for
// device buffers (copies on the rank's stream).
//
//===----------------------------------------------------------------------===//
#ifndef ACTPLACE_TEST_UNIT_KERNELS_VOCAB_THREADS_H
#define ACTPLACE_TEST_UNIT_KERNELS_VOCAB_THREADS_H

#include "kernels/kernels.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <thread>
#include <vector>

namespace ap::test {

/// A reusable barrier of `n` threads. A rank that never arrives is a kernel
/// bug (a missing or extra allGather): the test aborts instead of hanging.
class Barrier {
public:
  explicit Barrier(int n) : n_(n) {}
  void wait() {
    std::unique_lock<std::mutex> lock(mu_);
    const uint64_t gen = gen_;
    if (++arrived_ == n_) {
      arrived_ = 0;
      ++gen_;
      cv_.notify_all();
      return;
    }
    if (!cv_.wait_for(lock, std::chrono::seconds(120),
                      [&] { return gen_ != gen; })) {
      std::fprintf(stderr, "barrier: a rank never arrived\n");
      std::abort();
    }
  }

private:
  std::mutex mu_;
  std::condition_variable cv_;
  const int n_;
  int arrived_ = 0;
  uint64_t gen_ = 0;
};

/// Host buffers: plain copies.
struct HostSlots {
  static bool toSlot(const kernels::KernelContext &, const float *send,
                     std::vector<float> &slot, int64_t n) {
    slot.assign(send, send + n);
    return true;
  }
  static bool fromSlot(const kernels::KernelContext &,
                       const std::vector<float> &slot, float *recv) {
    std::copy(slot.begin(), slot.end(), recv);
    return true;
  }
  static bool done(const kernels::KernelContext &) { return true; }
};

template <class Slots> class ThreadVocabGroup {
public:
  explicit ThreadVocabGroup(int ranks)
      : barrier_(ranks), slots_(ranks), members_(ranks), calls_(ranks, 0) {
    for (int r = 0; r < ranks; ++r)
      members_[r] = {this, r};
  }
  int ranks() const { return int(slots_.size()); }
  /// Rank r's group, `vocab` rows per rank.
  kernels::VocabGroup group(int r, int64_t vocab) {
    kernels::VocabGroup g;
    g.ranks = ranks();
    g.offset = r * vocab;
    g.allGather = &ThreadVocabGroup::allGather;
    g.self = &members_[r];
    return g;
  }
  /// Runs fn(rank) on one thread per rank and joins them.
  template <class Fn> void run(Fn &&fn) {
    std::vector<std::thread> threads;
    for (int r = 0; r < ranks(); ++r)
      threads.emplace_back([&fn, r] { fn(r); });
    for (auto &t : threads)
      t.join();
  }
  int64_t calls(int r) const { return calls_[r]; }
  /// False once a copy failed or the ranks gathered different counts.
  bool ok() const { return ok_; }

private:
  struct Member {
    ThreadVocabGroup *group = nullptr;
    int rank = 0;
  };
  static void allGather(void *self, const kernels::KernelContext &ctx,
                        const float *send, float *recv, int64_t n) {
    auto *m = static_cast<Member *>(self);
    ThreadVocabGroup &g = *m->group;
    bool ok = Slots::toSlot(ctx, send, g.slots_[m->rank], n);
    ++g.calls_[m->rank];
    g.barrier_.wait();
    for (int k = 0; k < g.ranks(); ++k)
      ok = ok && int64_t(g.slots_[k].size()) == n &&
           Slots::fromSlot(ctx, g.slots_[k], recv + k * n);
    ok = Slots::done(ctx) && ok;
    if (!ok)
      g.ok_ = false;
    g.barrier_.wait();
  }

  Barrier barrier_;
  std::vector<std::vector<float>> slots_;
  std::vector<Member> members_;
  std::vector<int64_t> calls_;
  std::atomic<bool> ok_{true};
};

} // namespace ap::test

#endif // ACTPLACE_TEST_UNIT_KERNELS_VOCAB_THREADS_H
