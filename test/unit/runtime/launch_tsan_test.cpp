//===- launch_tsan_test.cpp - TCP rendezvous under ThreadSanitizer --------===//
//
// Four ranks as threads of one process: the rendezvous must not share state
// between instances (TSan reports any unsynchronised access).
//
//===----------------------------------------------------------------------===//
#include "runtime/launch.h"

#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <thread>
#include <unistd.h>

using namespace ap::rt;

namespace {

int freePort() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr *>(&a), sizeof(a));
  socklen_t len = sizeof(a);
  ::getsockname(fd, reinterpret_cast<sockaddr *>(&a), &len);
  int port = ntohs(a.sin_port);
  ::close(fd);
  return port;
}

TEST(RendezvousTsan, FourThreads) {
  const int world = 4, port = freePort();
  std::vector<int> ok(world, 0);
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r)
    threads.emplace_back([&, r] {
      LaunchInfo li;
      li.launcher = Launcher::Torchrun;
      li.rank = r;
      li.worldSize = world;
      li.masterAddr = "127.0.0.1";
      li.masterPort = port;
      TcpRendezvous rv(li, 60);
      bool good = true;
      for (int round = 0; round < 20; ++round) {
        std::vector<uint8_t> b = rv.broadcast({uint8_t(round), uint8_t(r)});
        good &= b == std::vector<uint8_t>{uint8_t(round), 0};
        auto all = rv.allGather({uint8_t(r * round)});
        for (int s = 0; s < world; ++s)
          good &= all[s] == std::vector<uint8_t>{uint8_t(s * round)};
        rv.barrier();
      }
      ok[r] = good;
    });
  for (auto &t : threads)
    t.join();
  for (int r = 0; r < world; ++r)
    EXPECT_TRUE(ok[r]) << "rank " << r;
}

} // namespace
