#pragma once
// safetensors files: u64 little-endian header length N, N bytes of UTF-8 JSON
//   {"__metadata__": {string: string}, name: {"dtype", "shape", "data_offsets": [begin, end)}}
// then the tensor bytes, offsets relative to byte 8 + N, packed with no gaps.
// Readers validate everything the reference implementation validates (see
// parse_safetensors); every error is one line that starts with the file's label.
// Supported dtypes: F32, F64, BF16, I32, I64, U8; others (F16, I8, BOOL, F8_*, ...) are
// rejected by name.
// ham's writers add the CRC-32C of the data section to the metadata (kDataChecksumKey, 8
// lowercase hex digits), and its readers check it where present: a flipped bit in a
// checkpoint's weights is a one-line error naming the file, not a NaN steps later. Other
// readers see one more metadata entry; files without it (other writers') load unchecked.
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"

namespace ham {

// The reference reader's limit on the JSON header length.
constexpr uint64_t kSafetensorsMaxHeaderBytes = 100'000'000;

// The metadata key of the data section's CRC-32C. Reserved: a writer given it fails, and
// a reader checks it and leaves it out of SafetensorsFile::metadata.
constexpr const char* kDataChecksumKey = "ham.data_crc32c";

struct SafetensorsFile {
  std::string label;  // the path (or the label given to parse_safetensors), for errors
  // In file order (ascending data offset; header order among empty tensors at one offset),
  // i.e. the order save_safetensors was given.
  std::vector<std::pair<std::string, Tensor>> tensors;
  std::map<std::string, std::string> metadata;

  // Throws "<label>: no tensor named '<name>' ..." when absent.
  const Tensor& at(const std::string& name) const;
  bool contains(const std::string& name) const;
};

// Reads a whole file into CPU tensors.
SafetensorsFile load_safetensors(const std::string& path);
// The same from bytes in memory; `label` names the source in errors.
SafetensorsFile parse_safetensors(const std::string& bytes, const std::string& label);

// The bytes save_safetensors writes: header padded with spaces to a multiple of 8, the
// metadata entry first (with kDataChecksumKey), tensors in the given order with no gaps. Tensors
// may live on any device. Throws on duplicate or reserved names.
std::string serialize_safetensors(const std::vector<std::pair<std::string, Tensor>>& tensors,
                                  const std::map<std::string, std::string>& metadata = {},
                                  const std::string& label = "safetensors");

// Writes atomically: `path + ".tmp.<pid>"`, fsync, rename over `path`, fsync the
// directory. On failure the temp file is removed, an existing `path` is untouched, and the
// error names the path and the errno text.
void save_safetensors(const std::string& path,
                      const std::vector<std::pair<std::string, Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata = {});

}  // namespace ham
