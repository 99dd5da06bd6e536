#pragma once
// Helpers shared by the single-process and the mpirun tests of distributed/: fresh random
// data that every rank can regenerate for any other rank (so expected results are computed
// by hand, never read back from the collective under test), and small named parameter sets.
#include <cmath>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "autograd/node.h"
#include "core/tensor.h"
#include "distributed/communicator.h"
#include "distributed/flat_shard.h"

namespace ham::dist::testing {

// Values with magnitude in [0.5, 2) and a random sign: never zero, so a collective that
// leaves its output untouched or zero-fills it cannot pass.
inline std::vector<double> rank_values(uint64_t seed, int rank, int64_t n) {
  std::mt19937_64 rng(seed * 1000003u + uint64_t(rank) * 7919u + 17u);
  std::uniform_real_distribution<double> magnitude(0.5, 2.0);
  std::bernoulli_distribution negative(0.5);
  std::vector<double> values(static_cast<size_t>(n));
  for (double& v : values) v = negative(rng) ? -magnitude(rng) : magnitude(rng);
  return values;
}

// The same values as a tensor of `dtype` (integers: rounded times 100, still never zero).
inline Tensor rank_tensor(uint64_t seed, int rank, const Shape& shape, DType dtype) {
  std::vector<double> v = rank_values(seed, rank, shape_numel(shape));
  if (dtype == DType::I32 || dtype == DType::I64) {
    for (double& x : v) x = std::round(x * 100);
  }
  return Tensor::from_vector(v, shape).to(dtype);
}

// A small model's worth of named parameters with awkward sizes (numels 3*5, 7, 2*2*3, 1,
// 11) so shard boundaries fall inside parameters and padding is needed for most N.
inline std::vector<std::pair<std::string, Shape>> awkward_shapes() {
  return {{"rest.embed", {3, 5}}, {"layers.0.w", {7}}, {"layers.0.u", {2, 2, 3}},
          {"layers.1.b", {1}}, {"layers.1.v", {11}}};
}

inline std::vector<std::pair<std::string, Tensor>> make_parameters(
    const std::vector<std::pair<std::string, Shape>>& shapes, uint64_t seed,
    DType dtype = DType::F32) {
  std::vector<std::pair<std::string, Tensor>> out;
  for (size_t i = 0; i < shapes.size(); ++i) {
    Tensor p = rank_tensor(seed + i, 0, shapes[i].second, dtype);
    set_requires_grad(p);
    out.emplace_back(shapes[i].first, p);
  }
  return out;
}

inline std::vector<std::pair<std::string, Tensor>> clone_parameters(
    const std::vector<std::pair<std::string, Tensor>>& params) {
  std::vector<std::pair<std::string, Tensor>> out;
  for (const auto& [name, p] : params) {
    Tensor copy = p.clone();
    set_requires_grad(copy);
    out.emplace_back(name, copy);
  }
  return out;
}

inline double max_abs_difference(const Tensor& a, const Tensor& b) {
  auto va = a.to_vector<double>(), vb = b.to_vector<double>();
  if (va.size() != vb.size()) return INFINITY;
  double worst = 0;
  for (size_t i = 0; i < va.size(); ++i) worst = std::max(worst, std::abs(va[i] - vb[i]));
  return worst;
}

// ||a - b||_2 over all elements (read as f64); infinite when the sizes differ.
inline double l2_difference(const Tensor& a, const Tensor& b) {
  auto va = a.to_vector<double>(), vb = b.to_vector<double>();
  if (va.size() != vb.size()) return INFINITY;
  double sum = 0;
  for (size_t i = 0; i < va.size(); ++i) sum += (va[i] - vb[i]) * (va[i] - vb[i]);
  return std::sqrt(sum);
}

// Groups made of a world of one: what a single process trains with.
inline ShardingGroups single_process_groups() {
  auto world = std::make_shared<SingleProcessCommunicator>();
  return make_sharding_groups(world, 1);
}

}  // namespace ham::dist::testing
