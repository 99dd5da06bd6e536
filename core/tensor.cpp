#include "core/tensor.h"

#include <cstdint>
#include <cstring>
#include <limits>
#include <string>

#include "core/ops/cast.h"

namespace ham {

std::string shape_str(const Shape& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) out += ", ";
    out += std::to_string(shape[i]);
  }
  return out + "]";
}

int64_t shape_numel(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    HAM_CHECK(d >= 0, "invalid shape ", shape_str(shape), ": negative dimension");
    if (d != 0 && n > std::numeric_limits<int64_t>::max() / d) {
      HAM_FAIL("invalid shape ", shape_str(shape), ": element count overflows int64");
    }
    n *= d;
  }
  return n;
}

Storage::Storage(size_t nbytes, Device device) : nbytes_(nbytes), device_(device) {
  data_ = device_backend(device).allocate(nbytes, device);
}

Storage::~Storage() {
  if (data_) device_backend(device_).deallocate(data_, nbytes_, device_);
}

Tensor Tensor::empty(const Shape& shape, DType dtype, Device device) {
  auto impl = std::make_shared<TensorImpl>();
  impl->shape = shape;
  impl->dtype = dtype;
  size_t nbytes = size_t(shape_numel(shape)) * dtype_size(dtype);
  impl->storage = std::make_shared<Storage>(nbytes, device);
  return Tensor(std::move(impl));
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, Device device) {
  Tensor t = empty(shape, dtype, device);
  t.zero_();
  return t;
}

Tensor Tensor::full(const Shape& shape, double value, DType dtype, Device device) {
  Tensor t = empty(shape, dtype, device);
  t.fill_(value);
  return t;
}

Tensor Tensor::scalar(double value, DType dtype, Device device) {
  return full({}, value, dtype, device);
}

namespace {

template <class T>
T convert_from_double(double v) {
  if constexpr (std::is_same_v<T, BFloat16>) {
    return float_to_bf16(float(v));
  } else {
    return static_cast<T>(v);
  }
}

}  // namespace

template <class T>
Tensor Tensor::from_vector(const std::vector<T>& values, const Shape& shape, Device device) {
  HAM_CHECK(int64_t(values.size()) == shape_numel(shape), "Tensor::from_vector: ", values.size(),
            " values do not fill shape ", shape_str(shape));
  Tensor t = empty(shape, dtype_of<T>(), device);
  if (!values.empty()) {
    device_backend(device).copy_from_host(t.raw_data(), values.data(), t.nbytes(), device);
  }
  return t;
}

template Tensor Tensor::from_vector(const std::vector<float>&, const Shape&, Device);
template Tensor Tensor::from_vector(const std::vector<double>&, const Shape&, Device);
template Tensor Tensor::from_vector(const std::vector<BFloat16>&, const Shape&, Device);
template Tensor Tensor::from_vector(const std::vector<int32_t>&, const Shape&, Device);
template Tensor Tensor::from_vector(const std::vector<int64_t>&, const Shape&, Device);
template Tensor Tensor::from_vector(const std::vector<uint8_t>&, const Shape&, Device);

Tensor Tensor::arange(int64_t n, DType dtype, Device device) {
  std::vector<double> values(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) values[size_t(i)] = double(i);
  return Tensor::from_vector(values, {n}).to(dtype).to(device);
}

const Shape& Tensor::shape() const {
  HAM_CHECK(impl_, "use of an undefined tensor");
  return impl_->shape;
}

int64_t Tensor::size(int64_t d) const {
  int64_t n = dim();
  int64_t i = d < 0 ? d + n : d;
  HAM_CHECK(i >= 0 && i < n, "size(", d, ") out of range for shape ", shape_str(shape()));
  return shape()[size_t(i)];
}

DType Tensor::dtype() const {
  HAM_CHECK(impl_, "use of an undefined tensor");
  return impl_->dtype;
}

Device Tensor::device() const {
  HAM_CHECK(impl_, "use of an undefined tensor");
  return impl_->storage->device();
}

std::string Tensor::str() const {
  if (!impl_) return "undefined tensor";
  return std::string(dtype_name(dtype())) + shape_str(shape()) + " on " + device().str();
}

void* Tensor::raw_data() const {
  HAM_CHECK(impl_, "use of an undefined tensor");
  return static_cast<char*>(impl_->storage->data()) + impl_->offset_bytes;
}

Tensor Tensor::reshape(Shape new_shape) const {
  int64_t known = 1;
  int infer = -1;
  for (size_t i = 0; i < new_shape.size(); ++i) {
    if (new_shape[i] == -1) {
      HAM_CHECK(infer < 0, "reshape ", shape_str(shape()), " -> ", shape_str(new_shape),
                ": more than one -1");
      infer = int(i);
    } else {
      HAM_CHECK(new_shape[i] >= 0, "reshape ", shape_str(shape()), " -> ", shape_str(new_shape),
                ": negative dimension");
      known *= new_shape[i];
    }
  }
  if (infer >= 0) {
    HAM_CHECK(known != 0 && numel() % known == 0, "reshape ", shape_str(shape()), " -> ",
              shape_str(new_shape), ": cannot infer -1");
    new_shape[size_t(infer)] = numel() / known;
  }
  HAM_CHECK(shape_numel(new_shape) == numel(), "reshape ", shape_str(shape()), " -> ",
            shape_str(new_shape), ": element counts differ");
  auto impl = std::make_shared<TensorImpl>(*impl_);
  impl->shape = std::move(new_shape);
  impl->autograd_meta.reset();
  return Tensor(std::move(impl));
}

