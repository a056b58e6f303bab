// A consumer of dissect::parallel: one rank (MPI singleton), a column-parallel Linear, exit 0 if
// it gives the full layer's output.
#include <mpi.h>

#include <cstdio>
#include <dissect/parallel/parallel_linear.hpp>

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int status = 1;
  {
    dissect::parallel::Communicator comm(MPI_COMM_WORLD);
    dissect::Linear<float> full(3, 4, {.seed = 1});
    dissect::parallel::ColumnParallelLinear<float> column(full, comm);
    const dissect::Tensor<float, 2> x({2, 3}, {1, 2, 3, 4, 5, 6});
    const auto expected = full.forward(x), actual = column.forward(x);
    status = actual.shape()[1] * comm.size() == 4 &&
                     (comm.size() > 1 || actual.vector() == expected.vector())
                 ? 0
                 : 1;
    std::printf("dissect::parallel on %d rank(s): %s\n", comm.size(), status == 0 ? "ok" : "wrong");
  }
  MPI_Finalize();
  return status;
}
