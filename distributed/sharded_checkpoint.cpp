#include "distributed/sharded_checkpoint.h"

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <map>
#include <regex>
#include <string>
#include <system_error>

#include "autograd/grad_mode.h"
#include "core/safetensors.h"
#include "nn/optim.h"

namespace ham::dist {

namespace {

constexpr const char* kFormat = "ham-sharded-v1";

// "name[2, 3];name[4]" for every parameter of the block.
std::string layout_text(const FlatLayout& layout) {
  std::string out;
  for (const FlatEntry& e : layout.entries()) {
    if (!out.empty()) out += ";";
    out += e.name + shape_str(e.shape);
  }
  return out;
}

// The unpadded part of shard k: [begin, end) in the block's flat coordinates.
std::pair<int64_t, int64_t> unpadded_range(int64_t numel, int64_t shard_numel, int shard) {
  int64_t begin = std::min(numel, int64_t(shard) * shard_numel);
  return {begin, std::min(numel, begin + shard_numel)};
}

int64_t parse_int(const SafetensorsFile& file, const std::string& key) {
  auto it = file.metadata.find(key);
  HAM_CHECK(it != file.metadata.end(), file.label, ": sharded checkpoint metadata lacks '", key,
            "'");
  try {
    size_t used = 0;
    int64_t value = std::stoll(it->second, &used);
    if (used == it->second.size()) return value;
  } catch (const std::exception&) {
  }
  HAM_FAIL(file.label, ": sharded checkpoint metadata '", key, "' = '", it->second,
           "' is not an integer");
}

}  // namespace

std::string sharded_checkpoint_file_name(int shard, int num_shards) {
  char name[64];
  std::snprintf(name, sizeof name, "shard-%04d-of-%04d.safetensors", shard, num_shards);
  return name;
}

void save_sharded_checkpoint(const std::string& dir, const ShardedAdamW& optimizer) {
  ShardedModel& model = optimizer.model();
  const ShardingGroups& groups = model.groups();
  const int shard = groups.shard->rank(), num_shards = groups.shard->size();
  if (groups.replica->rank() == 0) {
    std::error_code error;
    std::filesystem::create_directories(dir, error);
    HAM_CHECK(!error, "sharded checkpoint: cannot create '", dir, "': ", error.message());
    std::vector<std::pair<std::string, Tensor>> tensors;
    std::map<std::string, std::string> metadata{
        {"format", kFormat},
        {"num_shards", std::to_string(num_shards)},
        {"steps_taken", std::to_string(optimizer.steps_taken())}};
    for (size_t b = 0; b < model.num_blocks(); ++b) {
      const ShardedBlock& block = model.block(b);
      const FlatLayout& layout = block.layout();
      auto [begin, end] = unpadded_range(layout.numel(), layout.shard_numel(), shard);
      const int64_t length = end - begin;
      metadata[block.name() + ".layout"] = layout_text(layout);
      metadata[block.name() + ".begin"] = std::to_string(begin);
      tensors.emplace_back(block.name() + ".master", block.master_shard().slice(0, length));
      tensors.emplace_back(block.name() + ".exp_avg", optimizer.exp_avg(b).slice(0, length));
      tensors.emplace_back(block.name() + ".exp_avg_sq", optimizer.exp_avg_sq(b).slice(0, length));
    }
    save_safetensors(dir + "/" + sharded_checkpoint_file_name(shard, num_shards), tensors,
                     metadata);
  }
  groups.shard->barrier();
  groups.replica->barrier();
}

int64_t load_sharded_checkpoint(const std::string& dir, ShardedAdamW& optimizer) {
  // The shard count the checkpoint was written with, from the file names.
  static const std::regex pattern(R"(shard-(\d+)-of-(\d+)\.safetensors)");
  std::map<int, int> files;  // shard -> num_shards
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator(dir, error)) {
    std::smatch match;
    std::string name = entry.path().filename().string();
    if (std::regex_match(name, match, pattern)) {
      files[std::stoi(match[1].str())] = std::stoi(match[2].str());
    }
  }
  HAM_CHECK(!error, "sharded checkpoint: cannot list '", dir, "': ", error.message());
  HAM_CHECK(!files.empty(), "sharded checkpoint: no shard-*-of-*.safetensors in '", dir, "'");
  const int old_shards = files.begin()->second;
  for (int k = 0; k < old_shards; ++k) {
    auto it = files.find(k);
    HAM_CHECK(it != files.end() && it->second == old_shards, "sharded checkpoint '", dir,
              "': ", sharded_checkpoint_file_name(k, old_shards), " is missing");
  }
  HAM_CHECK(int(files.size()) == old_shards, "sharded checkpoint '", dir,
            "': shard files of different shard counts");

