#include "core/tensor.h"

#include <cstdlib>
#include <cstring>

namespace mlaserve {

std::string shape_str(const Shape& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

int64_t shape_numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

Tensor Tensor::empty(Shape shape, DType dtype) {
  for (int64_t d : shape) MLA_CHECK(d >= 0, "negative dimension in shape {}", shape_str(shape));
  size_t bytes = size_t(shape_numel(shape)) * dtype_size(dtype);
  size_t rounded = (bytes + 63) / 64 * 64;
  void* p = rounded ? std::aligned_alloc(64, rounded) : nullptr;
  MLA_CHECK(p || !rounded, "out of host memory allocating {} bytes", bytes);
  Tensor t;
  t.data_ = p;
  t.shape_ = std::move(shape);
  t.dtype_ = dtype;
  t.device_ = Device::CPU;
  t.owner_ = std::shared_ptr<void>(p, [](void* q) { std::free(q); });
  return t;
}

Tensor Tensor::zeros(Shape shape, DType dtype) {
  Tensor t = empty(std::move(shape), dtype);
  if (t.nbytes()) std::memset(t.data_, 0, t.nbytes());
  return t;
}

Tensor Tensor::wrap(void* data, Shape shape, DType dtype, Device device, std::shared_ptr<void> owner) {
  Tensor t;
  t.data_ = data;
  t.shape_ = std::move(shape);
  t.dtype_ = dtype;
  t.device_ = device;
  t.owner_ = std::move(owner);
  return t;
}

Tensor Tensor::view(Shape shape) const {
  MLA_CHECK(shape_numel(shape) == numel(), "cannot view {} as {}", shape_str(shape_), shape_str(shape));
  Tensor t = *this;
  t.shape_ = std::move(shape);
  return t;
}

Tensor Tensor::slice_rows(int64_t begin, int64_t end) const {
  MLA_CHECK(ndim() >= 1 && 0 <= begin && begin <= end && end <= shape_[0],
            "row slice [{}, {}) out of range for {}", begin, end, shape_str(shape_));
  Tensor t = *this;
  size_t row_bytes = nbytes() / size_t(shape_[0] ? shape_[0] : 1);
  t.data_ = static_cast<char*>(data_) + size_t(begin) * row_bytes;
  t.shape_[0] = end - begin;
  return t;
}

}  // namespace mlaserve
