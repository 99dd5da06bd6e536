// Every MPI collective against the answer computed by hand: each rank regenerates every
// other rank's (fresh, never zero) input, so expected values never come from MPI.
// Integers and min/max are exact; f32/f64 sums may be added in any order by MPI, so they
// are compared within a few units of rounding (|error| <= 1e-6 |sum| for f32, 1e-14 f64).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "tests/distributed/distributed_testing.h"
#include "tests/distributed/mpi/mpi_world.h"
#include "tests/error_testing.h"

namespace ham::dist {
namespace {

using ham::testing::expect_error;
using testing::rank_tensor;
using testing::world;

double tolerance_for(DType dtype, double magnitude) {
  if (dtype == DType::F32) return 1e-6 * std::max(1.0, magnitude);
  if (dtype == DType::F64) return 1e-14 * std::max(1.0, magnitude);
  return 0;
}

// op over ranks of element i of every rank's input, in double.
std::vector<double> expected_reduction(uint64_t seed, const Shape& shape, DType dtype,
                                       ReduceOp op) {
  const int n = world().size();
  std::vector<double> out;
  for (int r = 0; r < n; ++r) {
    auto v = rank_tensor(seed, r, shape, dtype).to_vector<double>();
    if (out.empty()) {
      out = v;
      continue;
    }
    for (size_t i = 0; i < v.size(); ++i) {
      switch (op) {
        case ReduceOp::Sum:
        case ReduceOp::Avg: out[i] += v[i]; break;
        case ReduceOp::Min: out[i] = std::min(out[i], v[i]); break;
        case ReduceOp::Max: out[i] = std::max(out[i], v[i]); break;
      }
    }
  }
  if (op == ReduceOp::Avg) {
    for (double& x : out) x /= n;
  }
  return out;
}

void expect_values(const Tensor& got, const std::vector<double>& want, DType dtype,
                   const std::string& what) {
  auto values = got.to_vector<double>();
  ASSERT_EQ(values.size(), want.size()) << what;
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_NEAR(values[i], want[i], tolerance_for(dtype, std::abs(want[i])))
        << what << " element " << i << " on rank " << world().rank();
  }
}

const DType kReducibleDtypes[] = {DType::F32, DType::F64, DType::I32, DType::I64};
const ReduceOp kOps[] = {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Min, ReduceOp::Max};

TEST(MpiWorld, KnowsItsRanksAndNode) {
  EXPECT_GE(world().size(), 2);
  EXPECT_EQ(world().name(), "world");
  // mpirun here starts every rank on this one machine.
  EXPECT_EQ(world().local_size(), world().size());
  EXPECT_EQ(world().local_rank(), world().rank());
}

TEST(MpiCollectives, AllReduceEveryDtypeAndOp) {
  uint64_t seed = 1;
  for (DType dtype : kReducibleDtypes) {
    for (ReduceOp op : kOps) {
      if (op == ReduceOp::Avg && !is_floating(dtype)) continue;
      ++seed;
      Tensor x = rank_tensor(seed, world().rank(), {5, 7}, dtype);
      world().all_reduce(x, op);
      expect_values(x, expected_reduction(seed, {5, 7}, dtype, op), dtype,
                    std::string("all_reduce ") + reduce_op_name(op) + " " + dtype_name(dtype));
    }
  }
  EXPECT_DOUBLE_EQ(world().all_reduce_scalar(world().rank() + 1.0, ReduceOp::Sum),
                   world().size() * (world().size() + 1) / 2.0);
  EXPECT_DOUBLE_EQ(mean_over_ranks(testing::world_slot())(world().rank() * 2.0),
                   world().size() - 1.0);
}

TEST(MpiCollectives, ReduceScatterEveryDtypeAndOp) {
  const int n = world().size(), rank = world().rank();
  const int64_t chunk = 6;
  uint64_t seed = 100;
  for (DType dtype : kReducibleDtypes) {
    for (ReduceOp op : kOps) {
      if (op == ReduceOp::Avg && !is_floating(dtype)) continue;
      ++seed;
      Shape shape{int64_t(n), chunk};
      Tensor input = rank_tensor(seed, rank, shape, dtype);
      Tensor output = rank_tensor(seed + 5000, rank, {chunk}, dtype);  // overwritten
      world().reduce_scatter(input, output, op);
      auto all = expected_reduction(seed, shape, dtype, op);
      std::vector<double> mine(all.begin() + rank * chunk, all.begin() + (rank + 1) * chunk);
      expect_values(output, mine, dtype,
                    std::string("reduce_scatter ") + reduce_op_name(op) + " " + dtype_name(dtype));
    }
  }
}

TEST(MpiCollectives, AllGatherEveryDtypeAndInPlace) {
  const int n = world().size(), rank = world().rank();
  uint64_t seed = 200;
  for (DType dtype : {DType::F32, DType::F64, DType::BF16, DType::I32, DType::I64, DType::U8}) {
    ++seed;
    Shape shape{3, 2};
    Tensor input = dtype == DType::U8 ? Tensor::full(shape, 10 + rank, DType::U8)
                                      : rank_tensor(seed, rank, shape, dtype);
    Tensor output = Tensor::full({int64_t(n) * 6}, 1.0, dtype);
    world().all_gather(input, output);
    std::vector<double> want;
    for (int r = 0; r < n; ++r) {
      auto v = dtype == DType::U8 ? Tensor::full(shape, 10 + r, DType::U8).to_vector<double>()
                                  : rank_tensor(seed, r, shape, dtype).to_vector<double>();
      want.insert(want.end(), v.begin(), v.end());
    }
    EXPECT_EQ(output.to_vector<double>(), want) << "all_gather " << dtype_name(dtype);
  }
  // In place: the input is this rank's chunk of the output.
  Tensor output = Tensor::zeros({int64_t(n) * 4});
  Tensor own = output.slice(rank * 4, (rank + 1) * 4);
  own.copy_(rank_tensor(300, rank, {4}, DType::F32));
  world().all_gather(own, output);
  std::vector<double> want;
  for (int r = 0; r < n; ++r) {
    auto v = rank_tensor(300, r, {4}, DType::F32).to_vector<double>();
    want.insert(want.end(), v.begin(), v.end());
  }
  EXPECT_EQ(output.to_vector<double>(), want);
}

TEST(MpiCollectives, BroadcastFromEveryRoot) {
  for (int root = 0; root < world().size(); ++root) {
    for (DType dtype : {DType::F32, DType::BF16, DType::I64}) {
      Tensor x = rank_tensor(400 + root, world().rank(), {9}, dtype);
      world().broadcast(x, root);
      EXPECT_EQ(x.to_vector<double>(), rank_tensor(400 + root, root, {9}, dtype).to_vector<double>())
          << "root " << root << " " << dtype_name(dtype);
    }
  }
  world().barrier();
}

TEST(MpiCollectives, AsyncCollectivesMayBeWaitedInAnyOrder) {
  const int n = world().size(), rank = world().rank();
  Tensor a = rank_tensor(500, rank, {8}, DType::F64);
  Tensor input = rank_tensor(501, rank, {int64_t(n) * 3}, DType::F64);
  Tensor output = Tensor::zeros({3}, DType::F64);
  auto first = world().all_reduce_async(a, ReduceOp::Max);
  auto second = world().reduce_scatter_async(input, output, ReduceOp::Sum);
  second->wait();
  first->wait();
  first->wait();  // waiting twice is harmless
  expect_values(a, expected_reduction(500, {8}, DType::F64, ReduceOp::Max), DType::F64, "max");
  auto sums = expected_reduction(501, {int64_t(n) * 3}, DType::F64, ReduceOp::Sum);
  expect_values(output, std::vector<double>(sums.begin() + rank * 3, sums.begin() + rank * 3 + 3),
                DType::F64, "sum");
}

TEST(MpiCollectives, SplitGroupsRanksByColorOrderedByKey) {
  const int n = world().size(), rank = world().rank();
  // Two colors; keys reverse the order, so the highest world rank of a color is rank 0.
  auto sub = world().split(rank % 2, -rank);
  std::vector<int> members;
  for (int r = 0; r < n; ++r) {
    if (r % 2 == rank % 2) members.push_back(r);
  }
  std::reverse(members.begin(), members.end());
  EXPECT_EQ(sub->size(), int(members.size()));
  EXPECT_EQ(sub->rank(), int(std::find(members.begin(), members.end(), rank) - members.begin()));
  EXPECT_EQ(sub->name(), "world/split(" + std::to_string(rank % 2) + ")");
  double sum_of_members = 0;
  for (int r : members) sum_of_members += r;
  EXPECT_DOUBLE_EQ(sub->all_reduce_scalar(rank, ReduceOp::Sum), sum_of_members);
}

TEST(MpiCollectives, WhatMpiCannotDoIsRefusedOnEveryRank) {
  const int n = world().size();
  expect_error([] { world().all_reduce(Tensor::zeros({3}, DType::BF16), ReduceOp::Sum); },
               {"all_reduce", "world", "bf16", "reduce in f32"});
  Tensor buffer = Tensor::zeros({int64_t(n) * 4});
  expect_error([&] { world().reduce_scatter(buffer, buffer.slice(0, 4), ReduceOp::Sum); },
               {"reduce_scatter", "share memory"});
  expect_error([&] { world().all_gather(buffer.slice(1, 5), buffer); },
               {"all_gather", "overlaps"});
  expect_error([&] { world().reduce_scatter(buffer, Tensor::zeros({5}), ReduceOp::Sum); },
               {"reduce_scatter", "world", "f32[5]"});
  world().barrier();  // every rank is still in step
}

}  // namespace
}  // namespace ham::dist
