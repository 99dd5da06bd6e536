#pragma once
// Tensor: a shape, a dtype and a device over shared row-major contiguous storage.
// reshape() and leading-dim slices are views (they share storage); everything else that
// changes layout is an explicit copy. core/ knows nothing of autograd: a tensor only
// carries an opaque slot that autograd/ fills with its own metadata.
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/dtype.h"
#include "core/error.h"

namespace ham {

using Shape = std::vector<int64_t>;

std::string shape_str(const Shape& shape);  // "[2, 3, 4]"
int64_t shape_numel(const Shape& shape);    // throws on negative dims or overflow

// Owns one allocation on one device.
class Storage {
 public:
  Storage(size_t nbytes, Device device);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return data_; }
  size_t nbytes() const { return nbytes_; }
  Device device() const { return device_; }

 private:
  void* data_ = nullptr;
  size_t nbytes_ = 0;
  Device device_;
};

// Filled in by autograd/; core only keeps it alive.
struct AutogradMetaBase {
  virtual ~AutogradMetaBase() = default;
};

struct TensorImpl {
  std::shared_ptr<Storage> storage;
  size_t offset_bytes = 0;
  Shape shape;
  DType dtype = DType::F32;
  std::shared_ptr<AutogradMetaBase> autograd_meta;
};

class Tensor {
 public:
  Tensor() = default;  // undefined: defined() is false

  // Factories. Data is uninitialised for empty().
  static Tensor empty(const Shape& shape, DType dtype = DType::F32, Device device = Device::cpu());
  static Tensor zeros(const Shape& shape, DType dtype = DType::F32, Device device = Device::cpu());
  static Tensor full(const Shape& shape, double value, DType dtype = DType::F32,
                     Device device = Device::cpu());
  static Tensor scalar(double value, DType dtype = DType::F32, Device device = Device::cpu());
  // Copies host values into a new tensor of dtype_of<T>() (then moved to `device`).
  template <class T>
  static Tensor from_vector(const std::vector<T>& values, const Shape& shape,
                            Device device = Device::cpu());
  // Evenly spaced start, start+1, ... (for tests and positions).
  static Tensor arange(int64_t n, DType dtype = DType::I64, Device device = Device::cpu());

  bool defined() const { return impl_ != nullptr; }
  const Shape& shape() const;
  int64_t dim() const { return int64_t(shape().size()); }
  int64_t size(int64_t d) const;  // negative d counts from the end
  int64_t numel() const { return shape_numel(shape()); }
  DType dtype() const;
  Device device() const;
  size_t nbytes() const { return size_t(numel()) * dtype_size(dtype()); }
  std::string str() const;  // "f32[2, 3] on cpu"

  void* raw_data() const;
  template <class T>
  T* data() const {
    HAM_CHECK(dtype_of<T>() == dtype(), "tensor data<", dtype_name(dtype_of<T>()),
              ">() called on a ", dtype_name(dtype()), " tensor");
    return static_cast<T*>(raw_data());
  }

  // Views (share storage).
  Tensor reshape(Shape shape) const;           // one dim may be -1
  Tensor slice(int64_t begin, int64_t end) const;  // rows [begin, end) of dim 0
  Tensor select(int64_t index) const;          // row `index` of dim 0, dim 0 removed
  Tensor flatten_to_2d() const;                // [prod(leading), last]

  // Copies.
  Tensor clone() const;
  Tensor to(DType dtype) const;    // same tensor when already that dtype; ops::cast on any device
  Tensor to(Device device) const;  // same tensor when already there
  void copy_(const Tensor& src);   // same shape and dtype, any devices
  void zero_();
  void fill_(double value);

  // Host readback (any device, any dtype converted to T).
  template <class T>
  std::vector<T> to_vector() const;
  double item() const;  // single-element tensors

  bool shares_storage_with(const Tensor& other) const;
  TensorImpl* impl() const { return impl_.get(); }
  std::shared_ptr<AutogradMetaBase>& autograd_meta() const;

 private:
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<TensorImpl> impl_;
};

// Throws "<op>: <what> shapes [..] and [..] ..." when the shapes differ.
void check_same_shape(const char* op, const Tensor& a, const Tensor& b);
void check_dtype(const char* op, const Tensor& t, DType expected, const char* arg);
void check_same_device(const char* op, const Tensor& a, const Tensor& b);

}  // namespace ham
