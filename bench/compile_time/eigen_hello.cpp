// bench/compile_time/eigen_hello.cpp — README's "Use it" example written with Eigen alone, the
// baseline of bench/compile_time.sh: a row-major float Linear 768 -> 3072 with bias, its forward
// on 32 rows, its backward (dx, dW, db) and a shape check that throws. What a translation unit
// costs with Eigen and nothing else; dissect's hello world is measured against it.
#include <Eigen/Dense>
#include <cmath>
#include <iostream>
#include <random>
#include <stdexcept>

int main() {
  using Mat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  std::mt19937 g(1);
  std::uniform_real_distribution<float> u(-1.f / std::sqrt(768.f), 1.f / std::sqrt(768.f));
  Mat W(3072, 768);
  for (Eigen::Index i = 0; i < W.size(); ++i) W.data()[i] = u(g);
  Eigen::VectorXf b(3072);
  for (auto& v : b) v = u(g);
  Mat x = Mat::Zero(32, 768);
  x(0, 0) = 1.0f;
  Mat y = (x * W.transpose()).rowwise() + b.transpose();
  Mat dy = Mat::Ones(y.rows(), y.cols());
  Mat dx = dy * W;
  Mat dW = dy.transpose() * x;
  Eigen::VectorXf db = dy.colwise().sum().transpose();
  std::cout << y.rows() << "x" << y.cols() << " " << dx.sum() + dW.sum() + db.sum() << "\n";
  try {
    Mat x2(4, 512);
    if (x2.cols() != W.cols()) throw std::invalid_argument("shape");
    Mat y2 = x2 * W.transpose();
  } catch (const std::exception& e) {
    std::cout << e.what() << "\n";
  }
}
