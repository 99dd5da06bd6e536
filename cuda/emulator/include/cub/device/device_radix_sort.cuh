#pragma once
// cub::DeviceRadixSort::SortPairs for the SIMT emulator: a stable sort of (key, value) pairs
// by the key bits [begin_bit, end_bit), on the host, with cub's two-call protocol (a null
// scratch pointer asks for the scratch size). Keys are unsigned-ordered as cub orders them
// (two's complement keys with the sign bit flipped).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <type_traits>
#include <vector>

namespace cub {

struct DeviceRadixSort {
  template <class Key, class Value>
  static cudaError_t SortPairs(void* scratch, size_t& scratch_bytes, const Key* keys_in,
                               Key* keys_out, const Value* values_in, Value* values_out,
                               int count, int begin_bit = 0, int end_bit = sizeof(Key) * 8,
                               cudaStream_t stream = nullptr) {
    if (!scratch) {
      scratch_bytes = size_t(count) * (sizeof(Key) + sizeof(Value)) + 256;
      return cudaSuccess;
    }
    if (count < 0 || begin_bit < 0 || end_bit > int(sizeof(Key) * 8) || begin_bit > end_bit) {
      return cudaErrorInvalidValue;
    }
    // Runs on `stream` (later, in the emulator's held stream orders).
    return ham::cuda::emulator::issue(stream, [=] {
      using Bits = std::make_unsigned_t<Key>;
      auto digits = [&](Key key) -> Bits {
        Bits bits = Bits(key);
        if constexpr (std::is_signed_v<Key>) bits ^= Bits(Bits(1) << (sizeof(Key) * 8 - 1));
        const int width = end_bit - begin_bit;
        const Bits field =
            width >= int(sizeof(Key) * 8) ? Bits(~Bits(0)) : Bits((Bits(1) << width) - 1);
        return Bits((bits >> begin_bit) & field);
      };
      std::vector<int> order(static_cast<size_t>(count));
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(),
                       [&](int a, int b) { return digits(keys_in[a]) < digits(keys_in[b]); });
      std::vector<Key> keys(static_cast<size_t>(count));
      std::vector<Value> values(static_cast<size_t>(count));
      for (int i = 0; i < count; ++i) {
        keys[size_t(i)] = keys_in[order[size_t(i)]];
        values[size_t(i)] = values_in[order[size_t(i)]];
      }
      std::copy(keys.begin(), keys.end(), keys_out);
      std::copy(values.begin(), values.end(), values_out);
    });
  }
};

}  // namespace cub
