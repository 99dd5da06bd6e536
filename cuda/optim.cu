// CUDA kernels of core/ops/optim.h (adamw_step, adamw_step_multi, squared_norm,
// squared_norms) and the fused multi-tensor AdamW of cuda/optim.h:
//   adamw_step:   g = grad_scale grad (the clipping's factor, core/ops/optim.h)
//                 p <- p (1 - lr wd)
//                 m <- b1 m + (1 - b1) g;   v <- b2 v + (1 - b2) g^2
//                 p <- p - lr (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)
//                 computed as p decay - step_size m / (sqrt(v) inv_sqrt_bias2 + eps), as on the CPU
//   squared_norm: sum of g^2, accumulated in f64.
//   squared_norms: each tensor's sum of g^2, its chunks' f64 sums added in order on the host.
// Multi-tensor: every tensor is cut into chunks of kChunk elements and each chunk is one
// block of a single launch; the (tensor, chunk) table and the tensors' pointers live in
// a small device buffer uploaded per call, so the launch has no limit on tensor count.
// The math runs in the moments' type (f32, or f64 when everything is f64); params and
// gradients are read and written in their own dtypes (bf16 gradients, fp32 masters).
// When every tensor is 16-byte aligned, each thread moves 16 bytes of moments at a time.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "cuda/launch.h"
#include "cuda/optim.h"
#include "cuda/reduce_utils.cuh"

