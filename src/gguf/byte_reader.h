// A bounds-checked little-endian cursor over untrusted bytes. Every read checks the bytes that are
// really left first, so the GGUF parser above it cannot read out of bounds whatever a file says.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

#include "kvl/status.h"

namespace kvl::gguf_internal {

// GGUF is little-endian and values are copied straight out of the file.
static_assert(std::endian::native == std::endian::little, "kvl's GGUF reader needs a little-endian host");

class ByteReader {
 public:
  ByteReader(const uint8_t* data, size_t size) : data_(data), size_(size) {}

  size_t offset() const { return pos_; }
  size_t size() const { return size_; }
  size_t remaining() const { return size_ - pos_; }
  const uint8_t* current() const { return data_ + pos_; }

  // `what` names the field in the error ("tensor count"), the caller adds which key or tensor.
  template <typename T>
  Status Read(T* out, std::string_view what) {
    KVL_RETURN_IF_ERROR(Need(sizeof(T), what));
    std::memcpy(out, data_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return Status::Ok();
  }

  Status Skip(uint64_t n, std::string_view what) {
    KVL_RETURN_IF_ERROR(Need(n, what));
    pos_ += static_cast<size_t>(n);
    return Status::Ok();
  }

  // A GGUF string: u64 length, then that many bytes (no NUL). The view points into the buffer.
  Status ReadString(std::string_view* out, std::string_view what) {
    const size_t start = pos_;
    uint64_t length = 0;
    KVL_RETURN_IF_ERROR(Read(&length, what));
    if (length > remaining()) {
      const size_t left = remaining();
      pos_ = start;
      return DataLossError(std::string(what) + ": string length " + std::to_string(length) +
                           " at offset " + std::to_string(start) +
                           " runs past the end of the data (" + std::to_string(left) +
                           " bytes left)");
    }
    *out = std::string_view(reinterpret_cast<const char*>(data_ + pos_), static_cast<size_t>(length));
    pos_ += static_cast<size_t>(length);
    return Status::Ok();
  }

  Status Need(uint64_t n, std::string_view what) const {
    if (n <= remaining()) return Status::Ok();
    return DataLossError(std::string(what) + " at offset " + std::to_string(pos_) + ": needs " +
                         std::to_string(n) + " bytes, only " + std::to_string(remaining()) +
                         " left (data is " + std::to_string(size_) + " bytes)");
  }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

}  // namespace kvl::gguf_internal
