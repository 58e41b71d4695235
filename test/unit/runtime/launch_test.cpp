//===- launch_test.cpp - Launch env detection and TCP rendezvous ----------===//
#include "runtime/launch.h"

#include "runtime/error.h"
#include "test/unit/runtime/loopback_util.h"

#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <map>
#include <netinet/in.h>
#include <sched.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>

using namespace ap::rt;

namespace {

LaunchInfo detectFrom(const std::map<std::string, std::string> &env) {
  return detectLaunch([&](const char *n) -> const char * {
    auto it = env.find(n);
    return it == env.end() ? nullptr : it->second.c_str();
  });
}

TEST(Launch, NoLauncherIsWorldOfOne) {
  LaunchInfo li = detectFrom({});
  EXPECT_EQ(li.launcher, Launcher::None);
  EXPECT_EQ(li.rank, 0);
  EXPECT_EQ(li.worldSize, 1);
  EXPECT_EQ(li.localRank, 0);
}

TEST(Launch, Torchrun) {
  LaunchInfo li = detectFrom({{"RANK", "3"},
                              {"WORLD_SIZE", "8"},
                              {"LOCAL_RANK", "1"},
                              {"LOCAL_WORLD_SIZE", "2"},
                              {"MASTER_ADDR", "node7"},
                              {"MASTER_PORT", "12345"},
                              // torchrun inside Slurm: explicit RANK wins.
                              {"SLURM_PROCID", "0"},
                              {"SLURM_NTASKS", "1"}});
  EXPECT_EQ(li.launcher, Launcher::Torchrun);
  EXPECT_EQ(li.rank, 3);
  EXPECT_EQ(li.worldSize, 8);
  EXPECT_EQ(li.localRank, 1);
  EXPECT_EQ(li.localWorldSize, 2);
  EXPECT_EQ(li.masterAddr, "node7");
  EXPECT_EQ(li.masterPort, 12345);
}

TEST(Launch, MpirunAndSlurm) {
  LaunchInfo m = detectFrom({{"OMPI_COMM_WORLD_RANK", "1"},
                             {"OMPI_COMM_WORLD_SIZE", "2"},
                             {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                             {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}});
  EXPECT_EQ(m.launcher, Launcher::Mpirun);
  EXPECT_EQ(m.rank, 1);
  EXPECT_EQ(m.worldSize, 2);
  EXPECT_EQ(m.localRank, 1);
  LaunchInfo h = detectFrom({{"PMI_RANK", "2"}, {"PMI_SIZE", "4"}});
  EXPECT_EQ(h.launcher, Launcher::Mpirun);
  EXPECT_EQ(h.rank, 2);
  LaunchInfo s =
      detectFrom({{"SLURM_PROCID", "5"},
                  {"SLURM_NTASKS", "16"},
                  {"SLURM_LOCALID", "1"},
                  {"SLURM_NTASKS_PER_NODE", "4(x4)"},
                  {"SLURM_JOB_NODELIST", "gpu[003-006,010],login1"}});
  EXPECT_EQ(s.launcher, Launcher::Slurm);
  EXPECT_EQ(s.rank, 5);
  EXPECT_EQ(s.worldSize, 16);
  EXPECT_EQ(s.localRank, 1);
  EXPECT_EQ(s.localWorldSize, 4);
  EXPECT_EQ(s.masterAddr, "gpu003");
  EXPECT_EQ(s.masterPort, 29500);
}

TEST(Launch, SlurmNodeLists) {
  EXPECT_EQ(firstSlurmHost("node1"), "node1");
  EXPECT_EQ(firstSlurmHost("a[7,9],b"), "a7");
  EXPECT_EQ(firstSlurmHost("rack1-n[01-04]-ib"), "rack1-n01-ib");
  EXPECT_EQ(firstSlurmHost("x,y"), "x");
  EXPECT_EQ(firstSlurmHost(""), "");
}

TEST(Launch, BadEnvironmentIsAnError) {
  EXPECT_THROW(detectFrom({{"RANK", "4"}, {"WORLD_SIZE", "4"}}), Error);
  EXPECT_THROW(detectFrom({{"RANK", "x"}, {"WORLD_SIZE", "4"}}), Error);
  EXPECT_THROW(detectFrom({{"RANK", "-1"}, {"WORLD_SIZE", "4"}}), Error);
  EXPECT_THROW(detectFrom({{"RANK", "0"}, {"WORLD_SIZE", "0"}}), Error);
  EXPECT_THROW(detectFrom({{"MASTER_PORT", "70000"}}), Error);
  EXPECT_THROW(detectFrom({{"RANK", "0"},
                           {"WORLD_SIZE", "2"},
                           {"LOCAL_RANK", "2"},
                           {"LOCAL_WORLD_SIZE", "2"}}),
               Error);
}

using test::freePort;

LaunchInfo rankInfo(int rank, int world, int port) {
  return test::loopbackRank(rank, world, port);
}

TEST(Rendezvous, ThreeThreadsOnLoopback) {
  const int world = 3, port = freePort();
  std::vector<std::vector<uint8_t>> got(world);
  std::vector<std::vector<std::vector<uint8_t>>> gathered(world);
  std::vector<std::string> errors(world);
  auto body = [&](int r) {
    try {
      TcpRendezvous rv(rankInfo(r, world, port), 30);
      // 128 bytes like an NCCL unique id; only rank 0's content counts.
      std::vector<uint8_t> id(128, uint8_t(r == 0 ? 0xab : r));
      id[5] = uint8_t(r);
      got[r] = rv.broadcast(id);
      gathered[r] =
          rv.allGather(std::vector<uint8_t>(size_t(r + 1), uint8_t(r)));
      rv.barrier();
    } catch (const std::exception &e) {
      errors[r] = e.what();
    }
  };
  // Start the clients before rank 0 listens: they must retry.
  std::thread t2(body, 2), t1(body, 1);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  std::thread t0(body, 0);
  t0.join();
  t1.join();
  t2.join();
  for (int r = 0; r < world; ++r) {
    ASSERT_EQ(errors[r], "") << "rank " << r;
    ASSERT_EQ(got[r].size(), 128u);
    EXPECT_EQ(got[r][0], 0xab);
    EXPECT_EQ(got[r][5], 0);
    ASSERT_EQ(gathered[r].size(), size_t(world));
    for (int s = 0; s < world; ++s)
      EXPECT_EQ(gathered[r][s],
                std::vector<uint8_t>(size_t(s + 1), uint8_t(s)));
  }
}

TEST(Rendezvous, TwoProcessesOnLoopback) {
  const int port = freePort();
  pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // Rank 1 in the child; exit code reports success to the parent.
    int rc = 1;
    try {
      TcpRendezvous rv(rankInfo(1, 2, port), 30);
      std::vector<uint8_t> id = rv.broadcast({});
      rc = (id == std::vector<uint8_t>{1, 2, 3, 4}) ? 0 : 2;
      rv.barrier();
    } catch (...) {
      rc = 3;
    }
    ::_exit(rc);
  }
  TcpRendezvous rv(rankInfo(0, 2, port), 30);
  EXPECT_EQ(rv.broadcast({1, 2, 3, 4}), (std::vector<uint8_t>{1, 2, 3, 4}));
  rv.barrier();
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

TEST(Rendezvous, TimeoutsAndMisconfiguration) {
  // Rank 1 with nobody listening gives up with a clear message.
  const int port = freePort();
  try {
    TcpRendezvous rv(rankInfo(1, 2, port), 0.3);
    FAIL() << "expected a timeout";
  } catch (const Error &e) {
    EXPECT_NE(std::string(e.what()).find("could not connect"),
              std::string::npos)
        << e.what();
  }
  // Rank 0 waiting for a rank that never comes.
  try {
    TcpRendezvous rv(rankInfo(0, 2, freePort()), 0.3);
    FAIL() << "expected a timeout";
  } catch (const Error &e) {
    EXPECT_NE(std::string(e.what()).find("timed out"), std::string::npos)
        << e.what();
  }
  LaunchInfo noAddr = rankInfo(1, 2, port);
  noAddr.masterAddr.clear();
  EXPECT_THROW(TcpRendezvous rv(noAddr, 0.3), Error);
  // A world of one needs no network at all.
  TcpRendezvous solo(LaunchInfo{}, 0.1);
  EXPECT_EQ(solo.broadcast({9}), std::vector<uint8_t>{9});
  solo.barrier();
}

} // namespace

// The host pools size by the cores this process may use: its affinity.
TEST(UsableCores, FollowTheAffinity) {
  cpu_set_t saved;
  ASSERT_EQ(sched_getaffinity(0, sizeof(saved), &saved), 0);
  EXPECT_EQ(ap::rt::usableCores(), unsigned(CPU_COUNT(&saved)));
  cpu_set_t one;
  CPU_ZERO(&one);
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &saved)) {
      CPU_SET(c, &one);
      break;
    }
  ASSERT_EQ(sched_setaffinity(0, sizeof(one), &one), 0);
  EXPECT_EQ(ap::rt::usableCores(), 1u);
  ASSERT_EQ(sched_setaffinity(0, sizeof(saved), &saved), 0);
  EXPECT_EQ(ap::rt::usableCores(), unsigned(CPU_COUNT(&saved)));
}
