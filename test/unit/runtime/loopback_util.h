//===- loopback_util.h - Ranks as threads on the loopback ----*- C++ -*-===//
//
// Helpers for tests that run a torchrun-style world (TCP rendezvous) as
// threads of one process: a free port and each rank's launch info.
//
//===----------------------------------------------------------------------===//
#ifndef ACTPLACE_TEST_UNIT_RUNTIME_LOOPBACK_UTIL_H
#define ACTPLACE_TEST_UNIT_RUNTIME_LOOPBACK_UTIL_H

#include "runtime/launch.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

namespace ap::rt::test {

/// A free TCP port on the loopback interface (bound, then released).
inline int freePort() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  ::bind(fd, reinterpret_cast<sockaddr *>(&a), sizeof(a));
  socklen_t len = sizeof(a);
  ::getsockname(fd, reinterpret_cast<sockaddr *>(&a), &len);
  int port = ntohs(a.sin_port);
  ::close(fd);
  return port;
}

/// Rank `rank` of a torchrun-style world of `world` meeting at
/// 127.0.0.1:`port`.
inline LaunchInfo loopbackRank(int rank, int world, int port) {
  LaunchInfo li;
  li.launcher = Launcher::Torchrun;
  li.rank = rank;
  li.worldSize = world;
  li.localRank = rank;
  li.localWorldSize = world;
  li.masterAddr = "127.0.0.1";
  li.masterPort = port;
  return li;
}

} // namespace ap::rt::test

#endif // ACTPLACE_TEST_UNIT_RUNTIME_LOOPBACK_UTIL_H
