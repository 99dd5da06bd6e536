#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "core/cpu/packet_math.h"
#include "core/cpu/packets.h"
#include "core/cpu/parallel.h"
#include "core/ops/cross_entropy.h"

namespace ham::cpu {

namespace {

// sum_j e^(z_j - shift) over j < n, in double: e^ by packets (exp_packet), summed per lane
// (one double chain per lane, so the adds overlap), then the lanes in order. Every row
// takes the same path, so the sum depends only on the row's values.
template <class T>
double sum_of_exp_shifted(const T* z, int64_t n, T shift) {
  const Packet<T> shift_packet = pk::pset1<Packet<T>>(shift);
  double lane_sums[kPacketSize<T>] = {};
  for_each_packet_serial<T>(n, [&](int64_t j, int64_t count) {
    T lanes[kPacketSize<T>];
    pk::pstoreu(lanes, exp_packet(pk::psub(load_padded(z + j, count), shift_packet)));
    for (int64_t l = 0; l < count; ++l) lane_sums[l] += double(lanes[l]);
  });
  double sum = 0;
  for (double lane_sum : lane_sums) sum += lane_sum;
  return sum;
}

}  // namespace

int64_t cross_entropy(const Tensor& logits, const Tensor& targets, int64_t ignore_index,
                      Tensor& lse, Tensor& loss_sum) {
  const int64_t rows = targets.numel(), vocab = logits.size(-1);
  int64_t count = 0;
  dispatch_index("cross_entropy", targets.dtype(), [&]<class I>() {
    const I* pt = targets.data<I>();
    // Validated serially before the parallel loop: an exception must not leave an
    // OpenMP region.
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t t = int64_t(pt[r]);
      if (t == ignore_index) continue;
      HAM_CHECK(t >= 0 && t < vocab, "cross_entropy: target ", t, " at row ", r,
                " is out of range for V = ", vocab, " (ignore_index ", ignore_index, ")");
      ++count;
    }
    dispatch_floating("cross_entropy", logits.dtype(), [&]<class T>() {
      const T* px = logits.data<T>();
      T* plse = lse.data<T>();
      std::vector<double> row_loss(size_t(rows), 0.0);
      parallel_for(rows, vocab, [&](int64_t r) {
        const int64_t t = int64_t(pt[r]);
        if (t == ignore_index) {
          plse[r] = T(0);
          return;
        }
        const T* z = px + r * vocab;
        const T m = Eigen::Map<const Eigen::Array<T, Eigen::Dynamic, 1>>(z, vocab).maxCoeff();
        const double row_lse = double(m) + std::log(sum_of_exp_shifted(z, vocab, m));
        plse[r] = T(row_lse);
        row_loss[size_t(r)] = row_lse - double(z[t]);
      });
      double total = 0;  // in row order: independent of the thread count
      for (double v : row_loss) total += v;
      loss_sum.data<T>()[0] = T(total);
    });
  });
  return count;
}

void cross_entropy_backward(const Tensor& logits, const Tensor& targets, const Tensor& lse,
                            int64_t ignore_index, const Tensor& dloss, double scale,
                            Tensor& dlogits) {
  const int64_t rows = targets.numel(), vocab = logits.size(-1);
  dispatch_index("cross_entropy backward", targets.dtype(), [&]<class I>() {
    const I* pt = targets.data<I>();
    dispatch_floating("cross_entropy backward", logits.dtype(), [&]<class T>() {
      const T* px = logits.data<T>();
      const T* plse = lse.data<T>();
      T* pd = dlogits.data<T>();
      const T g = T(double(dloss.data<T>()[0]) * scale);
      parallel_for(rows, vocab, [&](int64_t r) {
        const int64_t t = int64_t(pt[r]);
        T* d = pd + r * vocab;
        if (t == ignore_index) {
          std::fill(d, d + vocab, T(0));
          return;
        }
        const T* z = px + r * vocab;
        const Packet<T> row_lse = pk::pset1<Packet<T>>(plse[r]), g_packet = pk::pset1<Packet<T>>(g);
        for_each_packet_serial<T>(vocab, [&](int64_t j, int64_t count) {
          const Packet<T> e = exp_packet(pk::psub(load_padded(z + j, count), row_lse));
          store_partial(d + j, pk::pmul(e, g_packet), count);
        });
        d[t] -= g;
      });
    });
  });
}

// The two kernels above in turn; a bad target goes into the tally, not an exception.
void cross_entropy_with_grad(Tensor& logits, const Tensor& targets, int64_t ignore_index,
                             double scale, int64_t row_offset, Tensor& loss_sum, Tensor& tally) {
  const int64_t rows = targets.numel(), vocab = logits.size(-1);
  int64_t* counts = tally.data<int64_t>();
  int64_t first_bad = -1;
  dispatch_index("cross_entropy_with_grad", targets.dtype(), [&]<class I>() {
    const I* pt = targets.data<I>();
    for (int64_t r = 0; r < rows && first_bad < 0; ++r) {
      const int64_t t = int64_t(pt[r]);
      if (t != ignore_index && (t < 0 || t >= vocab)) first_bad = r;
    }
  });
  if (first_bad >= 0) {
    counts[1] = std::min(counts[1], row_offset + first_bad);
    dispatch_floating("cross_entropy_with_grad", logits.dtype(), [&]<class T>() {
      std::fill(logits.data<T>(), logits.data<T>() + logits.numel(), T(0));
      loss_sum.data<T>()[0] = T(0);
    });
    return;
  }
  Tensor lse = Tensor::empty({rows}, loss_sum.dtype(), logits.device());
  counts[0] += cross_entropy(logits, targets, ignore_index, lse, loss_sum);
  const Tensor one = Tensor::scalar(1.0, loss_sum.dtype(), logits.device());
  cross_entropy_backward(logits, targets, lse, ignore_index, one, scale, logits);
}

}  // namespace ham::cpu
