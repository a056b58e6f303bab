// The gtest main of the MPI tests: MPI_Init and MPI_Finalize around RUN_ALL_TESTS, output from
// rank 0 only (other ranks print their failures, prefixed), and a failure on any rank fails the
// process on every rank.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdio>

namespace {

/// Prints a failed assertion on a rank other than 0, which has no listener of its own.
class RankFailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& result) override {
    if (result.failed()) {
      std::fprintf(stderr, "[rank %d] %s:%d: %s\n", rank_,
                   result.file_name() ? result.file_name() : "?", result.line_number(),
                   result.summary());
    }
  }

 private:
  int rank_;
};

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  ::testing::InitGoogleTest(&argc, argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new RankFailurePrinter(rank));
  }
  const int failed_here = RUN_ALL_TESTS() != 0 ? 1 : 0;
  int failed = failed_here;
  MPI_Allreduce(MPI_IN_PLACE, &failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (rank == 0 && failed && !failed_here) {
    std::fprintf(stderr, "FAILED on another rank (see its [rank N] lines above)\n");
  }
  MPI_Finalize();
  return failed;
}
