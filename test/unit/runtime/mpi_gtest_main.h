//===- mpi_gtest_main.h - main() of the gtest binaries run by mpirun ------===//
//
// Each *_mpi_test.cpp ends with `AP_MPI_GTEST_MAIN()`: MPI initialised with
// MPI_THREAD_MULTIPLE (the runtime issues collectives from stream workers),
// only rank 0 prints the gtest report, every rank returns the worst result,
// and an alarm turns a hang (a rank that failed an assertion skips the
// collectives its peer waits in) into a failure instead of a stuck CI job.
//
//===----------------------------------------------------------------------===//
#ifndef ACTPLACE_TEST_UNIT_RUNTIME_MPI_GTEST_MAIN_H
#define ACTPLACE_TEST_UNIT_RUNTIME_MPI_GTEST_MAIN_H

#include <gtest/gtest.h>
#include <mpi.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <string>

namespace ap::rt::test {
inline int runMpiGtests(int argc, char **argv) {
  ::alarm(300);
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  ::testing::InitGoogleTest(&argc, argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank != 0) {
    auto &listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
  }
  int rc = RUN_ALL_TESTS();
  int worst = 0;
  MPI_Allreduce(&rc, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return worst;
}
/// One fresh folder for all ranks: rank 0 makes it under gtest's temp dir
/// (`prefix`-XXXXXX), the others learn its name. Collective.
inline std::string sharedWorkDir(const char *prefix) {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  char dir[256] = {0};
  if (rank == 0) {
    std::string tmpl = ::testing::TempDir() + prefix + "-XXXXXX";
    std::strncpy(dir, tmpl.c_str(), sizeof dir - 1);
    if (!::mkdtemp(dir))
      dir[0] = 0;
  }
  MPI_Bcast(dir, sizeof dir, MPI_CHAR, 0, MPI_COMM_WORLD);
  return dir;
}

/// Removes a sharedWorkDir once every rank is done with it. Collective.
inline void removeSharedWorkDir(const std::string &dir) {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank == 0 && !dir.empty())
    std::filesystem::remove_all(dir);
}

} // namespace ap::rt::test

#define AP_MPI_GTEST_MAIN()                                                    \
  int main(int argc, char **argv) {                                            \
    return ap::rt::test::runMpiGtests(argc, argv);                             \
  }

#endif // ACTPLACE_TEST_UNIT_RUNTIME_MPI_GTEST_MAIN_H