namespace ham::cuda {

namespace {

constexpr int64_t kChunk = 1 << 16;  // elements per block

struct AdamWSlot {
  void* param;
  const void* grad;
  void* exp_avg;
  void* exp_avg_sq;
  bf16* rounded;  // the updated param rounded to bf16 here too (null: no copy)
  int64_t numel;
};

struct AdamWBlock {
  int32_t slot;
  int32_t chunk;
};

template <class M>
struct AdamWCoefficients {
  M decay, beta1, beta2, step_size, inv_sqrt_bias2, eps, grad_scale;
};

// One element's update (the formula at the top of this file).
template <class P, class G, class M>
__device__ __forceinline__ void adamw_update(P& p, G g, M& m, M& v, const AdamWCoefficients<M>& k) {
  const M grad = M(load(g)) * k.grad_scale;
  const M m_new = k.beta1 * m + (M(1) - k.beta1) * grad;
  const M v_new = k.beta2 * v + (M(1) - k.beta2) * grad * grad;
  m = m_new;
  v = v_new;
  const M denom = sqrt(v_new) * k.inv_sqrt_bias2 + k.eps;
  p = store<P>(M(load(p)) * k.decay - k.step_size * m_new / denom);
}

// N elements at a time as Packs (N > 1 when every tensor of the launch is 16-byte aligned;
// a chunk starts at a multiple of kChunk, so its packs are aligned too), then the tail
// of the chunk element by element. kRounded: every slot's param is also written, rounded,
// to its bf16 copy.
template <int N, class P, class G, class M, bool kRounded>
__global__ void adamw_multi_tensor_kernel(const AdamWSlot* slots, const AdamWBlock* blocks,
                                          AdamWCoefficients<M> k) {
  const AdamWBlock work = blocks[blockIdx.x];
  const AdamWSlot slot = slots[work.slot];
  P* __restrict__ p = static_cast<P*>(slot.param);
  const G* __restrict__ g = static_cast<const G*>(slot.grad);
  M* __restrict__ m = static_cast<M*>(slot.exp_avg);
  M* __restrict__ v = static_cast<M*>(slot.exp_avg_sq);
  const int64_t begin = int64_t(work.chunk) * kChunk;
  const int64_t end = min(slot.numel, begin + kChunk);
  const int64_t packs = (end - begin) / N;
  for (int64_t q = threadIdx.x; q < packs; q += blockDim.x) {
    const int64_t i = begin + q * N;
    Pack<P, N> pp = *reinterpret_cast<const Pack<P, N>*>(p + i);
    const Pack<G, N> gp = *reinterpret_cast<const Pack<G, N>*>(g + i);
    Pack<M, N> mp = *reinterpret_cast<const Pack<M, N>*>(m + i);
    Pack<M, N> vp = *reinterpret_cast<const Pack<M, N>*>(v + i);
#pragma unroll
    for (int e = 0; e < N; ++e) adamw_update(pp.v[e], gp.v[e], mp.v[e], vp.v[e], k);
    *reinterpret_cast<Pack<M, N>*>(m + i) = mp;
    *reinterpret_cast<Pack<M, N>*>(v + i) = vp;
    *reinterpret_cast<Pack<P, N>*>(p + i) = pp;
    if constexpr (kRounded) {
      Pack<bf16, N> rp;
#pragma unroll
      for (int e = 0; e < N; ++e) rp.v[e] = store<bf16>(load(pp.v[e]));
      *reinterpret_cast<Pack<bf16, N>*>(slot.rounded + i) = rp;
    }
  }
  for (int64_t i = begin + packs * N + threadIdx.x; i < end; i += blockDim.x) {
    adamw_update(p[i], g[i], m[i], v[i], k);
    if constexpr (kRounded) slot.rounded[i] = store<bf16>(load(p[i]));
  }
}

// Uploads the (slot, chunk) table (the slots, then the blocks, 8-byte aligned) into a byte
// tensor on `device`, in stream order, as launch_adamw does (a copy from pageable memory
// has read it when cudaMemcpyAsync returns); the tensor's memory goes back to the pool in
// stream order.
template <class Slot>
Tensor upload_chunk_table(const std::vector<Slot>& slots, const std::vector<AdamWBlock>& blocks,
                          Device device, cudaStream_t stream) {
  const size_t slot_bytes = slots.size() * sizeof(Slot);
  const size_t block_bytes = blocks.size() * sizeof(AdamWBlock);
  std::vector<char> host(slot_bytes + block_bytes);
  std::memcpy(host.data(), slots.data(), slot_bytes);
  std::memcpy(host.data() + slot_bytes, blocks.data(), block_bytes);
  Tensor table = Tensor::empty({int64_t(host.size())}, DType::U8, device);
  HAM_CUDA_CHECK(cudaMemcpyAsync(table.raw_data(), host.data(), host.size(),
                                 cudaMemcpyHostToDevice, stream));
  return table;
}

// Entry i is (params[i], grads[i], exp_avg[i], exp_avg_sq[i], rounded[i] where `rounded` is
// not empty); the lists are checked.
template <class P, class G, class M>
void launch_adamw(const std::vector<Tensor>& params, const std::vector<Tensor>& grads,
                  const std::vector<Tensor>& exp_avg, const std::vector<Tensor>& exp_avg_sq,
                  const std::vector<Tensor>& rounded, const AdamWHyper& h) {
  std::vector<AdamWSlot> slots;
  std::vector<AdamWBlock> blocks;
  for (size_t i = 0; i < params.size(); ++i) {
    const int64_t n = params[i].numel();
    if (n == 0) continue;
    const int64_t chunks = (n + kChunk - 1) / kChunk;
    HAM_CHECK(chunks < (int64_t(1) << 31) && slots.size() < (size_t(1) << 31),
              "adamw_step: too many chunks for one launch");
    for (int64_t c = 0; c < chunks; ++c) blocks.push_back({int32_t(slots.size()), int32_t(c)});
    bf16* copy = rounded.empty() ? nullptr : static_cast<bf16*>(rounded[i].raw_data());
    slots.push_back({params[i].raw_data(), grads[i].raw_data(), exp_avg[i].raw_data(),
                     exp_avg_sq[i].raw_data(), copy, n});
  }
  if (blocks.empty()) return;
  const cudaStream_t stream = launch_stream();
  const Tensor table = upload_chunk_table(slots, blocks, params.front().device(), stream);
  const auto* device_slots = static_cast<const AdamWSlot*>(table.raw_data());
  const auto* device_blocks = reinterpret_cast<const AdamWBlock*>(
      static_cast<const char*>(table.raw_data()) + slots.size() * sizeof(AdamWSlot));

  const double bias1 = 1.0 - std::pow(h.beta1, double(h.step));
  const double bias2 = 1.0 - std::pow(h.beta2, double(h.step));
  const AdamWCoefficients<M> k{M(1.0 - h.lr * h.weight_decay), M(h.beta1),       M(h.beta2),
                               M(h.lr / bias1),                M(1.0 / std::sqrt(bias2)),
                               M(h.eps),                       M(h.grad_scale)};
  bool aligned = true;
  for (const AdamWSlot& slot : slots) {
    aligned = aligned && aligned_16(slot.param) && aligned_16(slot.grad) &&
              aligned_16(slot.exp_avg) && aligned_16(slot.exp_avg_sq) &&
              (!slot.rounded || aligned_16(slot.rounded));
  }
  constexpr int N = kPackWidth<M>;  // 4 f32 moments (16 bytes), 2 f64
  auto launch = [&]<bool kRounded>() {
    if (aligned) {
      HAM_LAUNCH(unsigned(blocks.size()), kThreads, 0, stream,
                 adamw_multi_tensor_kernel<N, P, G, M, kRounded>)(device_slots, device_blocks, k);
    } else {
      HAM_LAUNCH(unsigned(blocks.size()), kThreads, 0, stream,
                 adamw_multi_tensor_kernel<1, P, G, M, kRounded>)(device_slots, device_blocks, k);
    }
  };
  if constexpr (std::is_same_v<P, float>) {
    if (!rounded.empty()) {
      launch.template operator()<true>();
      HAM_CUDA_CHECK_LAUNCH();
      return;
    }
  }
  HAM_CHECK(rounded.empty(), "adamw_step_multi: rounded copies are bf16 copies of f32 params");
  launch.template operator()<false>();
  HAM_CUDA_CHECK_LAUNCH();
}

// Calls fn.template operator()<P, G, M>() for the supported dtype combinations.
template <class Fn>
void dispatch_adamw_dtypes(const char* op, DType param, DType grad, DType moments, Fn&& fn) {
  auto is = [&](DType p, DType g, DType m) { return param == p && grad == g && moments == m; };
  if (is(DType::F32, DType::F32, DType::F32)) return fn.template operator()<float, float, float>();
  if (is(DType::F32, DType::BF16, DType::F32)) return fn.template operator()<float, bf16, float>();
  if (is(DType::BF16, DType::BF16, DType::F32)) return fn.template operator()<bf16, bf16, float>();
  if (is(DType::BF16, DType::F32, DType::F32)) return fn.template operator()<bf16, float, float>();
  if (is(DType::F64, DType::F64, DType::F64)) return fn.template operator()<double, double, double>();
  HAM_FAIL(op, ": CUDA kernel takes param/grad/moments as f32/f32/f32, f32/bf16/f32, ",
           "bf16/bf16/f32, bf16/f32/f32 or f64/f64/f64; got ", dtype_name(param), "/",
           dtype_name(grad), "/", dtype_name(moments));
}

// Updates every entry with one launch; the lists share dtypes and one CUDA device
// (checked by the callers: ops::adamw_step_multi, adamw_step_multi_tensor).
void launch_adamw_lists(const char* op, const std::vector<Tensor>& params,
                        const std::vector<Tensor>& grads, const std::vector<Tensor>& exp_avg,
                        const std::vector<Tensor>& exp_avg_sq, const std::vector<Tensor>& rounded,
                        const AdamWHyper& hyper) {
  if (params.empty()) return;
  HAM_CHECK(params.front().device().is_cuda(), op, ": tensors are on ",
            params.front().device().str(), ", not a GPU");
  use_device_of(params.front());
  dispatch_adamw_dtypes(op, params.front().dtype(), grads.front().dtype(),
                        exp_avg.front().dtype(), [&]<class P, class G, class M>() {
                          launch_adamw<P, G, M>(params, grads, exp_avg, exp_avg_sq, rounded,
                                                hyper);
                        });
}

void adamw_step(Tensor& param, const Tensor& grad, Tensor& exp_avg, Tensor& exp_avg_sq,
                const AdamWHyper& hyper) {
  adamw_step_multi_tensor({AdamWTensors{param, grad, exp_avg, exp_avg_sq}}, hyper);
}

// The kernel of ops::adamw_step_multi (which has checked the lists).
void adamw_step_multi(std::vector<Tensor>& params, const std::vector<Tensor>& grads,
                      std::vector<Tensor>& exp_avg, std::vector<Tensor>& exp_avg_sq,
                      std::vector<Tensor>& rounded, const AdamWHyper& hyper) {
  launch_adamw_lists("adamw_step_multi", params, grads, exp_avg, exp_avg_sq, rounded, hyper);
}

template <class T>
struct ReadSquare {
  const T* x;
  __device__ double operator()(int64_t, int64_t l, int64_t) const {
    const double v = double(load(x[l]));
    return v * v;
  }
};

double squared_norm(const Tensor& x) {
  const int64_t n = x.numel();
  if (n == 0) return 0.0;
  use_device_of(x);
  Tensor total = Tensor::empty({1}, DType::F64, x.device());
  dispatch_floating("squared_norm", x.dtype(), [&]<class T>() {
    reduce_middle<double, ReduceForms::Rows>(x.device(), 1, n, 1, ReadSquare<T>{ptr<const T>(x)},
                                             StoreScaled<double, double>{ptr<double>(total), 1.0});
  });
  double host = 0;
  HAM_CUDA_CHECK(cudaMemcpyAsync(&host, total.raw_data(), sizeof host, cudaMemcpyDeviceToHost,
                                 launch_stream()));
  HAM_CUDA_CHECK(cudaStreamSynchronize(launch_stream()));
  return host;
}

struct NormSlot {
  const void* x;
  int64_t numel;
};

// squared_norms: one block a chunk of kChunk elements of one tensor (the AdamW table's
// layout), its sum of squares in f64 into partial[blockIdx.x]; the host adds each tensor's
// chunks in order, so the result never depends on scheduling.
template <class T>
__global__ void squared_norm_chunks_kernel(const NormSlot* slots, const AdamWBlock* blocks,
                                           double* partial) {
  using Block = RowGroup<false>;
  const AdamWBlock work = blocks[blockIdx.x];
  const NormSlot slot = slots[work.slot];
  const T* __restrict__ x = static_cast<const T*>(slot.x);
  const int64_t begin = int64_t(work.chunk) * kChunk;
  const int64_t end = min(slot.numel, begin + kChunk);
  double acc = 0;
  for (int64_t i = begin + Block::lane(); i < end; i += Block::size()) {
    const double v = double(load(x[i]));
    acc += v * v;
  }
  acc = Block::sum(acc);
  if (Block::lane() == 0) partial[blockIdx.x] = acc;
}

// Every tensor's chunks, one launch for each dtype present, then one copy of all the
// partial sums to the host: one wait for the GPU in all.
std::vector<double> squared_norms(const std::vector<Tensor>& xs) {
  std::vector<double> norms(xs.size(), 0.0);
  std::vector<int64_t> place(xs.size(), 0), chunks(xs.size(), 0);  // in the partial sums
  int64_t total = 0;
  for (size_t i = 0; i < xs.size(); ++i) {
    chunks[i] = (xs[i].numel() + kChunk - 1) / kChunk;
    total += chunks[i];
  }
  if (total == 0) return norms;
  HAM_CHECK(total < (int64_t(1) << 31), "squared_norms: ", total, " chunks exceed one launch");
  const Device device = xs.front().device();
  use_device_of(xs.front());
  const cudaStream_t stream = launch_stream();
  Tensor partial = Tensor::empty({total}, DType::F64, device);
  int64_t written = 0;
  for (const DType dtype : {DType::F32, DType::BF16, DType::F64}) {
    std::vector<NormSlot> slots;
    std::vector<AdamWBlock> blocks;
    for (size_t i = 0; i < xs.size(); ++i) {
      if (xs[i].dtype() != dtype || chunks[i] == 0) continue;
      place[i] = written + int64_t(blocks.size());
      for (int64_t c = 0; c < chunks[i]; ++c) {
        blocks.push_back({int32_t(slots.size()), int32_t(c)});
      }
      slots.push_back({xs[i].raw_data(), xs[i].numel()});
    }
    if (blocks.empty()) continue;
    const Tensor table = upload_chunk_table(slots, blocks, device, stream);
    const auto* device_slots = static_cast<const NormSlot*>(table.raw_data());
    const auto* device_blocks = reinterpret_cast<const AdamWBlock*>(
        static_cast<const char*>(table.raw_data()) + slots.size() * sizeof(NormSlot));
    dispatch_floating("squared_norms", dtype, [&]<class T>() {
      HAM_LAUNCH(unsigned(blocks.size()), kThreads, 0, stream, squared_norm_chunks_kernel<T>)(
          device_slots, device_blocks, ptr<double>(partial) + written);
    });
    HAM_CUDA_CHECK_LAUNCH();
    written += int64_t(blocks.size());
  }
  HAM_CHECK(written == total, "squared_norms: ", total - written,
            " chunks of a dtype the kernel does not take");
  std::vector<double> host(static_cast<size_t>(total));
  HAM_CUDA_CHECK(cudaMemcpyAsync(host.data(), partial.raw_data(), host.size() * sizeof(double),
                                 cudaMemcpyDeviceToHost, stream));
  HAM_CUDA_CHECK(cudaStreamSynchronize(stream));
  for (size_t i = 0; i < xs.size(); ++i) {
    for (int64_t c = 0; c < chunks[i]; ++c) norms[i] += host[size_t(place[i] + c)];
  }
  return norms;
}

const bool registered = [] {
  adamw_step_kernels().register_kernel(DeviceKind::CUDA, &adamw_step);
  adamw_step_multi_kernels().register_kernel(DeviceKind::CUDA, &adamw_step_multi);
  squared_norm_kernels().register_kernel(DeviceKind::CUDA, &squared_norm);
  squared_norms_kernels().register_kernel(DeviceKind::CUDA, &squared_norms);
  return true;
}();

}  // namespace

void adamw_step_multi_tensor(const std::vector<AdamWTensors>& list, const AdamWHyper& hyper) {
  if (list.empty()) return;
  const AdamWTensors& first = list.front();
  HAM_CHECK(hyper.step >= 1, "adamw_step: step must be >= 1, got ", hyper.step);
  for (size_t i = 0; i < list.size(); ++i) {
    const AdamWTensors& t = list[i];
    for (const Tensor* other : {&t.grad, &t.exp_avg, &t.exp_avg_sq}) {
      HAM_CHECK(other->shape() == t.param.shape(), "adamw_step: entry ", i, ": ", other->str(),
                " does not match param ", t.param.str());
      HAM_CHECK(other->device() == first.param.device(), "adamw_step: entry ", i, " has ",
                other->str(), ", the first param is on ", first.param.device().str());
    }
    HAM_CHECK(t.param.device() == first.param.device() && t.param.dtype() == first.param.dtype() &&
                  t.grad.dtype() == first.grad.dtype() &&
                  t.exp_avg.dtype() == first.exp_avg.dtype() &&
                  t.exp_avg_sq.dtype() == first.exp_avg.dtype(),
              "adamw_step: entry ", i, " (param ", t.param.str(), ", grad ", t.grad.str(),
              ", moments ", t.exp_avg.str(), ") differs in dtype or device from entry 0 (param ",
              first.param.str(), ", grad ", first.grad.str(), ", moments ", first.exp_avg.str(),
              ")");
  }
  std::vector<Tensor> params, grads, exp_avg, exp_avg_sq;
  for (const AdamWTensors& t : list) {
    params.push_back(t.param);
    grads.push_back(t.grad);
    exp_avg.push_back(t.exp_avg);
    exp_avg_sq.push_back(t.exp_avg_sq);
  }
  launch_adamw_lists("adamw_step", params, grads, exp_avg, exp_avg_sq, {}, hyper);
}

}  // namespace ham::cuda
