#include "core/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <optional>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <tuple>

#include "core/crc32c.h"

namespace ham {

static_assert(std::endian::native == std::endian::little,
              "safetensors I/O copies tensor bytes as-is and assumes a little-endian host");

namespace {

// Ordered: the header's key order survives parsing, so tensors that share an offset (empty
// ones) keep the order the writer gave them.
using Json = nlohmann::ordered_json;

constexpr const char* kMetadataKey = "__metadata__";

struct DTypeName {
  DType dtype;
  const char* name;
};
constexpr DTypeName kSupportedDTypes[] = {{DType::F32, "F32"}, {DType::F64, "F64"},
                                          {DType::BF16, "BF16"}, {DType::I32, "I32"},
                                          {DType::I64, "I64"}, {DType::U8, "U8"}};

const char* safetensors_dtype_name(DType dtype) {
  for (const DTypeName& d : kSupportedDTypes) {
    if (d.dtype == dtype) return d.name;
  }
  HAM_FAIL("safetensors: no name for dtype ", dtype_name(dtype));
}

std::string errno_text(int error) { return std::strerror(error); }

// RFC 3629 UTF-8: no overlong forms, no surrogates, nothing above U+10FFFF.
// Returns the offset of the first invalid byte, or npos when the text is valid.
size_t find_invalid_utf8(const std::string& text) {
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  size_t n = text.size(), i = 0;
  while (i < n) {
    unsigned char lead = s[i];
    size_t length;
    uint32_t min_code, code;
    if (lead < 0x80) {
      ++i;
      continue;
    } else if ((lead & 0xE0) == 0xC0) {
      length = 2, min_code = 0x80, code = lead & 0x1F;
    } else if ((lead & 0xF0) == 0xE0) {
      length = 3, min_code = 0x800, code = lead & 0x0F;
    } else if ((lead & 0xF8) == 0xF0) {
      length = 4, min_code = 0x10000, code = lead & 0x07;
    } else {
      return i;
    }
    if (n - i < length) return i;
    for (size_t k = 1; k < length; ++k) {
      if ((s[i + k] & 0xC0) != 0x80) return i;
      code = (code << 6) | (s[i + k] & 0x3F);
    }
    if (code < min_code || code > 0x10FFFF || (code >= 0xD800 && code <= 0xDFFF)) return i;
    i += length;
  }
  return std::string::npos;
}

std::string json_type_name(const Json& value) { return value.type_name(); }

// One tensor's header entry after validation.
struct Entry {
  std::string name;
  DType dtype;
  Shape shape;
  uint64_t begin = 0, end = 0;
};

DType parse_dtype(const std::string& label, const std::string& name, const Json& value) {
  HAM_CHECK(value.is_string(), label, ": tensor '", name, "': \"dtype\" must be a string, got ",
            json_type_name(value));
  const std::string& text = value.get_ref<const std::string&>();
  for (const DTypeName& d : kSupportedDTypes) {
    if (text == d.name) return d.dtype;
  }
  HAM_FAIL(label, ": tensor '", name, "' has dtype ", text,
           ", which is not supported (ham reads F32, F64, BF16, I32, I64, U8)");
}

Shape parse_shape(const std::string& label, const std::string& name, const Json& value) {
  HAM_CHECK(value.is_array(), label, ": tensor '", name, "': \"shape\" must be an array, got ",
            json_type_name(value));
  Shape shape;
  for (const Json& dim : value) {
    HAM_CHECK(dim.is_number_integer(), label, ": tensor '", name, "': shape ", value.dump(),
              " has a non-integer dimension ", dim.dump());
    HAM_CHECK(dim.is_number_unsigned(), label, ": tensor '", name,
              "': shape ", value.dump(), " has a negative dimension ", dim.dump());
    uint64_t d = dim.get<uint64_t>();
    HAM_CHECK(d <= uint64_t(std::numeric_limits<int64_t>::max()), label, ": tensor '", name,
              "': shape ", value.dump(), " dimension ", d, " overflows int64");
    shape.push_back(int64_t(d));
  }
  return shape;
}

uint64_t checked_nbytes(const std::string& label, const std::string& name, const Shape& shape,
                        DType dtype) {
  uint64_t count = 1;
  for (int64_t d : shape) {
    if (__builtin_mul_overflow(count, uint64_t(d), &count) ||
        count > uint64_t(std::numeric_limits<int64_t>::max())) {
      HAM_FAIL(label, ": tensor '", name, "': shape ", shape_str(shape),
               " element count overflows int64");
    }
  }
  uint64_t bytes = 0;
  HAM_CHECK(!__builtin_mul_overflow(count, uint64_t(dtype_size(dtype)), &bytes), label,
            ": tensor '", name, "': shape ", shape_str(shape), " byte count overflows");
  return bytes;
}

std::pair<uint64_t, uint64_t> parse_offsets(const std::string& label, const std::string& name,
                                            const Json& value) {
  bool valid = value.is_array() && value.size() == 2 && value[0].is_number_unsigned() &&
               value[1].is_number_unsigned();
  HAM_CHECK(valid, label, ": tensor '", name,
            "': \"data_offsets\" must be [begin, end] of two non-negative integers, got ",
            value.dump());
  uint64_t begin = value[0].get<uint64_t>(), end = value[1].get<uint64_t>();
  HAM_CHECK(begin <= end, label, ": tensor '", name, "': data_offsets [", begin, ", ", end,
            "] has begin > end");
  return {begin, end};
}

const Json& required_field(const std::string& label, const std::string& name, const Json& entry,
                           const char* field) {
  auto it = entry.find(field);
  HAM_CHECK(it != entry.end(), label, ": tensor '", name, "' is missing \"", field, "\"");
  return *it;
}

struct Header {
  std::vector<Entry> entries;  // sorted by data offset
  std::map<std::string, std::string> metadata;
};

// Validates the JSON header against a data section of `data_size` bytes.
Header parse_header(const std::string& text, uint64_t data_size, const std::string& label) {
  size_t bad = find_invalid_utf8(text);
  HAM_CHECK(bad == std::string::npos, label, ": header is not valid UTF-8 (byte ", bad,
            " of the header)");
  // The JSON object model keeps only the last of repeated keys, so count top-level keys
  // while parsing to reject duplicates.
  std::set<std::string> seen_keys;
  std::string duplicate;
  auto note_keys = [&](int depth, Json::parse_event_t event, Json& parsed) {
    if (event == Json::parse_event_t::key && depth == 1 && parsed.is_string()) {
      if (!seen_keys.insert(parsed.get<std::string>()).second && duplicate.empty()) {
        duplicate = parsed.get<std::string>();
      }
    }
    return true;
  };
  Json root;
  try {
    root = Json::parse(text, note_keys);
  } catch (const Json::parse_error& e) {
    HAM_FAIL(label, ": header is not valid JSON (syntax error at byte ", e.byte,
             " of the header)");
  }
  HAM_CHECK(root.is_object(), label, ": header is not a JSON object (got ", json_type_name(root),
            ")");
  HAM_CHECK(duplicate.empty(), label, ": header names '", duplicate, "' more than once");

  Header header;
  for (auto it = root.begin(); it != root.end(); ++it) {
    const std::string& name = it.key();
    const Json& value = it.value();
    if (name == kMetadataKey) {
      HAM_CHECK(value.is_object() || value.is_null(), label,
                ": __metadata__ must be an object of string to string, got ",
                json_type_name(value));
      if (value.is_null()) continue;
      for (auto m = value.begin(); m != value.end(); ++m) {
        HAM_CHECK(m.value().is_string(), label,
                  ": __metadata__ must be an object of string to string; key '", m.key(),
                  "' has a ", json_type_name(m.value()));
        header.metadata[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    HAM_CHECK(value.is_object(), label, ": tensor '", name, "': entry must be a JSON object, got ",
              json_type_name(value));
    Entry entry;
    entry.name = name;
    entry.dtype = parse_dtype(label, name, required_field(label, name, value, "dtype"));
    entry.shape = parse_shape(label, name, required_field(label, name, value, "shape"));
    std::tie(entry.begin, entry.end) =
        parse_offsets(label, name, required_field(label, name, value, "data_offsets"));
    uint64_t expected = checked_nbytes(label, name, entry.shape, entry.dtype);
    HAM_CHECK(entry.end - entry.begin == expected, label, ": tensor '", name, "' ",
              dtype_name(entry.dtype), shape_str(entry.shape), " needs ", expected,
              " bytes but data_offsets [", entry.begin, ", ", entry.end, "] hold ",
              entry.end - entry.begin);
    header.entries.push_back(std::move(entry));
  }

  // The tensors must tile the data section exactly: sorted by begin, each starts where the
  // previous ended, the first at 0, the last at the end of the file.
  auto by_offsets = [](const Entry& a, const Entry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  };
  std::stable_sort(header.entries.begin(), header.entries.end(), by_offsets);
  uint64_t position = 0;
  const Entry* previous = nullptr;
  for (const Entry& e : header.entries) {
    if (e.begin < position) {
      HAM_FAIL(label, ": tensor '", e.name, "' data_offsets [", e.begin, ", ", e.end,
               "] overlap tensor '", previous->name, "' [", previous->begin, ", ", previous->end,
               "]");
    }
    if (e.begin > position) {
      if (previous) {
        HAM_FAIL(label, ": gap of ", e.begin - position, " bytes between tensor '",
                 previous->name, "' (ends at ", position, ") and tensor '", e.name,
                 "' (begins at ", e.begin, ")");
      }
      HAM_FAIL(label, ": gap of ", e.begin, " bytes before the first tensor '", e.name,
               "' (begins at ", e.begin, ", not 0)");
    }
    position = e.end;
    previous = &e;
  }
  if (position > data_size) {
    HAM_FAIL(label, ": tensor '", previous->name, "' data_offsets [", previous->begin, ", ",
             previous->end, "] extend past end of file (data section is ", data_size,
             " bytes)");
  }
  HAM_CHECK(position == data_size, label, ": ", data_size - position,
            " trailing bytes after the last tensor (data section is ", data_size,
            " bytes, tensors end at ", position, ")");
  return header;
}

std::string checksum_text(uint32_t crc) {
  char text[9];
  std::snprintf(text, sizeof(text), "%08x", crc);
  return text;
}

std::optional<uint32_t> parse_checksum(const std::string& text) {
  if (text.size() != 8) return std::nullopt;
  uint32_t value = 0;
  for (char c : text) {
    int digit = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
    if (digit < 0) return std::nullopt;
    value = value << 4 | uint32_t(digit);
  }
  return value;
}

// Parses a safetensors source of `total_size` bytes read through
// read_at(offset, destination, count).
template <class ReadAt>
SafetensorsFile parse_source(uint64_t total_size, ReadAt&& read_at, const std::string& label) {
  HAM_CHECK(total_size >= 8, label, ": file is ", total_size,
            " bytes, shorter than the 8-byte header length");
  uint64_t header_size = 0;
  read_at(0, &header_size, 8);  // little-endian, checked above
  HAM_CHECK(header_size <= kSafetensorsMaxHeaderBytes, label, ": header length ", header_size,
            " exceeds the limit of ", kSafetensorsMaxHeaderBytes, " bytes");
  HAM_CHECK(header_size <= total_size - 8, label, ": header of ", header_size,
            " bytes extends past end of file (file is ", total_size, " bytes)");
  std::string text(size_t(header_size), '\0');
  read_at(8, text.data(), size_t(header_size));
  uint64_t data_start = 8 + header_size;
  Header header = parse_header(text, total_size - data_start, label);

  SafetensorsFile file;
  file.label = label;
  file.metadata = std::move(header.metadata);
  // The tensors tile the data section in offset order, so their bytes in that order are it.
  uint32_t data_crc = 0;
  for (const Entry& e : header.entries) {
    Tensor t = Tensor::empty(e.shape, e.dtype, Device::cpu());
    if (e.end > e.begin) {
      read_at(data_start + e.begin, t.raw_data(), size_t(e.end - e.begin));
      data_crc = crc32c(t.raw_data(), size_t(e.end - e.begin), data_crc);
    }
    file.tensors.emplace_back(e.name, std::move(t));
  }
  auto stored = file.metadata.find(kDataChecksumKey);
  if (stored != file.metadata.end()) {
    const std::optional<uint32_t> expected = parse_checksum(stored->second);
    HAM_CHECK(expected, label, ": metadata ", kDataChecksumKey,
              " must be 8 lowercase hex digits, got '", stored->second, "'");
    HAM_CHECK(*expected == data_crc, label, ": the tensor data fails its checksum (",
              kDataChecksumKey, " ", stored->second, ", the ", total_size - data_start,
              " data bytes give ", checksum_text(data_crc), "): the file is corrupt");
    file.metadata.erase(stored);
  }
  return file;
}

// Closes a file descriptor on scope exit.
struct FdCloser {
  int fd;
  ~FdCloser() {
    if (fd >= 0) ::close(fd);
  }
};

void write_all(int fd, const void* data, size_t n, const std::string& what) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t written = ::write(fd, p, std::min<size_t>(n, size_t(1) << 30));
    if (written < 0) {
      if (errno == EINTR) continue;
      HAM_FAIL(what, ": ", errno_text(errno));
    }
    p += written;
    n -= size_t(written);
  }
}

// Validates names and returns the 8-byte length followed by the padded JSON header.
// The header's length does not depend on data_crc (8 hex digits always), so
// save_safetensors writes it before the data and again, with the data's CRC, after.
std::string build_header(const std::vector<std::pair<std::string, Tensor>>& tensors,
                         const std::map<std::string, std::string>& metadata,
                         const std::string& label, uint32_t data_crc) {
  Json root = Json::object();
  Json meta = Json::object();
  for (const auto& [key, value] : metadata) {
    HAM_CHECK(key != kDataChecksumKey, label, ": metadata key '", key,
              "' is reserved (the writer adds the data's CRC-32C under it)");
    HAM_CHECK(find_invalid_utf8(key) == std::string::npos &&
                  find_invalid_utf8(value) == std::string::npos,
              label, ": metadata entry '", key, "' is not valid UTF-8");
    meta[key] = value;
  }
  meta[kDataChecksumKey] = checksum_text(data_crc);
  root[kMetadataKey] = std::move(meta);
  std::set<std::string> names;
  uint64_t offset = 0;
  for (const auto& [name, tensor] : tensors) {
    HAM_CHECK(name != kMetadataKey, label, ": tensor name '", name, "' is reserved");
    HAM_CHECK(find_invalid_utf8(name) == std::string::npos, label,
              ": tensor name is not valid UTF-8");
    HAM_CHECK(names.insert(name).second, label, ": duplicate tensor name '", name, "'");
    HAM_CHECK(tensor.defined(), label, ": tensor '", name, "' is undefined");
    uint64_t nbytes = tensor.nbytes();
    Json entry = Json::object();
    entry["dtype"] = safetensors_dtype_name(tensor.dtype());
    entry["shape"] = tensor.shape();
    entry["data_offsets"] = {offset, offset + nbytes};
    root[name] = std::move(entry);
    offset += nbytes;
  }
  std::string json = root.dump();
  json.append((8 - json.size() % 8) % 8, ' ');
  uint64_t length = json.size();
  std::string out(8, '\0');
  std::memcpy(out.data(), &length, 8);
  return out + json;
}

// fsync on the directory makes the rename durable. Filesystems that cannot sync a
// directory report EINVAL; that is not a failure of the save.
void sync_directory(const std::string& path, const std::string& label) {
  std::filesystem::path dir = std::filesystem::path(path).parent_path();
  if (dir.empty()) dir = ".";
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  HAM_CHECK(fd >= 0, label, ": cannot open directory ", dir.string(), " to sync it: ",
            errno_text(errno));
  FdCloser closer{fd};
  if (::fsync(fd) != 0 && errno != EINVAL) {
    HAM_FAIL(label, ": fsync of directory ", dir.string(), " failed: ", errno_text(errno));
  }
}

}  // namespace

const Tensor& SafetensorsFile::at(const std::string& name) const {
  for (const auto& [key, tensor] : tensors) {
    if (key == name) return tensor;
  }
  HAM_FAIL(label, ": no tensor named '", name, "' (the file has ", tensors.size(), " tensors)");
}

bool SafetensorsFile::contains(const std::string& name) const {
  return std::any_of(tensors.begin(), tensors.end(),
                     [&](const auto& entry) { return entry.first == name; });
}

SafetensorsFile parse_safetensors(const std::string& bytes, const std::string& label) {
  auto read_at = [&](uint64_t offset, void* dst, size_t n) {
    if (n) std::memcpy(dst, bytes.data() + offset, n);  // an empty tensor's dst may be null
  };
  return parse_source(bytes.size(), read_at, label);
}

SafetensorsFile load_safetensors(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  HAM_CHECK(fd >= 0, path, ": cannot open: ", errno_text(errno));
  FdCloser closer{fd};
  struct stat info;
  HAM_CHECK(::fstat(fd, &info) == 0, path, ": cannot stat: ", errno_text(errno));
  HAM_CHECK(S_ISREG(info.st_mode), path, ": not a regular file");
  auto read_at = [&](uint64_t offset, void* dst, size_t n) {
    char* p = static_cast<char*>(dst);
    while (n > 0) {
      ssize_t got = ::pread(fd, p, std::min<size_t>(n, size_t(1) << 30), off_t(offset));
      if (got < 0 && errno == EINTR) continue;
      HAM_CHECK(got >= 0, path, ": read at byte ", offset, " failed: ", errno_text(errno));
      HAM_CHECK(got > 0, path, ": file shrank while reading (at byte ", offset, ")");
      p += got;
      n -= size_t(got);
      offset += uint64_t(got);
    }
  };
  return parse_source(uint64_t(info.st_size), read_at, path);
}

std::string serialize_safetensors(const std::vector<std::pair<std::string, Tensor>>& tensors,
                                  const std::map<std::string, std::string>& metadata,
                                  const std::string& label) {
  std::string out = build_header(tensors, metadata, label, 0);
  const size_t data_start = out.size();
  for (const auto& [name, tensor] : tensors) {
    Tensor host = tensor.to(Device::cpu());
    out.append(static_cast<const char*>(host.raw_data()), host.nbytes());
  }
  // The header again, now with the data's CRC: the same length, over the first.
  const uint32_t data_crc = crc32c(out.data() + data_start, out.size() - data_start);
  const std::string header = build_header(tensors, metadata, label, data_crc);
  out.replace(0, header.size(), header);
  return out;
}

void save_safetensors(const std::string& path,
                      const std::vector<std::pair<std::string, Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata) {
  std::string label = "save_safetensors " + path;
  std::string header = build_header(tensors, metadata, label, 0);
  std::string temp = path + ".tmp." + std::to_string(::getpid());
  int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  HAM_CHECK(fd >= 0, label, ": cannot create ", temp, ": ", errno_text(errno));
  try {
    std::string write_error = label + ": writing " + temp + " failed";
    write_all(fd, header.data(), header.size(), write_error);
    uint32_t data_crc = 0;
    for (const auto& [name, tensor] : tensors) {
      Tensor host = tensor.to(Device::cpu());
      write_all(fd, host.raw_data(), host.nbytes(), write_error);
      data_crc = crc32c(host.raw_data(), host.nbytes(), data_crc);
    }
    // The header again, now with the data's CRC: the same length, over the first.
    header = build_header(tensors, metadata, label, data_crc);
    HAM_CHECK(::lseek(fd, 0, SEEK_SET) == 0, label, ": seeking in ", temp, " failed: ",
              errno_text(errno));
    write_all(fd, header.data(), header.size(), write_error);
    HAM_CHECK(::fsync(fd) == 0, label, ": fsync of ", temp, " failed: ", errno_text(errno));
    int closed = ::close(fd);
    fd = -1;
    HAM_CHECK(closed == 0, label, ": closing ", temp, " failed: ", errno_text(errno));
    HAM_CHECK(::rename(temp.c_str(), path.c_str()) == 0, label, ": renaming ", temp,
              " over it failed: ", errno_text(errno));
  } catch (...) {
    if (fd >= 0) ::close(fd);
    ::unlink(temp.c_str());
    throw;
  }
  sync_directory(path, label);
}

}  // namespace ham
