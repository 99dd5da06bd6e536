#include "core/dtype.h"

#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>

#include "core/error.h"

namespace ham {

size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::F32: return 4;
    case DType::F64: return 8;
    case DType::BF16: return 2;
    case DType::I32: return 4;
    case DType::I64: return 8;
    case DType::U8: return 1;
  }
  HAM_FAIL("dtype_size: invalid dtype ", int(dtype));
}

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::F32: return "f32";
    case DType::F64: return "f64";
    case DType::BF16: return "bf16";
    case DType::I32: return "i32";
    case DType::I64: return "i64";
    case DType::U8: return "u8";
  }
  return "invalid";
}

DType dtype_from_name(const std::string& name) {
  for (DType d : {DType::F32, DType::F64, DType::BF16, DType::I32, DType::I64, DType::U8}) {
    if (name == dtype_name(d)) return d;
  }
  HAM_FAIL("unknown dtype '", name, "' (expected f32, f64, bf16, i32, i64 or u8)");
}

bool is_floating(DType dtype) {
  return dtype == DType::F32 || dtype == DType::F64 || dtype == DType::BF16;
}

void convert_elements(const void* src, DType src_dtype, void* dst, DType dst_dtype, int64_t n) {
  if (n == 0) return;  // empty tensors may have null data, which memcpy must not get
  if (src_dtype == dst_dtype) {
    std::memcpy(dst, src, size_t(n) * dtype_size(src_dtype));
    return;
  }
  visit_dtype(src_dtype, [&]<class S>() {
    visit_dtype(dst_dtype, [&]<class D>() {
      const S* s = static_cast<const S*>(src);
      D* d = static_cast<D*>(dst);
      for (int64_t i = 0; i < n; ++i) {
        if constexpr (std::is_same_v<S, BFloat16> && std::is_same_v<D, BFloat16>) {
          d[i] = s[i];
        } else if constexpr (std::is_same_v<S, BFloat16>) {
          d[i] = static_cast<D>(bf16_to_float(s[i]));
        } else if constexpr (std::is_same_v<D, BFloat16>) {
          d[i] = float_to_bf16(float(s[i]));
        } else {
          d[i] = static_cast<D>(s[i]);
        }
      }
    });
  });
}

}  // namespace ham
