//===- launch.cpp - Launch environment detection and TCP rendezvous -------===//
#include "runtime/launch.h"

#include "runtime/error.h"

#include <arpa/inet.h>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sched.h>
#include <sys/socket.h>
#include <thread>
#include <unistd.h>

namespace ap::rt {

const char *launcherName(Launcher l) {
  switch (l) {
  case Launcher::None:
    return "none";
  case Launcher::Torchrun:
    return "torchrun";
  case Launcher::Mpirun:
    return "mpirun";
  case Launcher::Slurm:
    return "slurm";
  }
  return "?";
}

namespace {

int parseIntVar(const char *name, const char *value) {
  char *end = nullptr;
  errno = 0;
  long v = std::strtol(value, &end, 10);
  if (*value == '\0' || *end != '\0' || errno == ERANGE || v < 0 ||
      v > (1 << 24))
    fail("launch: environment variable ", name, "='", value,
         "' is not a valid non-negative integer");
  return int(v);
}

} // namespace

std::string firstSlurmHost(const std::string &nodelist) {
  // Grammar: host[,host...] where a host may carry one bracketed range list,
  // "prefix[a-b,c]suffix"; the first host is the prefix + first number.
  size_t end = 0;
  int depth = 0;
  while (end < nodelist.size()) {
    char c = nodelist[end];
    if (c == '[')
      ++depth;
    else if (c == ']')
      --depth;
    else if (c == ',' && depth == 0)
      break;
    ++end;
  }
  std::string host = nodelist.substr(0, end);
  size_t open = host.find('[');
  if (open == std::string::npos)
    return host;
  size_t close = host.find(']', open);
  std::string inner = host.substr(open + 1, close - open - 1);
  size_t stop = inner.find_first_of(",-");
  std::string first = inner.substr(0, stop);
  std::string suffix = close == std::string::npos ? "" : host.substr(close + 1);
  return host.substr(0, open) + first + suffix;
}

LaunchInfo
detectLaunch(const std::function<const char *(const char *)> &getenv) {
  LaunchInfo info;
  auto var = [&](const char *n) -> const char * {
    const char *v = getenv(n);
    return v && *v ? v : nullptr;
  };
  auto num = [&](const char *n, int fallback) {
    const char *v = var(n);
    return v ? parseIntVar(n, v) : fallback;
  };
  if (var("RANK") && var("WORLD_SIZE")) {
    info.launcher = Launcher::Torchrun;
    info.rank = num("RANK", 0);
    info.worldSize = num("WORLD_SIZE", 1);
    info.localRank = num("LOCAL_RANK", 0);
    info.localWorldSize = num("LOCAL_WORLD_SIZE", info.worldSize);
  } else if (var("OMPI_COMM_WORLD_RANK") && var("OMPI_COMM_WORLD_SIZE")) {
    info.launcher = Launcher::Mpirun;
    info.rank = num("OMPI_COMM_WORLD_RANK", 0);
    info.worldSize = num("OMPI_COMM_WORLD_SIZE", 1);
    info.localRank = num("OMPI_COMM_WORLD_LOCAL_RANK", 0);
    info.localWorldSize = num("OMPI_COMM_WORLD_LOCAL_SIZE", info.worldSize);
  } else if (var("PMI_RANK") && var("PMI_SIZE")) {
    info.launcher = Launcher::Mpirun;
    info.rank = num("PMI_RANK", 0);
    info.worldSize = num("PMI_SIZE", 1);
    info.localRank = num("MPI_LOCALRANKID", 0);
    info.localWorldSize = num("MPI_LOCALNRANKS", info.worldSize);
  } else if (var("SLURM_PROCID") && var("SLURM_NTASKS")) {
    info.launcher = Launcher::Slurm;
    info.rank = num("SLURM_PROCID", 0);
    info.worldSize = num("SLURM_NTASKS", 1);
    info.localRank = num("SLURM_LOCALID", 0);
    // SLURM_NTASKS_PER_NODE may read "4(x2)"; the leading count is enough.
    const char *per = var("SLURM_NTASKS_PER_NODE");
    info.localWorldSize = per ? std::atoi(per) : info.worldSize;
    if (info.localWorldSize <= 0)
      info.localWorldSize = info.worldSize;
    if (const char *nodes = var("SLURM_JOB_NODELIST"))
      info.masterAddr = firstSlurmHost(nodes);
  }
  if (const char *addr = var("MASTER_ADDR"))
    info.masterAddr = addr;
  if (var("MASTER_PORT")) {
    info.masterPort = num("MASTER_PORT", 29500);
    if (info.masterPort <= 0 || info.masterPort > 65535)
      fail("launch: MASTER_PORT=", info.masterPort, " is not a TCP port");
  }
  if (info.worldSize < 1 || info.rank >= info.worldSize)
    fail("launch: rank ", info.rank, " is outside the world of ",
         info.worldSize, " (launcher ", launcherName(info.launcher), ")");
  if (info.localWorldSize < 1 || info.localRank >= info.localWorldSize)
    fail("launch: local rank ", info.localRank, " is outside the ",
         info.localWorldSize, " local ranks (launcher ",
         launcherName(info.launcher), ")");
  return info;
}

unsigned usableCores() {
#if defined(__linux__)
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    int n = CPU_COUNT(&set);
    if (n > 0)
      return unsigned(n);
  }
#endif
  unsigned hw = std::thread::hardware_concurrency();
  return hw ? hw : 1;
}