Tensor Tensor::slice(int64_t begin, int64_t end) const {
  HAM_CHECK(dim() >= 1, "slice on a 0-d tensor");
  int64_t rows = shape()[0];
  HAM_CHECK(0 <= begin && begin <= end && end <= rows, "slice [", begin, ", ", end,
            ") out of range for shape ", shape_str(shape()));
  int64_t row_elems = rows == 0 ? 0 : numel() / rows;
  auto impl = std::make_shared<TensorImpl>(*impl_);
  impl->shape[0] = end - begin;
  impl->offset_bytes += size_t(begin * row_elems) * dtype_size(dtype());
  impl->autograd_meta.reset();
  return Tensor(std::move(impl));
}

Tensor Tensor::select(int64_t index) const {
  HAM_CHECK(dim() >= 1, "select on a 0-d tensor");
  HAM_CHECK(index >= 0 && index < shape()[0], "select(", index, ") out of range for shape ",
            shape_str(shape()));
  Tensor row = slice(index, index + 1);
  Shape s(shape().begin() + 1, shape().end());
  return row.reshape(s);
}

Tensor Tensor::flatten_to_2d() const {
  HAM_CHECK(dim() >= 1, "flatten_to_2d on a 0-d tensor");
  int64_t last = shape().back();
  return reshape({last == 0 ? 0 : numel() / last, last});
}

Tensor Tensor::clone() const {
  Tensor out = empty(shape(), dtype(), device());
  out.copy_(*this);
  return out;
}

Tensor Tensor::to(DType target) const { return ops::cast(*this, target); }

Tensor Tensor::to(Device target) const {
  if (target == device()) return *this;
  Tensor out = empty(shape(), dtype(), target);
  out.copy_(*this);
  return out;
}

void Tensor::copy_(const Tensor& src) {
  check_same_shape("copy_", *this, src);
  HAM_CHECK(dtype() == src.dtype(), "copy_: dtype ", dtype_name(src.dtype()), " into ",
            dtype_name(dtype()));
  size_t n = nbytes();
  if (n == 0) return;
  Device dst_dev = device(), src_dev = src.device();
  if (dst_dev == src_dev) {
    device_backend(dst_dev).copy_within(raw_data(), src.raw_data(), n, dst_dev);
  } else if (src_dev.is_cpu()) {
    device_backend(dst_dev).copy_from_host(raw_data(), src.raw_data(), n, dst_dev);
  } else if (dst_dev.is_cpu()) {
    device_backend(src_dev).copy_to_host(raw_data(), src.raw_data(), n, src_dev);
  } else {
    Tensor staged = src.to(Device::cpu());
    copy_(staged);
  }
}

void Tensor::zero_() {
  device_backend(device()).memset_zero(raw_data(), nbytes(), device());
}

void Tensor::fill_(double value) {
  if (device().is_cpu()) {
    visit_dtype(dtype(), [&]<class T>() {
      T v = convert_from_double<T>(value);
      T* p = static_cast<T*>(raw_data());
      for (int64_t i = 0, n = numel(); i < n; ++i) p[i] = v;
    });
  } else {
    copy_(full(shape(), value, dtype(), Device::cpu()));
  }
}

template <class T>
std::vector<T> Tensor::to_vector() const {
  Tensor host = to(Device::cpu());
  std::vector<T> out(static_cast<size_t>(numel()));
  convert_elements(host.raw_data(), host.dtype(), out.data(), dtype_of<T>(), numel());
  return out;
}

template std::vector<float> Tensor::to_vector() const;
template std::vector<double> Tensor::to_vector() const;
template std::vector<int32_t> Tensor::to_vector() const;
template std::vector<int64_t> Tensor::to_vector() const;
template std::vector<uint8_t> Tensor::to_vector() const;
template std::vector<BFloat16> Tensor::to_vector() const;

double Tensor::item() const {
  HAM_CHECK(numel() == 1, "item() on a tensor of shape ", shape_str(shape()),
            " (needs exactly one element)");
  return to_vector<double>()[0];
}

bool Tensor::shares_storage_with(const Tensor& other) const {
  return impl_ && other.impl_ && impl_->storage == other.impl_->storage;
}

std::shared_ptr<AutogradMetaBase>& Tensor::autograd_meta() const {
  HAM_CHECK(impl_, "use of an undefined tensor");
  return impl_->autograd_meta;
}

void check_same_shape(const char* op, const Tensor& a, const Tensor& b) {
  HAM_CHECK(a.shape() == b.shape(), op, ": shape mismatch ", shape_str(a.shape()), " vs ",
            shape_str(b.shape()));
}

void check_dtype(const char* op, const Tensor& t, DType expected, const char* arg) {
  HAM_CHECK(t.dtype() == expected, op, ": ", arg, " must be ", dtype_name(expected), ", got ",
            dtype_name(t.dtype()), shape_str(t.shape()));
}

void check_same_device(const char* op, const Tensor& a, const Tensor& b) {
  HAM_CHECK(a.device() == b.device(), op, ": tensors on different devices (",
            a.device().str(), " and ", b.device().str(), ")");
}

}  // namespace ham
