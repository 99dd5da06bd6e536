#include "train/gradient_check.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <string>

#include <fmt/format.h>

#include "autograd/engine.h"
#include "autograd/grad_mode.h"
#include "autograd/node.h"
#include "models/ham.h"

namespace ham {

namespace {

using Selection = std::vector<std::vector<uint8_t>>;  // per HAM layer, m_t of every token

// The tokens each HAM layer selected in the last forward (empty for other families).
Selection selection_masks(const LanguageModel& model) {
  Selection masks;
  if (const auto* ham_model = dynamic_cast<const HAMModel*>(&model)) {
    for (const auto& block : ham_model->layers) {
      masks.push_back(block->mixer->last_trace().select.to_vector<uint8_t>());
    }
  }
  return masks;
}

// `limit` entries of a tensor with gradient `analytic` (all when limit is 0 or covers
// the tensor): ceil(limit / 2) where the gradient is non-zero, the rest from anywhere.
std::vector<int64_t> entries_to_check(const std::vector<double>& analytic, int64_t limit,
                                      std::mt19937_64& rng) {
  int64_t n = int64_t(analytic.size());
  std::vector<int64_t> chosen;
  if (limit <= 0 || limit >= n) {
    chosen.resize(size_t(n));
    std::iota(chosen.begin(), chosen.end(), 0);
    return chosen;
  }
  std::vector<int64_t> nonzero, rest;
  for (int64_t j = 0; j < n; ++j) (analytic[size_t(j)] != 0 ? nonzero : rest).push_back(j);
  std::shuffle(nonzero.begin(), nonzero.end(), rng);
  size_t from_nonzero = std::min(nonzero.size(), size_t((limit + 1) / 2));
  chosen.assign(nonzero.begin(), nonzero.begin() + std::ptrdiff_t(from_nonzero));
  // The remainder uniformly from the entries not yet chosen.
  rest.insert(rest.end(), nonzero.begin() + std::ptrdiff_t(from_nonzero), nonzero.end());
  std::shuffle(rest.begin(), rest.end(), rng);
  rest.resize(size_t(limit) - chosen.size());
  chosen.insert(chosen.end(), rest.begin(), rest.end());
  std::sort(chosen.begin(), chosen.end());
  return chosen;
}

std::string format_error(double value) {
  return std::isnan(value) ? std::string("-") : fmt::format("{:.2e}", value);
}

}  // namespace

TokenBatch gradcheck_batch(const ModelConfig& config, int64_t batch_size, int64_t seq_len,
                           uint64_t seed) {
  HAM_CHECK(batch_size > 0 && seq_len > 0, "gradcheck: batch size (", batch_size,
            ") and sequence length (", seq_len, ") must be positive");
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int64_t> token(0, config.vocab_size - 1);
  std::vector<int64_t> inputs, targets, doc_ids, positions;
  int64_t split = seq_len / 2;
  for (int64_t b = 0; b < batch_size; ++b) {
    for (int64_t t = 0; t < seq_len; ++t) {
      inputs.push_back(token(rng));
      targets.push_back(token(rng));
      bool second = split > 0 && t >= split;
      doc_ids.push_back(second ? 1 : 0);
      positions.push_back(second ? t - split : t);
    }
  }
  Shape shape = {batch_size, seq_len};
  return {Tensor::from_vector(inputs, shape), Tensor::from_vector(targets, shape),
          Tensor::from_vector(doc_ids, shape), Tensor::from_vector(positions, shape)};
}

ModelGradcheckReport check_model_gradients(const LanguageModel& model, const TokenBatch& batch,
                                           const ModelGradcheckOptions& opt) {
  HAM_CHECK(opt.eps > 0 && opt.tolerance > 0 && opt.norm_floor > 0, "gradcheck: eps (", opt.eps,
            "), tolerance (", opt.tolerance, ") and norm floor (", opt.norm_floor,
            ") must be positive");
  HAM_CHECK(opt.entries_per_tensor >= 0, "gradcheck: entries per tensor must be >= 0 (0: all), got ",
            opt.entries_per_tensor);
  std::vector<std::pair<std::string, Tensor>> params = model.named_parameters();
  for (const auto& [name, p] : params) {
    HAM_CHECK(p.dtype() == DType::F64 && p.device().is_cpu(), "gradcheck: parameter '", name,
              "' is ", p.str(), "; convert the model with to(DType::F64) on cpu first");
  }

  // Autograd's gradient at the unperturbed parameters, and the selection it was taken at.
  ModelGradcheckReport report;
  report.tolerance = opt.tolerance;
  model.zero_grad();
  Tensor loss = model.loss(batch);
  report.loss = loss.item();
  backward(loss);
  Selection base_selection = selection_masks(model);
  std::vector<std::vector<double>> analytic;
  for (const auto& [name, p] : params) {
    Tensor g = grad(p);
    analytic.push_back(g.defined() ? g.to_vector<double>()
                                   : std::vector<double>(size_t(p.numel()), 0.0));
  }
  model.zero_grad();

  NoGradGuard no_grad;
  std::mt19937_64 rng(opt.seed);
  auto probe = [&](double* entry, double value, Selection& selection) {
    *entry = value;
    double l = model.loss(batch).item();
    selection = selection_masks(model);
    return l;
  };
  for (size_t i = 0; i < params.size(); ++i) {
    const auto& [name, p] = params[i];
    const std::vector<double>& a = analytic[i];
    TensorGradcheck row;
    row.name = name;
    row.shape = p.shape();
    double norm2 = 0;
    for (double v : a) norm2 += v * v;
    row.grad_norm = std::sqrt(norm2);

    Tensor values = p;  // shares storage: probes write the parameter in place
    double* data = values.data<double>();
    double diff2 = 0, numeric2 = 0;
    for (int64_t j : entries_to_check(a, opt.entries_per_tensor, rng)) {
      double saved = data[j];
      Selection plus_selection, minus_selection;
      double plus = probe(&data[j], saved + opt.eps, plus_selection);
      double minus = probe(&data[j], saved - opt.eps, minus_selection);
      data[j] = saved;
      if (plus_selection != base_selection || minus_selection != base_selection) {
        ++row.skipped;  // the loss is not differentiable across a flipped m_t
        continue;
      }
      double numeric = (plus - minus) / (2 * opt.eps);
      double d = a[size_t(j)] - numeric;
      diff2 += d * d;
      numeric2 += numeric * numeric;
      row.max_abs_error = std::max(row.max_abs_error, std::abs(d));
      ++row.checked;
    }
    row.relative_error = row.checked == 0
                             ? NAN
                             : std::sqrt(diff2) / std::max(std::sqrt(numeric2), opt.norm_floor);
    row.passed = row.checked == 0 || row.relative_error < opt.tolerance;  // NaN/Inf fail
    report.passed = report.passed && row.passed;
    report.checked += row.checked;
    report.skipped += row.skipped;
    if (row.checked > 0 &&
        (!(row.relative_error <= report.worst_relative_error) || report.worst_tensor.empty())) {
      report.worst_relative_error = row.relative_error;
      report.worst_tensor = name;
    }
    report.tensors.push_back(std::move(row));
  }
  // A restored parameter gives back the unperturbed forward's trace.
  model.loss(batch);
  return report;
}

std::string ModelGradcheckReport::table() const {
  size_t name_width = std::string("parameter").size(), shape_width = std::string("shape").size();
  for (const TensorGradcheck& t : tensors) {
    name_width = std::max(name_width, t.name.size());
    shape_width = std::max(shape_width, shape_str(t.shape).size());
  }
  std::string out = fmt::format("{:<{}}  {:<{}}  {:>10}  {:>7}  {:>7}  {:>9}  {:>11}\n", "parameter",
                                name_width, "shape", shape_width, "grad norm", "checked",
                                "skipped", "rel error", "max abs err");
  std::vector<std::string> failing;
  int64_t unchecked = 0;
  for (const TensorGradcheck& t : tensors) {
    std::string mark = !t.passed ? "  <- over tolerance" : (t.checked == 0 ? "  (all skipped)" : "");
    out += fmt::format("{:<{}}  {:<{}}  {:>10.3e}  {:>7}  {:>7}  {:>9}  {:>11}{}\n", t.name,
                       name_width, shape_str(t.shape), shape_width, t.grad_norm, t.checked,
                       t.skipped, format_error(t.relative_error),
                       t.checked == 0 ? std::string("-") : fmt::format("{:.2e}", t.max_abs_error),
                       mark);
    if (!t.passed) failing.push_back(t.name);
    if (t.checked == 0) ++unchecked;
  }
  out += fmt::format("loss {:.6f}; worst relative error {} ({}), tolerance {:.1e}\n", loss,
                     format_error(worst_relative_error), worst_tensor.empty() ? "-" : worst_tensor,
                     tolerance);
  out += fmt::format("{} entries checked in {} tensors, {} skipped (a +-eps probe flipped a HAM "
                     "selection m_t = [e_t >= tau]){}\n",
                     checked, tensors.size(), skipped,
                     unchecked > 0 ? fmt::format(" ({} tensors had every probe skipped)", unchecked)
                                   : std::string());
  if (passed) {
    out += "gradcheck: PASS\n";
  } else {
    std::string names;
    for (const std::string& n : failing) names += (names.empty() ? "" : ", ") + n;
    out += fmt::format("gradcheck: FAIL: {} tensors over the tolerance: {}\n", failing.size(), names);
  }
  return out;
}

}  // namespace ham