LaunchInfo detectLaunch() {
  return detectLaunch([](const char *n) { return std::getenv(n); });
}

//===----------------------------------------------------------------------===//
// TcpRendezvous
//===----------------------------------------------------------------------===//

namespace {

constexpr uint32_t kMagic = 0x61707276; // "aprv"

using Clock = std::chrono::steady_clock;

double secondsLeft(Clock::time_point deadline) {
  return std::chrono::duration<double>(deadline - Clock::now()).count();
}

void waitReadable(int fd, Clock::time_point deadline, const char *what) {
  while (true) {
    double left = secondsLeft(deadline);
    if (left <= 0)
      fail("rendezvous: timed out waiting for ", what);
    pollfd p{fd, POLLIN, 0};
    int r = ::poll(&p, 1, int(std::min(left, 1.0) * 1000) + 1);
    if (r > 0)
      return;
    if (r < 0 && errno != EINTR)
      fail("rendezvous: poll failed while waiting for ", what, ": ",
           std::strerror(errno));
  }
}

void sendAll(int fd, const void *data, size_t n, int peer = -1) {
  const char *p = static_cast<const char *>(data);
  while (n > 0) {
    ssize_t w = ::send(fd, p, n, MSG_NOSIGNAL);
    if (w < 0) {
      if (errno == EINTR)
        continue;
      if (peer >= 0 && (errno == EPIPE || errno == ECONNRESET))
        fail("rendezvous: rank ", peer,
             " closed its connection (it failed or was killed)");
      fail("rendezvous: send failed: ", std::strerror(errno));
    }
    p += w;
    n -= size_t(w);
  }
}

/// `peer`: the rank at the other end (-1: not known yet, before its hello).
void recvAll(int fd, void *data, size_t n, Clock::time_point deadline,
             int peer = -1) {
  char *p = static_cast<char *>(data);
  while (n > 0) {
    waitReadable(fd, deadline, "a peer's message");
    ssize_t r = ::recv(fd, p, n, 0);
    if (r == 0) {
      if (peer >= 0)
        fail("rendezvous: rank ", peer,
             " closed its connection (it failed or was killed)");
      fail("rendezvous: a peer closed the connection (did another rank fail?)");
    }
    if (r < 0) {
      if (errno == EINTR || errno == EAGAIN)
        continue;
      // A peer killed with unread data in its socket resets the
      // connection instead of closing it.
      if (errno == ECONNRESET && peer >= 0)
        fail("rendezvous: rank ", peer,
             " closed its connection (it failed or was killed)");
      fail("rendezvous: recv failed: ", std::strerror(errno));
    }
    p += r;
    n -= size_t(r);
  }
}

void sendFrame(int fd, const std::vector<uint8_t> &bytes, int peer) {
  uint64_t n = bytes.size();
  sendAll(fd, &n, sizeof(n), peer);
  sendAll(fd, bytes.data(), bytes.size(), peer);
}

std::vector<uint8_t> recvFrame(int fd, Clock::time_point deadline, int peer) {
  uint64_t n = 0;
  recvAll(fd, &n, sizeof(n), deadline, peer);
  if (n > (uint64_t(1) << 30))
    fail("rendezvous: rank ", peer, " announced a ", n,
         "-byte message (protocol error)");
  std::vector<uint8_t> out(n);
  recvAll(fd, out.data(), out.size(), deadline, peer);
  return out;
}

} // namespace

