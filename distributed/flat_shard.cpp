#include "distributed/flat_shard.h"

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <cstdio>
#include <cmath>
#include <map>
#include <string>

#include "autograd/grad_mode.h"
#include "autograd/node.h"
#include "core/ops/elementwise.h"
#include "core/ops/optim.h"

namespace ham::dist {

const char* sharding_stage_name(ShardingStage stage) {
  return stage == ShardingStage::Full ? "full" : "grads+optimizer";
}

ShardingStage parse_sharding_stage(const std::string& text) {
  if (text == "grads" || text == "grads+optimizer" || text == "zero2") {
    return ShardingStage::GradientsAndOptimizer;
  }
  if (text == "full" || text == "zero3") return ShardingStage::Full;
  HAM_FAIL("unknown sharding stage '", text,
           "' (expected grads, grads+optimizer, zero2, full or zero3)");
}

// ---- Layout ---------------------------------------------------------------------------

FlatLayout::FlatLayout(const std::vector<std::pair<std::string, Shape>>& parameters,
                       int num_shards)
    : num_shards_(num_shards) {
  HAM_CHECK(num_shards >= 1, "flat layout: number of shards must be >= 1, got ", num_shards);
  int64_t offset = 0;
  for (const auto& [name, shape] : parameters) {
    int64_t numel = shape_numel(shape);
    entries_.push_back(FlatEntry{name, shape, offset, numel});
    offset += numel;
  }
  numel_ = offset;
  shard_numel_ = (numel_ + num_shards - 1) / num_shards;
}

std::vector<ShardSegment> FlatLayout::segments(int shard) const {
  HAM_CHECK(0 <= shard && shard < num_shards_, "flat layout: shard ", shard,
            " out of range for ", num_shards_, " shards");
  const int64_t begin = shard_begin(shard), end = begin + shard_numel_;
  std::vector<ShardSegment> out;
  for (size_t i = 0; i < entries_.size(); ++i) {
    const FlatEntry& e = entries_[i];
    int64_t lo = std::max(begin, e.offset), hi = std::min(end, e.offset + e.numel);
    if (lo < hi) out.push_back(ShardSegment{i, lo - e.offset, lo - begin, hi - lo});
  }
  return out;
}

std::vector<ParameterBlock> group_parameters_by_layer(
    const std::vector<std::pair<std::string, Tensor>>& named_parameters) {
  ParameterBlock rest{"rest", {}};
  std::map<int64_t, ParameterBlock> layers;
  const std::string prefix = "layers.";
  for (const auto& named : named_parameters) {
    const std::string& name = named.first;
    size_t digits_end = prefix.size();
    while (digits_end < name.size() && std::isdigit(static_cast<unsigned char>(name[digits_end]))) {
      ++digits_end;
    }
    bool in_layer = name.rfind(prefix, 0) == 0 && digits_end > prefix.size() &&
                    digits_end < name.size() && name[digits_end] == '.';
    if (!in_layer) {
      rest.parameters.push_back(named);
      continue;
    }
    int64_t index = std::stoll(name.substr(prefix.size(), digits_end - prefix.size()));
    ParameterBlock& block = layers[index];
    block.name = name.substr(0, digits_end);
    block.parameters.push_back(named);
  }
  std::vector<ParameterBlock> blocks;
  // A flat buffer holds one dtype: a group of several (mixed precision keeps a few
  // parameters f32 in a bf16 model) becomes adjacent blocks, "<name>" with its first
  // parameter's dtype and "<name>:<dtype>" for each other one.
  auto add_split_by_dtype = [&](ParameterBlock group) {
    std::vector<ParameterBlock> parts;
    std::vector<DType> dtypes;
    for (auto& named : group.parameters) {
      const DType dtype = named.second.dtype();
      size_t i = size_t(std::find(dtypes.begin(), dtypes.end(), dtype) - dtypes.begin());
      if (i == dtypes.size()) {
        dtypes.push_back(dtype);
        parts.push_back({i == 0 ? group.name : group.name + ":" + dtype_name(dtype), {}});
      }
      parts[i].parameters.push_back(std::move(named));
    }
    for (auto& part : parts) blocks.push_back(std::move(part));
  };
  if (!rest.parameters.empty()) add_split_by_dtype(std::move(rest));
  for (auto& [index, block] : layers) add_split_by_dtype(std::move(block));
  return blocks;
}

// ---- One block ------------------------------------------------------------------------

namespace {

// A 1-D range of a flat buffer as a tensor of `shape`.
Tensor flat_piece(const Tensor& flat, int64_t offset, int64_t numel, const Shape& shape) {
  return flat.slice(offset, offset + numel).reshape(shape);
}

Tensor converted(const Tensor& t, DType dtype) {
  return t.dtype() == dtype ? t : t.to(dtype);
}

}  // namespace

ShardedBlock::ShardedBlock(ParameterBlock block, ShardingGroups groups, ShardingStage stage)
    : name_(std::move(block.name)), parameters_(std::move(block.parameters)),
      groups_(std::move(groups)), stage_(stage),
      layout_([&] {
        std::vector<std::pair<std::string, Shape>> shapes;
        for (const auto& [name, p] : parameters_) shapes.emplace_back(name, p.shape());
        HAM_CHECK(groups_.shard && groups_.replica && groups_.shard_gradients,
                  "sharded block '", name_, "': sharding groups are incomplete");
        return FlatLayout(shapes, groups_.shard->size());
      }()) {
  HAM_CHECK(!parameters_.empty(), "sharded block '", name_, "': no parameters");
  HAM_CHECK(groups_.shard_gradients->size() == groups_.shard->size(), "sharded block '", name_,
            "': the gradient communicator has ", groups_.shard_gradients->size(),
            " ranks, the shard group ", groups_.shard->size());
  const Tensor& first = parameters_.front().second;
  parameter_dtype_ = first.dtype();
  device_ = first.device();
  for (const auto& [name, p] : parameters_) {
    HAM_CHECK(p.defined(), "sharded block '", name_, "': parameter '", name, "' is undefined");
    HAM_CHECK(p.dtype() == parameter_dtype_ && p.device() == device_, "sharded block '", name_,
              "': parameter '", name, "' is ", p.str(), " but '", parameters_.front().first,
              "' is ", first.str(), " (one dtype and device per block)");
  }
  HAM_CHECK(is_floating(parameter_dtype_), "sharded block '", name_,
            "': parameters must be floating, got ", dtype_name(parameter_dtype_));
  master_dtype_ = parameter_dtype_ == DType::F64 ? DType::F64 : DType::F32;

  NoGradGuard no_grad;
  // The current values, flattened and zero-padded.
  Tensor flat = Tensor::zeros({layout_.padded_numel()}, parameter_dtype_, device_);
  for (size_t i = 0; i < parameters_.size(); ++i) {
    const FlatEntry& e = layout_.entries()[i];
    Tensor piece = flat_piece(flat, e.offset, e.numel, e.shape);
    piece.copy_(parameters_[i].second);
  }
  check_replicas_agree(flat);

  const int64_t shard = layout_.shard_numel(), begin = layout_.shard_begin(shard_index());
  Tensor own_chunk = flat.slice(begin, begin + shard);
  released_storage_ = std::make_shared<Storage>(0, device_);
  if (stage_ == ShardingStage::GradientsAndOptimizer) {
    flat_parameters_ = flat;
    bind_parameters_to(flat_parameters_);
    master_is_view_ = parameter_dtype_ == master_dtype_;
    master_shard_ = master_is_view_ ? own_chunk : own_chunk.to(master_dtype_);
  } else {
    master_shard_ = parameter_dtype_ == master_dtype_ ? own_chunk.clone()
                                                      : own_chunk.to(master_dtype_);
    release();
  }
  gradient_shard_ = Tensor::zeros({shard}, master_dtype_, device_);
}

ShardedBlock::~ShardedBlock() = default;  // pending collectives wait in their destructors

int ShardedBlock::shard_index() const { return groups_.shard->rank(); }

void ShardedBlock::check_replicas_agree(const Tensor& flat) {
  // Thread counts may differ across ranks, so equal values may sum in another order.
  double local = ops::squared_norm(flat);
  for (const auto& comm : {groups_.shard, groups_.replica}) {
    if (comm->size() == 1) continue;
    double low = comm->all_reduce_scalar(local, ReduceOp::Min);
    double high = comm->all_reduce_scalar(local, ReduceOp::Max);
    HAM_CHECK(high - low <= 1e-9 * std::max(std::abs(high), 1e-300), "sharded block '", name_,
              "': parameters differ across the ranks of ", comm->name(),
              " (sum of squares from ", low, " to ", high,
              "); build the model from the same seed on every rank");
  }
}

void ShardedBlock::bind_parameters_to(const Tensor& flat) {
  const size_t element = dtype_size(parameter_dtype_);
  for (size_t i = 0; i < parameters_.size(); ++i) {
    TensorImpl* impl = parameters_[i].second.impl();
    impl->storage = flat.impl()->storage;
    impl->offset_bytes = flat.impl()->offset_bytes + size_t(layout_.entries()[i].offset) * element;
  }
}

Tensor ShardedBlock::gather_input() const { return converted(master_shard_, parameter_dtype_); }

void ShardedBlock::start_gather() {
  if (stage_ != ShardingStage::Full || flat_parameters_.defined() || pending_gather_) return;
  gathering_into_ = Tensor::empty({layout_.padded_numel()}, parameter_dtype_, device_);
  if (gathered_bytes_) gathered_bytes_->add(gathered_parameter_bytes());
  pending_gather_ = groups_.shard->all_gather_async(gather_input(), gathering_into_);
}

void ShardedBlock::wait_gather() {
  if (stage_ != ShardingStage::Full || flat_parameters_.defined()) return;
  start_gather();
  pending_gather_->wait();
  pending_gather_.reset();
  flat_parameters_ = std::move(gathering_into_);
  gathering_into_ = Tensor();
  bind_parameters_to(flat_parameters_);
}

bool ShardedBlock::gathered() const {
  return stage_ == ShardingStage::GradientsAndOptimizer || flat_parameters_.defined();
}

void ShardedBlock::release() {
  if (stage_ != ShardingStage::Full) return;
  if (pending_gather_) wait_gather();  // never free a buffer a collective still writes
  if (flat_parameters_.defined() && gathered_bytes_) {
    gathered_bytes_->remove(gathered_parameter_bytes());
  }
  for (auto& [name, p] : parameters_) {
    p.impl()->storage = released_storage_;
    p.impl()->offset_bytes = 0;
  }
  flat_parameters_ = Tensor();
}

Tensor ShardedBlock::flat_gradient_buffer() {
  HAM_CHECK(!pending_scatter_, "sharded block '", name_,
            "': gradients written while its reduce-scatter is in flight");
  if (!flat_gradients_.defined()) {
    flat_gradients_ = Tensor::zeros({layout_.padded_numel()}, master_dtype_, device_);
  }
  return flat_gradients_;
}

void ShardedBlock::write_flat_gradient(size_t entry, const Tensor& gradient) {
  const FlatEntry& e = layout_.entries().at(entry);
  HAM_CHECK(gradient.shape() == e.shape, "sharded block '", name_, "': gradient of '", e.name,
            "' has shape ", shape_str(gradient.shape()), ", the parameter ", shape_str(e.shape));
  Tensor piece = flat_piece(flat_gradient_buffer(), e.offset, e.numel, e.shape);
  piece.copy_(converted(gradient, master_dtype_));
}

void ShardedBlock::start_gradient_reduce_scatter() {
  NoGradGuard no_grad;
  flat_gradient_buffer();
  for (size_t i = 0; i < parameters_.size(); ++i) {
    const Tensor& p = parameters_[i].second;
    Tensor g = grad(p);
    if (g.defined()) write_flat_gradient(i, g);
    clear_grad(p);
  }
  start_reduce_scatter_of_flat_gradients();
}

void ShardedBlock::start_reduce_scatter_of_flat_gradients() {
  HAM_CHECK(!pending_scatter_, "sharded block '", name_,
            "': gradient reduce-scatter started twice");
  Tensor flat = flat_gradient_buffer();
  scattered_shard_ = Tensor::empty({layout_.shard_numel()}, master_dtype_, device_);
  pending_scatter_ = groups_.shard_gradients->reduce_scatter_async(flat, scattered_shard_,
                                                                   ReduceOp::Avg);
}

void ShardedBlock::wait_gradient_reduce_scatter() {
  if (!pending_scatter_) return;
  NoGradGuard no_grad;
  pending_scatter_->wait();
  pending_scatter_.reset();
  flat_gradients_ = Tensor();
  if (groups_.replica->size() > 1) groups_.replica->all_reduce(scattered_shard_, ReduceOp::Avg);
  ops::axpy_(1.0, scattered_shard_, gradient_shard_);
  scattered_shard_ = Tensor();
}

void ShardedBlock::zero_gradient_shard() { gradient_shard_.zero_(); }

void ShardedBlock::publish_parameters() {
  if (stage_ == ShardingStage::Full) {
    release();  // a gathered buffer holds the old values
    return;
  }
  const int64_t begin = layout_.shard_begin(shard_index());
  Tensor own_chunk = flat_parameters_.slice(begin, begin + layout_.shard_numel());
  if (!master_is_view_) own_chunk.copy_(converted(master_shard_, parameter_dtype_));
  groups_.shard->all_gather(own_chunk, flat_parameters_);  // in place
}

std::vector<std::pair<std::string, Tensor>> ShardedBlock::full_parameters() {
  Tensor flat = flat_parameters_;
  const bool temporary = !flat.defined();
  if (temporary) {
    flat = Tensor::empty({layout_.padded_numel()}, parameter_dtype_, device_);
    if (gathered_bytes_) gathered_bytes_->add(gathered_parameter_bytes());
    groups_.shard->all_gather(gather_input(), flat);
  }
  std::vector<std::pair<std::string, Tensor>> out;
  for (const FlatEntry& e : layout_.entries()) {
    Tensor piece = flat_piece(flat, e.offset, e.numel, e.shape);
    out.emplace_back(e.name, piece.device().is_cpu() ? piece.clone() : piece.to(Device::cpu()));
  }
  if (temporary && gathered_bytes_) gathered_bytes_->remove(gathered_parameter_bytes());
  return out;
}

std::vector<std::pair<std::string, Tensor>> ShardedBlock::full_master_parameters() {
  Tensor flat = Tensor::empty({layout_.padded_numel()}, master_dtype_, device_);
  groups_.shard->all_gather(master_shard_, flat);
  std::vector<std::pair<std::string, Tensor>> out;
  for (const FlatEntry& e : layout_.entries()) {
    Tensor piece = flat_piece(flat, e.offset, e.numel, e.shape);
    out.emplace_back(e.name, piece.device().is_cpu() ? piece.clone() : piece.to(Device::cpu()));
  }
  return out;
}

void ShardedBlock::load_full_parameters(const std::map<std::string, Tensor>& full) {
  NoGradGuard no_grad;
  for (const ShardSegment& s : layout_.segments(shard_index())) {
    const FlatEntry& e = layout_.entries()[s.entry];
    auto it = full.find(e.name);
    HAM_CHECK(it != full.end(), "sharded block '", name_, "': no value for '", e.name, "'");
    HAM_CHECK(it->second.shape() == e.shape, "sharded block '", name_, "': value for '", e.name,
              "' has shape ", shape_str(it->second.shape()), ", the parameter ",
              shape_str(e.shape));
    Tensor source = it->second.to(Device::cpu()).reshape({e.numel});
    Tensor piece = source.slice(s.offset_in_param, s.offset_in_param + s.numel);
    Tensor target = master_shard_.slice(s.offset_in_shard, s.offset_in_shard + s.numel);
    target.copy_(converted(piece, master_dtype_));
  }
}

int64_t ShardedBlock::replicated_parameter_bytes() const {
  return stage_ == ShardingStage::GradientsAndOptimizer ? gathered_parameter_bytes() : 0;
}
int64_t ShardedBlock::gathered_parameter_bytes() const {
  return layout_.padded_numel() * int64_t(dtype_size(parameter_dtype_));
}
int64_t ShardedBlock::master_bytes() const {
  return master_is_view_ ? 0 : layout_.shard_numel() * int64_t(dtype_size(master_dtype_));
}
int64_t ShardedBlock::gradient_shard_bytes() const {
  return layout_.shard_numel() * int64_t(dtype_size(master_dtype_));
}

// ---- A model --------------------------------------------------------------------------

// Which parameters' gradients arrived in the current backward, per block.
struct ShardedModel::GradientTracking {
  bool armed = false;
  std::vector<std::vector<bool>> arrived;  // [block][entry]
  std::vector<size_t> arrived_count, expected_count;
  std::vector<bool> complete;
  // Reduce-scatters start in reverse block order only, so every rank starts them in the
  // same order whatever order its backward finished the blocks in.
  size_t next_to_start = 0;  // blocks [next_to_start, num_blocks) have started
};

ShardedModel::ShardedModel(std::vector<ParameterBlock> blocks, ShardingGroups groups,
                           ShardingStage stage)
    : groups_(std::move(groups)), stage_(stage), tracking_(std::make_shared<GradientTracking>()),
      gathered_bytes_(std::make_shared<GatheredParameterBytes>()) {
  HAM_CHECK(!blocks.empty(), "sharded model: no parameter blocks");
  for (auto& b : blocks) {
    blocks_.push_back(std::make_unique<ShardedBlock>(std::move(b), groups_, stage_));
    blocks_.back()->count_gathered_bytes_in(gathered_bytes_);
  }

  GradientTracking& t = *tracking_;
  t.next_to_start = blocks_.size();
  for (size_t b = 0; b < blocks_.size(); ++b) {
    const auto& params = blocks_[b]->parameters();
    t.arrived.emplace_back(params.size(), false);
    t.arrived_count.push_back(0);
    t.complete.push_back(false);
    size_t expected = 0;
    for (size_t e = 0; e < params.size(); ++e) {
      const Tensor& p = params[e].second;
      if (!requires_grad(p)) continue;
      ++expected;
      std::weak_ptr<GradientTracking> weak = tracking_;
      ShardedBlock* block = blocks_[b].get();
      ShardedModel* model = this;
      // Hooks cannot be removed: they do nothing once the model is gone or disarmed.
      register_hook(p, [weak, block, model, b, e](const Tensor& g) {
        auto tracking = weak.lock();
        if (!tracking || !tracking->armed) return Tensor();
        GradientTracking& t = *tracking;
        HAM_CHECK(!t.arrived[b][e], "sharded model: gradient of '",
                  block->parameters()[e].first, "' arrived twice in one backward");
        block->write_flat_gradient(e, g);
        t.arrived[b][e] = true;
        if (++t.arrived_count[b] < t.expected_count[b]) return Tensor();
        // Every gradient of the block is in: earlier arrivals' grad() copies can go (this
        // one's is stored after the hook and cleared in finish_backward).
        for (size_t i = 0; i < block->parameters().size(); ++i) {
          if (i != e) clear_grad(block->parameters()[i].second);
        }
        t.complete[b] = true;
        while (t.next_to_start > 0 && t.complete[t.next_to_start - 1]) {
          --t.next_to_start;
          ShardedBlock& ready = model->block(t.next_to_start);
          ready.start_reduce_scatter_of_flat_gradients();
        }
        // Every node that reads this block's parameters has run (each one sends a
        // gradient to one of them), so Full sharding can drop them now.
        block->release();
        return Tensor();
      });
    }
    t.expected_count.push_back(expected);
  }
}

ShardedModel::~ShardedModel() = default;

size_t ShardedModel::block_index(const std::string& name) const {
  for (size_t i = 0; i < blocks_.size(); ++i) {
    if (blocks_[i]->name() == name) return i;
  }
  HAM_FAIL("sharded model: no block named '", name, "'");
}

void ShardedModel::gather_all() {
  for (auto& b : blocks_) b->start_gather();
  for (auto& b : blocks_) b->wait_gather();
}

void ShardedModel::release_all() {
  for (auto& b : blocks_) b->release();
}

namespace {

// Made only to read the engine's creation counter: its number is the next one.
class CreationMark final : public Node {
 public:
  std::string name() const override { return "CreationMark"; }
  std::vector<Tensor> apply(std::vector<Tensor>&) override { return {}; }
};

}  // namespace

void ShardedModel::accumulate_gradients_right_after_backward_of(size_t index) {
  const uint64_t now = CreationMark().sequence_nr;
  for (const auto& [name, p] : block(index).parameters()) {
    if (!requires_grad(p)) continue;
    Edge accumulator = gradient_edge(p);
    HAM_CHECK(accumulator.valid() && is_leaf(p), "sharded model: block '", block(index).name(),
              "': parameter '", name, "' is not a leaf, so it has no gradient accumulator");
    accumulator.node->sequence_nr = now;
  }
}

int64_t ShardedModel::gathered_parameter_bytes_now() const {
  if (stage_ == ShardingStage::GradientsAndOptimizer) return memory_per_rank(false).parameters;
  return gathered_bytes_->now;
}

int64_t ShardedModel::peak_gathered_parameter_bytes() const {
  if (stage_ == ShardingStage::GradientsAndOptimizer) return memory_per_rank(false).parameters;
  return gathered_bytes_->peak;
}

void ShardedModel::reset_peak_gathered_parameter_bytes() {
  gathered_bytes_->peak = gathered_bytes_->now;
}

int64_t ShardedModel::full_parameter_bytes() const {
  int64_t bytes = 0;
  for (const auto& b : blocks_) {
    bytes += b->layout().numel() * int64_t(dtype_size(b->parameter_dtype()));
  }
  return bytes;
}

void ShardedModel::begin_backward() {
  GradientTracking& t = *tracking_;
  HAM_CHECK(!t.armed, "sharded model: begin_backward twice without finish_backward");
  for (size_t b = 0; b < blocks_.size(); ++b) {
    for (const auto& [name, p] : blocks_[b]->parameters()) {
      HAM_CHECK(!grad(p).defined(), "sharded model: begin_backward: '", name,
                "' already has a gradient (from a backward outside begin/finish_backward); "
                "reduce_scatter_gradients() or clear it first");
    }
    std::fill(t.arrived[b].begin(), t.arrived[b].end(), false);
    t.arrived_count[b] = 0;
    t.complete[b] = false;
  }
  t.next_to_start = blocks_.size();
  t.armed = true;
}

void ShardedModel::finish_backward() {
  GradientTracking& t = *tracking_;
  HAM_CHECK(t.armed, "sharded model: finish_backward without begin_backward");
  t.armed = false;
  NoGradGuard no_grad;
  while (t.next_to_start > 0) {
    size_t b = --t.next_to_start;
    ShardedBlock& block = *blocks_[b];
    if (!t.complete[b]) {
      const auto& params = block.parameters();
      for (size_t e = 0; e < params.size(); ++e) {
        Tensor g = grad(params[e].second);
        if (!t.arrived[b][e] && g.defined()) block.write_flat_gradient(e, g);
      }
      block.flat_gradient_buffer();  // zeros when nothing arrived: peers may have some
      block.start_reduce_scatter_of_flat_gradients();
    }
  }
  for (auto it = blocks_.rbegin(); it != blocks_.rend(); ++it) {
    (*it)->wait_gradient_reduce_scatter();
    for (const auto& [name, p] : (*it)->parameters()) clear_grad(p);
    (*it)->release();
  }
}

void ShardedModel::reduce_scatter_gradients() {
  HAM_CHECK(!tracking_->armed, "sharded model: reduce_scatter_gradients inside begin/finish_backward");
  for (auto it = blocks_.rbegin(); it != blocks_.rend(); ++it) (*it)->start_gradient_reduce_scatter();
  for (auto it = blocks_.rbegin(); it != blocks_.rend(); ++it) (*it)->wait_gradient_reduce_scatter();
}

void ShardedModel::zero_gradients() {
  for (auto& b : blocks_) b->zero_gradient_shard();
}

double ShardedModel::gradient_norm() {
  double local = 0;
  for (auto& b : blocks_) local += ops::squared_norm(b->gradient_shard());
  return std::sqrt(groups_.shard->all_reduce_scalar(local, ReduceOp::Sum));
}

double ShardedModel::clip_gradient_norm(double max_norm) {
  NoGradGuard no_grad;
  double norm = gradient_norm();
  if (!std::isfinite(norm)) return norm;
  if (norm > max_norm && norm > 0) {
    for (auto& b : blocks_) {
      Tensor shard = b->gradient_shard();
      ops::scale_(shard, max_norm / norm);
    }
  }
  return norm;
}

std::string ShardedModel::first_non_finite_gradient() {
  constexpr double kNone = 9.0e15;  // above any parameter index, exact in a double
  double first_local = kNone;
  int64_t index_base = 0;
  for (auto& b : blocks_) {
    for (const ShardSegment& s : b->layout().segments(b->shard_index())) {
      Tensor piece = b->gradient_shard().slice(s.offset_in_shard, s.offset_in_shard + s.numel);
      if (!ops::all_finite(piece)) first_local = std::min(first_local, double(index_base + int64_t(s.entry)));
    }
    index_base += int64_t(b->layout().entries().size());
  }
  double first = groups_.shard->all_reduce_scalar(first_local, ReduceOp::Min);
  if (first == kNone) return "";
  int64_t index = int64_t(first);
  for (auto& b : blocks_) {
    int64_t count = int64_t(b->layout().entries().size());
    if (index < count) return b->layout().entries()[size_t(index)].name;
    index -= count;
  }
  HAM_FAIL("sharded model: non-finite gradient index out of range");
}

void ShardedModel::publish_parameters() {
  for (auto& b : blocks_) b->publish_parameters();
}

std::vector<std::pair<std::string, Tensor>> ShardedModel::full_parameters() {
  std::vector<std::pair<std::string, Tensor>> out;
  for (auto& b : blocks_) {
    for (auto& named : b->full_parameters()) out.push_back(std::move(named));
  }
  return out;
}

std::vector<std::pair<std::string, Tensor>> ShardedModel::full_master_parameters() {
  std::vector<std::pair<std::string, Tensor>> out;
  for (auto& b : blocks_) {
    for (auto& named : b->full_master_parameters()) out.push_back(std::move(named));
  }
  return out;
}

std::vector<std::pair<std::string, Tensor>> ShardedModel::full_gradients() {
  std::vector<std::pair<std::string, Tensor>> out;
  for (auto& b : blocks_) {
    const FlatLayout& layout = b->layout();
    Tensor flat = Tensor::empty({layout.padded_numel()}, b->gradient_shard().dtype(),
                                b->gradient_shard().device());
    groups_.shard->all_gather(b->gradient_shard(), flat);
    for (const FlatEntry& e : layout.entries()) {
      Tensor piece = converted(flat_piece(flat, e.offset, e.numel, e.shape), b->parameter_dtype());
      out.emplace_back(e.name, piece.device() == b->device() ? piece.clone() : piece.to(b->device()));
    }
  }
  return out;
}

void ShardedModel::load_full_parameters(
    const std::vector<std::pair<std::string, Tensor>>& named) {
  std::map<std::string, Tensor> full(named.begin(), named.end());
  for (auto& b : blocks_) b->load_full_parameters(full);
  publish_parameters();
}

std::string ShardMemoryReport::str() const {
  auto mib = [](int64_t bytes) {
    char text[32];
    std::snprintf(text, sizeof text, "%.3f MiB", double(bytes) / (1024.0 * 1024.0));
    return std::string(text);
  };
  return "parameters " + mib(parameters) + ", master " + mib(master) + ", gradients " +
         mib(gradients) + ", optimizer " + mib(optimizer) + ", total " + mib(total());
}

ShardMemoryReport ShardedModel::memory_per_rank(bool with_optimizer) const {
  ShardMemoryReport report;
  std::vector<int64_t> layer_bytes;
  int64_t rest_bytes = 0;
  for (const auto& b : blocks_) {
    report.master += b->master_bytes();
    report.gradients += b->gradient_shard_bytes();
    if (with_optimizer) report.optimizer += 2 * b->gradient_shard_bytes();
    if (stage_ == ShardingStage::GradientsAndOptimizer) {
      report.parameters += b->replicated_parameter_bytes();
    } else if (b->name() == "rest") {
      rest_bytes = b->gathered_parameter_bytes();
    } else {
      layer_bytes.push_back(b->gathered_parameter_bytes());
    }
  }
  if (stage_ == ShardingStage::Full) {
    // Peak under per-block gathering (distributed/sharded_block_hooks.h): "rest" stays
    // gathered through the step, plus the running layer and its neighbour being prefetched.
    int64_t pair = layer_bytes.empty() ? 0 : layer_bytes.front();
    for (size_t i = 1; i < layer_bytes.size(); ++i) {
      pair = std::max(pair, layer_bytes[i - 1] + layer_bytes[i]);
    }
    report.parameters = rest_bytes + pair;
  }
  return report;
}

// ---- Optimizer ------------------------------------------------------------------------

ShardedAdamW::ShardedAdamW(ShardedModel& model, const std::vector<ParamGroup>& groups,
                           AdamW::Options options)
    : model_(model), options_(options) {
  std::map<std::string, const ParamGroup*> group_of;
  for (const ParamGroup& g : groups) {
    for (const auto& [name, p] : g.params) {
      HAM_CHECK(group_of.emplace(name, &g).second, "sharded AdamW: parameter '", name,
                "' is in two groups ('", group_of[name]->name, "' and '", g.name, "')");
    }
  }
  size_t matched = 0;
  for (size_t b = 0; b < model_.num_blocks(); ++b) {
    ShardedBlock& block = model_.block(b);
    int64_t shard = block.layout().shard_numel();
    exp_avg_.push_back(Tensor::zeros({shard}, block.master_dtype(), block.device()));
    exp_avg_sq_.push_back(Tensor::zeros({shard}, block.master_dtype(), block.device()));
    segments_.emplace_back();
    for (const FlatEntry& e : block.layout().entries()) {
      HAM_CHECK(group_of.count(e.name), "sharded AdamW: parameter '", e.name,
                "' is in no parameter group");
      ++matched;
    }
    for (const ShardSegment& s : block.layout().segments(block.shard_index())) {
      const ParamGroup& g = *group_of.at(block.layout().entries()[s.entry].name);
      segments_.back().push_back(SegmentHyper{s, g.weight_decay, g.lr_scale});
    }
  }
  HAM_CHECK(matched == group_of.size(), "sharded AdamW: the groups name ", group_of.size(),
            " parameters, the sharded model has ", matched);
}

void ShardedAdamW::step(double lr) {
  NoGradGuard no_grad;
  ++step_;
  for (size_t b = 0; b < model_.num_blocks(); ++b) {
    ShardedBlock& block = model_.block(b);
    for (const SegmentHyper& piece : segments_[b]) {
      const int64_t begin = piece.segment.offset_in_shard, end = begin + piece.segment.numel;
      AdamWHyper hyper{lr * piece.lr_scale, options_.beta1, options_.beta2, options_.eps,
                       piece.weight_decay, step_};
      Tensor param = block.master_shard().slice(begin, end);
      Tensor exp_avg = exp_avg_[b].slice(begin, end);
      Tensor exp_avg_sq = exp_avg_sq_[b].slice(begin, end);
      ops::adamw_step(param, block.gradient_shard().slice(begin, end), exp_avg, exp_avg_sq,
                      hyper);
    }
  }
  model_.publish_parameters();
}

}  // namespace ham::dist