  ShardedModel& model = optimizer.model();
  const int shard = model.groups().shard->rank();
  int64_t steps_taken = -1;
  for (int k = 0; k < old_shards; ++k) {
    // Skip files that overlap none of this rank's block shards.
    bool needed = false;
    for (size_t b = 0; b < model.num_blocks() && !needed; ++b) {
      const FlatLayout& layout = model.block(b).layout();
      auto [old_begin, old_end] =
          unpadded_range(layout.numel(), (layout.numel() + old_shards - 1) / old_shards, k);
      auto [begin, end] = unpadded_range(layout.numel(), layout.shard_numel(), shard);
      needed = std::max(old_begin, begin) < std::min(old_end, end);
    }
    if (!needed) continue;
    SafetensorsFile file = load_safetensors(dir + "/" + sharded_checkpoint_file_name(k, old_shards));
    HAM_CHECK(file.metadata.count("format") && file.metadata.at("format") == kFormat, file.label,
              ": not a ham sharded checkpoint (format '", kFormat, "' expected)");
    HAM_CHECK(parse_int(file, "num_shards") == old_shards, file.label,
              ": metadata num_shards differs from the file name");
    int64_t steps = parse_int(file, "steps_taken");
    HAM_CHECK(steps_taken < 0 || steps == steps_taken, file.label, ": steps_taken ", steps,
              " differs from the other shards' ", steps_taken);
    steps_taken = steps;
    for (size_t b = 0; b < model.num_blocks(); ++b) {
      ShardedBlock& block = model.block(b);
      const FlatLayout& layout = block.layout();
      const std::string& name = block.name();
      auto layout_it = file.metadata.find(name + ".layout");
      HAM_CHECK(layout_it != file.metadata.end(), file.label, ": no block '", name, "'");
      HAM_CHECK(layout_it->second == layout_text(layout), file.label, ": block '", name,
                "' has parameters ", layout_it->second, ", the model ", layout_text(layout));
      const int64_t old_begin = parse_int(file, name + ".begin");
      auto [begin, end] = unpadded_range(layout.numel(), layout.shard_numel(), shard);
      const std::pair<const char*, Tensor> targets[] = {
          {".master", block.master_shard()},
          {".exp_avg", optimizer.exp_avg(b)},
          {".exp_avg_sq", optimizer.exp_avg_sq(b)}};
      for (const auto& [suffix, target] : targets) {
        const Tensor& saved = file.at(name + suffix);
        HAM_CHECK(saved.dim() == 1 && old_begin + saved.numel() <= layout.numel(), file.label,
                  ": '", name, suffix, "' ", saved.str(), " does not fit the block's ",
                  layout.numel(), " elements");
        const int64_t lo = std::max(begin, old_begin);
        const int64_t hi = std::min(end, old_begin + saved.numel());
        if (lo >= hi) continue;
        Tensor piece = saved.slice(lo - old_begin, hi - old_begin);
        if (piece.dtype() != target.dtype()) piece = piece.to(target.dtype());
        Tensor destination = target.slice(lo - begin, hi - begin);
        destination.copy_(piece);
      }
    }
  }
  // A rank whose shard is all padding reads no file: take the count from the others.
  double steps = model.groups().shard->all_reduce_scalar(double(steps_taken), ReduceOp::Max);
  HAM_CHECK(steps >= 0, "sharded checkpoint '", dir, "': no shard file was read on any rank");
  optimizer.set_steps_taken(int64_t(steps));
  model.publish_parameters();
  return int64_t(steps);
}

