//===- launch.h - Process launch conventions and TCP rendezvous ---*- C++
//-*-===//
//
// How a training binary learns its place in a distributed run, using the
// conventions users already know (docs/architecture.md section 5):
//   - torchrun-style env: RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
//     MASTER_ADDR, MASTER_PORT;
//   - mpirun (Open MPI): OMPI_COMM_WORLD_RANK / _SIZE / _LOCAL_RANK /
//     _LOCAL_SIZE (MPICH/Hydra: PMI_RANK, PMI_SIZE);
//   - Slurm srun: SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID,
//     SLURM_NTASKS_PER_NODE, master = first host of SLURM_JOB_NODELIST;
//   - nothing: a world of one, no launcher needed.
// Explicit RANK/WORLD_SIZE win over the others, so torchrun inside a Slurm
// allocation behaves as torchrun.
//
// TcpRendezvous is the small bootstrap used to share the NCCL unique id when
// there is no MPI: rank 0 listens on MASTER_PORT, the others connect to
// MASTER_ADDR:MASTER_PORT; small byte blobs are then broadcast / gathered
// through rank 0. It is a bootstrap, not a data path.
//
//===----------------------------------------------------------------------===//
#ifndef ACTPLACE_RUNTIME_LAUNCH_H
#define ACTPLACE_RUNTIME_LAUNCH_H

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace ap::rt {

enum class Launcher { None, Torchrun, Mpirun, Slurm };
const char *launcherName(Launcher l);

struct LaunchInfo {
  Launcher launcher = Launcher::None;
  int rank = 0;
  int worldSize = 1;
  int localRank = 0;
  int localWorldSize = 1;
  /// Rendezvous address of rank 0 (empty when not needed or unknown).
  std::string masterAddr;
  int masterPort = 29500;
};

/// The cores this process may run on: its CPU affinity, which launchers
/// set (mpirun binds each of 2 ranks to one core by default), else the
/// machine's hardware threads; at least 1. Host thread pools (parameter
/// initialisation, fingerprint hashing) size by it, so a bound rank does
/// not run a thread per machine core on its one core.
unsigned usableCores();

/// Reads the launch environment of this process. Throws ap::rt::Error on
/// inconsistent values (rank outside the world, non-numeric fields).
LaunchInfo detectLaunch();
/// Same, reading variables through `getenv` (null = unset), for tests.
LaunchInfo
detectLaunch(const std::function<const char *(const char *)> &getenv);

/// First host name of a Slurm node list, e.g. "gpu[003-010,12],cpu1" ->
/// "gpu003". Returns "" for an empty list.
std::string firstSlurmHost(const std::string &nodelist);

/// Star-shaped bootstrap over TCP. Construction blocks until all
/// `worldSize` ranks are connected (or `timeoutSeconds` pass: ap::rt::Error).
/// Every method is collective: all ranks call it in the same order.
class TcpRendezvous {
public:
  TcpRendezvous(const LaunchInfo &info, double timeoutSeconds = 300.0);
  ~TcpRendezvous();
  TcpRendezvous(const TcpRendezvous &) = delete;
  TcpRendezvous &operator=(const TcpRendezvous &) = delete;

  int rank() const { return rank_; }
  int worldSize() const { return world_; }

  /// Rank 0's `bytes` are returned on every rank (others' input is ignored).
  std::vector<uint8_t> broadcast(const std::vector<uint8_t> &bytes);
  /// Every rank's blob, indexed by rank.
  std::vector<std::vector<uint8_t>> allGather(const std::vector<uint8_t> &mine);
  void barrier();

private:
  int rank_, world_;
  double timeout_;
  /// Rank 0: one socket per peer rank (index = rank, [0] unused). Others:
  /// [0] = the connection to rank 0.
  std::vector<int> sockets_;
  int listenFd_ = -1;
};

} // namespace ap::rt

#endif // ACTPLACE_RUNTIME_LAUNCH_H
