#pragma once
// A zero-initialised, 64-byte aligned array: parameters, gradients, optimizer
// moments and activations all live in these, so a tensor can be handed to the
// wire or to storage straight from memory.

#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>

namespace archipelago {

template <class T>
class aligned_buffer {
 public:
  static constexpr std::size_t alignment = 64;

  aligned_buffer() = default;
  explicit aligned_buffer(std::size_t count) { resize(count); }

  aligned_buffer(const aligned_buffer& other) : aligned_buffer(other.size_) {
    if (size_) std::memcpy(data_.get(), other.data_.get(), size_ * sizeof(T));
  }
  aligned_buffer& operator=(const aligned_buffer& other) {
    if (this != &other) {
      resize(other.size_);
      if (size_) std::memcpy(data_.get(), other.data_.get(), size_ * sizeof(T));
    }
    return *this;
  }
  aligned_buffer(aligned_buffer&&) noexcept = default;
  aligned_buffer& operator=(aligned_buffer&&) noexcept = default;

  /// Reallocates to exactly `count` zeroed elements (contents are not kept).
  void resize(std::size_t count) {
    if (count == size_) {
      zero();
      return;
    }
    data_.reset();
    size_ = count;
    if (count == 0) return;
    const std::size_t bytes = (count * sizeof(T) + alignment - 1) / alignment * alignment;
    void* p = std::aligned_alloc(alignment, bytes);
    if (p == nullptr) throw std::bad_alloc();
    std::memset(p, 0, bytes);
    data_.reset(static_cast<T*>(p));
  }

  void zero() {
    if (size_) std::memset(data_.get(), 0, size_ * sizeof(T));
  }

  T* data() { return data_.get(); }
  const T* data() const { return data_.get(); }
  std::size_t size() const { return size_; }
  T& operator[](std::size_t i) { return data_.get()[i]; }
  const T& operator[](std::size_t i) const { return data_.get()[i]; }

 private:
  struct free_deleter {
    void operator()(T* p) const { std::free(p); }
  };
  std::unique_ptr<T, free_deleter> data_;
  std::size_t size_ = 0;
};

}  // namespace archipelago