namespace {
constexpr std::pair<const char*, bool> kMoments[] = {{"exp_avg.", true}, {"exp_avg_sq.", false}};
}  // namespace

void load_full_optimizer_state(ShardedAdamW& optimizer,
                               const std::vector<std::pair<std::string, Tensor>>& adamw_state,
                               int64_t steps_taken) {
  NoGradGuard no_grad;
  std::map<std::string, Tensor> by_name(adamw_state.begin(), adamw_state.end());
  ShardedModel& model = optimizer.model();
  for (size_t b = 0; b < model.num_blocks(); ++b) {
    const ShardedBlock& block = model.block(b);
    for (const ShardSegment& s : block.layout().segments(block.shard_index())) {
      const FlatEntry& e = block.layout().entries()[s.entry];
      for (const auto& [prefix, first] : kMoments) {
        auto it = by_name.find(prefix + e.name);
        HAM_CHECK(it != by_name.end(), "optimizer state: no '", prefix, e.name, "'");
        HAM_CHECK(it->second.shape() == e.shape, "optimizer state: '", prefix, e.name,
                  "' has shape ", shape_str(it->second.shape()), ", the parameter ",
                  shape_str(e.shape));
        Tensor moment = first ? optimizer.exp_avg(b) : optimizer.exp_avg_sq(b);
        Tensor piece = it->second.to(Device::cpu()).reshape({e.numel})
                           .slice(s.offset_in_param, s.offset_in_param + s.numel);
        moment.slice(s.offset_in_shard, s.offset_in_shard + s.numel)
            .copy_(piece.to(moment.dtype()).to(moment.device()));
      }
    }
  }
  optimizer.set_steps_taken(steps_taken);
}

std::vector<std::pair<std::string, Tensor>> full_optimizer_state(const ShardedAdamW& optimizer) {
  NoGradGuard no_grad;
  ShardedModel& model = optimizer.model();
  std::vector<std::pair<std::string, Tensor>> out;
  for (size_t b = 0; b < model.num_blocks(); ++b) {
    const FlatLayout& layout = model.block(b).layout();
    for (const auto& [prefix, first] : kMoments) {
      const Tensor& shard = first ? optimizer.exp_avg(b) : optimizer.exp_avg_sq(b);
      Tensor flat = Tensor::empty({layout.padded_numel()}, shard.dtype(), shard.device());
      model.groups().shard->all_gather(shard, flat);
      flat = flat.to(Device::cpu());
      for (const FlatEntry& e : layout.entries()) {
        Tensor piece = flat.slice(e.offset, e.offset + e.numel).reshape(e.shape).clone();
        // AdamW keeps its moments in the parameter's dtype.
        DType dtype = model.block(b).parameter_dtype();
        out.emplace_back(prefix + e.name, piece.dtype() == dtype ? piece : piece.to(dtype));
      }
    }
  }
  return out;
}

std::pair<std::vector<std::pair<std::string, Tensor>>, int64_t> read_sharded_checkpoint_unsharded(
    const std::string& dir, const std::vector<std::pair<std::string, Tensor>>& parameters) {
  // A throwaway sharded copy of the parameters over a world of one: the loader then does
  // the reassembly of any shard count.
  std::vector<std::pair<std::string, Tensor>> copies;
  for (const auto& [name, p] : parameters) copies.emplace_back(name, p.clone());
  auto world = std::make_shared<SingleProcessCommunicator>();
  ShardedModel sharded(group_parameters_by_layer(copies), make_sharding_groups(world, 1),
                       ShardingStage::GradientsAndOptimizer);
  ShardedAdamW optimizer(sharded, decay_groups(copies, 0.0), AdamW::Options{});
  int64_t steps = load_sharded_checkpoint(dir, optimizer);
  return {full_optimizer_state(optimizer), steps};
}

}  // namespace ham::dist
