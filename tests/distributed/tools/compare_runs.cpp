// compare_runs: the checks of the `mpirun -np 2 ham train` vs `ham train` tests.
//   compare_runs losses A.jsonl B.jsonl REL_TOL [FROM_STEP]
//     every train/loss, train/grad_norm (before clipping: it sees a wrong gradient scale,
//     which AdamW's update would hide) and val/loss that B's metrics.jsonl logs at a step
//     >= FROM_STEP
//     (default 0) must be in A's too, within REL_TOL relative; at least one must be.
//   compare_runs weights A.safetensors B.safetensors ABS_TOL
//     the same tensor names and shapes, every element within ABS_TOL.
// Prints the largest difference and "compare_runs: passed", or what differs (exit 1).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <string>
#include <utility>

#include <nlohmann/json.hpp>

#include "core/safetensors.h"

namespace {

using Losses = std::map<std::pair<int64_t, std::string>, double>;

Losses read_losses(const std::string& path) {
  std::ifstream in(path);
  HAM_CHECK(in, path, ": cannot open");
  Losses out;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    nlohmann::json j = nlohmann::json::parse(line);
    for (const char* key : {"train/loss", "train/grad_norm", "val/loss"}) {
      if (j.contains(key)) out[{j.at("step").get<int64_t>(), key}] = j.at(key).get<double>();
    }
  }
  return out;
}

int compare_losses(const std::string& a_path, const std::string& b_path, double rel_tol,
                   int64_t from_step) {
  Losses a = read_losses(a_path), b = read_losses(b_path);
  double worst = 0;
  int compared = 0;
  for (const auto& [key, b_value] : b) {
    if (key.first < from_step) continue;
    auto it = a.find(key);
    HAM_CHECK(it != a.end(), a_path, " has no ", key.second, " at step ", key.first);
    double rel = std::abs(it->second - b_value) / std::max(std::abs(it->second), 1e-12);
    std::printf("step %3lld %-15s %.9f %.9f  rel diff %.3g\n", (long long)key.first,
                key.second.c_str(), it->second, b_value, rel);
    HAM_CHECK(rel <= rel_tol, key.second, " at step ", key.first, ": ", it->second, " vs ",
              b_value, " differ by ", rel, " relative (tolerance ", rel_tol, ")");
    worst = std::max(worst, rel);
    ++compared;
  }
  HAM_CHECK(compared > 0, b_path, ": no losses at steps >= ", from_step);
  std::printf("losses: %d compared, max relative difference %.3g (tolerance %.3g)\n", compared,
              worst, rel_tol);
  return 0;
}

int compare_weights(const std::string& a_path, const std::string& b_path, double abs_tol) {
  ham::SafetensorsFile a = ham::load_safetensors(a_path), b = ham::load_safetensors(b_path);
  HAM_CHECK(a.tensors.size() == b.tensors.size(), a_path, " has ", a.tensors.size(),
            " tensors, ", b_path, " ", b.tensors.size());
  double worst = 0;
  std::string worst_name;
  for (const auto& [name, ta] : a.tensors) {
    const ham::Tensor& tb = b.at(name);
    HAM_CHECK(ta.shape() == tb.shape(), name, ": shape ", ham::shape_str(ta.shape()), " vs ",
              ham::shape_str(tb.shape()));
    std::vector<double> va = ta.to(ham::DType::F64).to_vector<double>();
    std::vector<double> vb = tb.to(ham::DType::F64).to_vector<double>();
    for (size_t i = 0; i < va.size(); ++i) {
      double diff = std::abs(va[i] - vb[i]);
      if (!(diff <= worst)) {  // NaN counts as the worst
        worst = std::isnan(diff) ? INFINITY : diff;
        worst_name = name;
      }
    }
  }
  std::printf("weights: %zu tensors, max |difference| %.3g in %s (tolerance %.3g)\n",
              a.tensors.size(), worst, worst_name.c_str(), abs_tol);
  HAM_CHECK(worst <= abs_tol, "weights differ by ", worst, " in ", worst_name, " (tolerance ",
            abs_tol, ")");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    std::string mode = argc > 1 ? argv[1] : "";
    if (mode == "losses" && (argc == 5 || argc == 6)) {
      compare_losses(argv[2], argv[3], std::stod(argv[4]), argc == 6 ? std::stoll(argv[5]) : 0);
    } else if (mode == "weights" && argc == 5) {
      compare_weights(argv[2], argv[3], std::stod(argv[4]));
    } else {
      std::fprintf(stderr, "usage: compare_runs losses A.jsonl B.jsonl REL_TOL [FROM_STEP]\n"
                           "       compare_runs weights A.safetensors B.safetensors ABS_TOL\n");
      return 2;
    }
  } catch (const std::exception& e) {
    std::printf("compare_runs: FAILED: %s\n", e.what());
    return 1;
  }
  std::printf("compare_runs: passed\n");
  return 0;
}
