//===- collectives_world.cpp - The world communicator factory -------------===//
//
// createWorldCommunicator: self, MPI or NCCL from the launch environment. In
// its own translation unit because it is the only part of the collectives
// that references MPI and NCCL (see collectives.cpp).
//
//===----------------------------------------------------------------------===//
#include "runtime/collectives.h"

#include "runtime/error.h"

#include <cstring>
#include <memory>
#include <vector>

namespace ap::rt {

using ap::kernels::Backend;

std::unique_ptr<Communicator>
createWorldCommunicator(Backend backend, const LaunchInfo &launch,
                        const CommOptions &options) {
  if (backend == Backend::Host) {
    if (launch.worldSize == 1)
      return createSelfCommunicator();
    // Without mpirun (torchrun-style env or srun) the ranks meet over TCP
    // at MASTER_ADDR:MASTER_PORT and reduce through rank 0.
    if (launch.launcher != Launcher::Mpirun)
      return createTcpCommunicator(launch, options.rendezvousTimeoutSeconds);
#if defined(ACTPLACE_HAVE_MPI)
    std::unique_ptr<Communicator> c =
        createMpiWorldCommunicator(options.mpiSegmentBytes);
    if (c->size() != launch.worldSize || c->rank() != launch.rank)
      fail("collectives: MPI reports rank ", c->rank(), " of ", c->size(),
           " but the launch environment says ", launch.rank, " of ",
           launch.worldSize);
    return c;
#else
    fail("collectives: this build has no MPI, so the host backend cannot run ",
         launch.worldSize,
         " ranks under mpirun (rebuild with Open MPI "
         "installed, or launch torchrun-style: RANK, WORLD_SIZE, "
         "MASTER_ADDR, MASTER_PORT)");
#endif
  }
#if defined(ACTPLACE_HAVE_CUDA)
  if (options.stagedMpi) {
#if defined(ACTPLACE_HAVE_MPI)
    if (launch.launcher != Launcher::Mpirun && launch.worldSize > 1)
      fail("collectives: mpi-staged runs over MPI; launch the ",
           launch.worldSize, " ranks with mpirun (found launcher '",
           launcherName(launch.launcher), "')");
    return createStagedMpiCommunicator(
        launch.worldSize == 1
            ? createSelfCommunicator()
            : createMpiWorldCommunicator(options.mpiSegmentBytes));
#else
    fail("collectives: mpi-staged needs MPI, and this build has none "
         "(rebuild with Open MPI installed)");
#endif
  }
  std::function<void(void *, size_t)> share;
  std::shared_ptr<TcpRendezvous> tcp;
  if (launch.worldSize > 1) {
#if defined(ACTPLACE_HAVE_MPI)
    if (launch.launcher == Launcher::Mpirun)
      share = [](void *id, size_t n) { mpiBroadcastBytes(id, n); };
#endif
    if (!share) {
      tcp = std::make_shared<TcpRendezvous>(launch,
                                            options.rendezvousTimeoutSeconds);
      share = [tcp](void *id, size_t n) {
        std::vector<uint8_t> mine(static_cast<uint8_t *>(id),
                                  static_cast<uint8_t *>(id) + n);
        std::vector<uint8_t> got = tcp->broadcast(mine);
        if (got.size() != n)
          fail("collectives: rendezvous delivered ", got.size(),
               " bytes of NCCL id, expected ", n);
        std::memcpy(id, got.data(), n);
      };
    }
  }
  return createNcclWorldCommunicator(launch, share);
#else
  (void)options;
  fail("collectives: this build has no CUDA backend");
#endif
}

} // namespace ap::rt
