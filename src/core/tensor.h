#pragma once
// A contiguous, row-major n-d array on some device. Storage is shared and
// reference counted; views (reshape, row slices) alias it.
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"

namespace mlaserve {

enum class Device : uint8_t { CPU, CUDA };

using Shape = std::vector<int64_t>;

std::string shape_str(const Shape& s);
int64_t shape_numel(const Shape& s);

class Tensor {
 public:
  Tensor() = default;

  // Host allocation, 64-byte aligned, uninitialized.
  static Tensor empty(Shape shape, DType dtype);
  static Tensor zeros(Shape shape, DType dtype);
  // Wraps memory owned elsewhere; `owner` keeps it alive (may be null when
  // the caller guarantees the lifetime, e.g. an mmap held by a checkpoint).
  static Tensor wrap(void* data, Shape shape, DType dtype, Device device,
                     std::shared_ptr<void> owner = nullptr);

  bool defined() const { return data_ != nullptr || (numel() == 0 && !shape_.empty()); }
  void* raw() const { return data_; }
  template <typename T>
  T* data() const { return static_cast<T*>(data_); }

  const Shape& shape() const { return shape_; }
  int ndim() const { return int(shape_.size()); }
  int64_t dim(int i) const { return shape_.at(i < 0 ? shape_.size() + i : i); }
  int64_t numel() const { return shape_numel(shape_); }
  size_t nbytes() const { return size_t(numel()) * dtype_size(dtype_); }
  DType dtype() const { return dtype_; }
  Device device() const { return device_; }
  const std::shared_ptr<void>& owner() const { return owner_; }

  // Same storage, new shape of equal element count.
  Tensor view(Shape shape) const;
  // Rows [begin, end) along the first dimension.
  Tensor slice_rows(int64_t begin, int64_t end) const;

 private:
  void* data_ = nullptr;
  Shape shape_;
  DType dtype_ = DType::F32;
  Device device_ = Device::CPU;
  std::shared_ptr<void> owner_;
};

}  // namespace mlaserve