TcpRendezvous::TcpRendezvous(const LaunchInfo &info, double timeoutSeconds)
    : rank_(info.rank), world_(info.worldSize), timeout_(timeoutSeconds) {
  if (world_ == 1)
    return;
  Clock::time_point deadline =
      Clock::now() + std::chrono::duration_cast<Clock::duration>(
                         std::chrono::duration<double>(timeout_));
  std::string port = std::to_string(info.masterPort);
  if (rank_ == 0) {
    listenFd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (listenFd_ < 0)
      fail("rendezvous: socket failed: ", std::strerror(errno));
    int one = 1;
    ::setsockopt(listenFd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_ANY);
    addr.sin_port = htons(uint16_t(info.masterPort));
    if (::bind(listenFd_, reinterpret_cast<sockaddr *>(&addr), sizeof(addr)) !=
        0)
      fail("rendezvous: rank 0 cannot listen on port ", info.masterPort, ": ",
           std::strerror(errno), " (set MASTER_PORT to a free port)");
    if (::listen(listenFd_, world_) != 0)
      fail("rendezvous: listen failed: ", std::strerror(errno));
    sockets_.assign(size_t(world_), -1);
    for (int connected = 1; connected < world_;) {
      waitReadable(listenFd_, deadline, "the other ranks to connect");
      int fd = ::accept4(listenFd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) {
        if (errno == EINTR)
          continue;
        fail("rendezvous: accept failed: ", std::strerror(errno));
      }
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      uint32_t hello[3];
      recvAll(fd, hello, sizeof(hello), deadline);
      if (hello[0] != kMagic || hello[2] != uint32_t(world_) || hello[1] == 0 ||
          hello[1] >= uint32_t(world_) || sockets_[hello[1]] != -1) {
        ::close(fd);
        fail("rendezvous: bad hello (rank ", hello[1], ", world ", hello[2],
             ") on port ", info.masterPort,
             ": another job on this port, or inconsistent WORLD_SIZE");
      }
      sockets_[hello[1]] = fd;
      ++connected;
    }
  } else {
    if (info.masterAddr.empty())
      fail("rendezvous: rank ", rank_,
           " needs MASTER_ADDR to reach rank 0 (torchrun-style launch)");
    addrinfo hints{};
    hints.ai_family = AF_INET;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo *res = nullptr;
    int gai =
        ::getaddrinfo(info.masterAddr.c_str(), port.c_str(), &hints, &res);
    if (gai != 0)
      fail("rendezvous: cannot resolve MASTER_ADDR '", info.masterAddr,
           "': ", ::gai_strerror(gai));
    int fd = -1;
    // Rank 0 may not be listening yet: retry until the deadline.
    while (true) {
      fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
      if (fd < 0) {
        ::freeaddrinfo(res);
        fail("rendezvous: socket failed: ", std::strerror(errno));
      }
      if (::connect(fd, res->ai_addr, res->ai_addrlen) == 0)
        break;
      int e = errno;
      ::close(fd);
      if (secondsLeft(deadline) <= 0) {
        ::freeaddrinfo(res);
        fail("rendezvous: rank ", rank_, " could not connect to ",
             info.masterAddr, ":", info.masterPort, " within ", timeout_,
             " s: ", std::strerror(e));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    ::freeaddrinfo(res);
    int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    uint32_t hello[3] = {kMagic, uint32_t(rank_), uint32_t(world_)};
    sendAll(fd, hello, sizeof(hello));
    sockets_.assign(1, fd);
  }
}

TcpRendezvous::~TcpRendezvous() {
  for (int fd : sockets_)
    if (fd >= 0)
      ::close(fd);
  if (listenFd_ >= 0)
    ::close(listenFd_);
}

std::vector<uint8_t>
TcpRendezvous::broadcast(const std::vector<uint8_t> &bytes) {
  if (world_ == 1)
    return bytes;
  auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                     std::chrono::duration<double>(timeout_));
  if (rank_ == 0) {
    for (int r = 1; r < world_; ++r)
      sendFrame(sockets_[r], bytes, r);
    return bytes;
  }
  return recvFrame(sockets_[0], deadline, 0);
}

std::vector<std::vector<uint8_t>>
TcpRendezvous::allGather(const std::vector<uint8_t> &mine) {
  if (world_ == 1)
    return {mine};
  auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                     std::chrono::duration<double>(timeout_));
  std::vector<std::vector<uint8_t>> all(static_cast<size_t>(world_));
  if (rank_ == 0) {
    all[0] = mine;
    for (int r = 1; r < world_; ++r)
      all[r] = recvFrame(sockets_[r], deadline, r);
    for (int r = 1; r < world_; ++r)
      for (int s = 0; s < world_; ++s)
        sendFrame(sockets_[r], all[s], r);
    return all;
  }
  sendFrame(sockets_[0], mine, 0);
  for (int s = 0; s < world_; ++s)
    all[s] = recvFrame(sockets_[0], deadline, 0);
  return all;
}

void TcpRendezvous::barrier() { allGather({}); }

} // namespace ap::rt
