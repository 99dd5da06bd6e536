#include "train/shards.h"

#include <fcntl.h>
#include <glob.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <string>

#include <fmt/format.h>

#include "core/error.h"
#include "train/text_data.h"
#include "train/tokenizer.h"

namespace ham {

static_assert(std::endian::native == std::endian::little,
              "llm.c shards are little-endian; this reader maps them as they are");

namespace {

int64_t token_at(const uint8_t* tokens, int width, int64_t i) {
  if (width == 2) {
    uint16_t v;
    std::memcpy(&v, tokens + i * 2, 2);
    return v;
  }
  uint32_t v;
  std::memcpy(&v, tokens + i * 4, 4);
  return v;
}

}  // namespace

int shard_token_width(int64_t vocab_size) { return vocab_size <= 65536 ? 2 : 4; }

void write_shard(const std::string& path, const std::vector<int64_t>& tokens, int token_width) {
  HAM_CHECK(token_width == 2 || token_width == 4, path, ": shard token width must be 2 or 4 bytes, got ",
            token_width);
  HAM_CHECK(tokens.size() <= size_t(INT32_MAX), path, ": ", tokens.size(),
            " tokens do not fit the shard header's int32 count");
  const int64_t limit = token_width == 2 ? 65536 : (int64_t(1) << 32);
  int32_t header[256] = {};
  header[0] = token_width == 2 ? kShardMagicUint16 : kShardMagicUint32;
  header[1] = token_width == 2 ? kShardVersionUint16 : kShardVersionUint32;
  header[2] = int32_t(tokens.size());
  std::vector<uint8_t> body(tokens.size() * size_t(token_width));
  for (size_t i = 0; i < tokens.size(); ++i) {
    int64_t t = tokens[i];
    HAM_CHECK(t >= 0 && t < limit, path, ": token ", t, " at position ", i, " does not fit a ",
              8 * token_width, "-bit shard");
    if (token_width == 2) {
      uint16_t v = uint16_t(t);
      std::memcpy(&body[i * 2], &v, 2);
    } else {
      uint32_t v = uint32_t(t);
      std::memcpy(&body[i * 4], &v, 4);
    }
  }
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  HAM_CHECK(out, path, ": cannot create shard file: ", std::strerror(errno));
  out.write(reinterpret_cast<const char*>(header), sizeof(header));
  out.write(reinterpret_cast<const char*>(body.data()), std::streamsize(body.size()));
  out.close();
  HAM_CHECK(out, path, ": writing the shard failed");
}

// ---- Shard -------------------------------------------------------------------------------

struct Shard::Mapping {
  void* data = nullptr;
  size_t bytes = 0;
  ~Mapping() {
    if (data) munmap(data, bytes);
  }
};

Shard Shard::open(const std::string& path, int64_t vocab_size) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  HAM_CHECK(fd >= 0, path, ": cannot open shard: ", std::strerror(errno));
  struct stat st;
  if (fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    HAM_FAIL(path, ": cannot stat shard: ", std::strerror(err));
  }
  const int64_t file_bytes = int64_t(st.st_size);
  if (file_bytes < kShardHeaderBytes) {
    ::close(fd);
    HAM_FAIL(path, ": llm.c shard has ", file_bytes, " bytes, fewer than its ", kShardHeaderBytes,
             "-byte header");
  }
  auto mapping = std::make_shared<Mapping>();
  void* data = mmap(nullptr, size_t(file_bytes), PROT_READ, MAP_PRIVATE, fd, 0);
  int map_errno = errno;
  ::close(fd);  // the mapping keeps the file's pages reachable
  HAM_CHECK(data != MAP_FAILED, path, ": cannot map shard: ", std::strerror(map_errno));
  mapping->data = data;
  mapping->bytes = size_t(file_bytes);

  int32_t header[3];
  std::memcpy(header, data, sizeof(header));
  const int32_t magic = header[0], version = header[1], count = header[2];
  int width;
  if (magic == kShardMagicUint16) {
    width = 2;
    HAM_CHECK(version == kShardVersionUint16, path, ": llm.c shard version is ", version, ", but magic ",
              magic, " (uint16 tokens) goes with version ", kShardVersionUint16);
  } else if (magic == kShardMagicUint32) {
    width = 4;
    HAM_CHECK(version == kShardVersionUint32, path, ": llm.c shard version is ", version, ", but magic ",
              magic, " (uint32 tokens) goes with version ", kShardVersionUint32);
  } else {
    HAM_FAIL(path, ": not an llm.c shard: magic is ", magic, ", expected ", kShardMagicUint16,
             " (uint16 tokens) or ", kShardMagicUint32, " (uint32 tokens)");
  }
  HAM_CHECK(count >= 0, path, ": llm.c shard header gives a negative token count ", count);
  const int64_t expected = kShardHeaderBytes + int64_t(count) * width;
  HAM_CHECK(file_bytes >= expected, path, ": llm.c shard is truncated: the header announces ", count,
            " tokens (", expected, " bytes) but the file has ", file_bytes, " bytes");
  HAM_CHECK(file_bytes == expected, path, ": llm.c shard has ", file_bytes - expected,
            " trailing bytes after the ", count, " tokens its header announces (", expected, " bytes)");

  Shard shard;
  shard.mapping_ = std::move(mapping);
  shard.tokens_ = static_cast<const uint8_t*>(data) + kShardHeaderBytes;
  shard.path_ = path;
  shard.size_ = count;
  shard.width_ = width;
  if (vocab_size > 0 && shard.size_ > 0) {
    madvise(data, size_t(file_bytes), MADV_SEQUENTIAL);
    // A max over the tokens first (vectorises); the position only when one is too large.
    int64_t largest = 0;
    if (width == 2) {
      const uint16_t* p = reinterpret_cast<const uint16_t*>(shard.tokens_);
      largest = *std::max_element(p, p + count);
    } else {
      const uint32_t* p = reinterpret_cast<const uint32_t*>(shard.tokens_);
      largest = *std::max_element(p, p + count);
    }
    if (largest >= vocab_size) {
      for (int64_t i = 0; i < shard.size_; ++i) {
        int64_t t = shard[i];
        HAM_CHECK(t < vocab_size, path, ": token ", t, " at position ", i,
                  " is outside the model's vocabulary of ", vocab_size, " tokens");
      }
    }
  }
  madvise(data, size_t(file_bytes), MADV_RANDOM);  // training reads windows at random
  return shard;
}

int64_t Shard::operator[](int64_t i) const {
  HAM_CHECK(i >= 0 && i < size_, path_, ": token index ", i, " outside a shard of ", size_, " tokens");
  return token_at(tokens_, width_, i);
}

void Shard::read(int64_t begin, int64_t count, int64_t* out) const {
  HAM_CHECK(begin >= 0 && count >= 0 && begin + count <= size_, path_, ": tokens [", begin, ", ",
            begin + count, ") outside a shard of ", size_, " tokens");
  if (width_ == 2) {
    const uint8_t* p = tokens_ + begin * 2;
    for (int64_t i = 0; i < count; ++i) {
      uint16_t v;
      std::memcpy(&v, p + i * 2, 2);
      out[i] = v;
    }
  } else {
    const uint8_t* p = tokens_ + begin * 4;
    for (int64_t i = 0; i < count; ++i) {
      uint32_t v;
      std::memcpy(&v, p + i * 4, 4);
      out[i] = v;
    }
  }
}

std::vector<int64_t> Shard::to_vector() const {
  std::vector<int64_t> out(static_cast<size_t>(size_));
  read(0, size_, out.data());
  return out;
}

std::vector<int64_t> load_shard(const std::string& path, int64_t vocab_size) {
  return Shard::open(path, vocab_size).to_vector();
}

std::vector<std::string> expand_shard_paths(const std::string& pattern) {
  if (pattern.find_first_of("*?[") == std::string::npos) return {pattern};
  glob_t matches{};
  int rc = glob(pattern.c_str(), 0, nullptr, &matches);
  std::vector<std::string> paths;
  if (rc == 0) {
    for (size_t i = 0; i < matches.gl_pathc; ++i) paths.emplace_back(matches.gl_pathv[i]);
  }
  globfree(&matches);
  HAM_CHECK(rc == 0 || rc == GLOB_NOMATCH, pattern, ": cannot expand the shard pattern");
  HAM_CHECK(!paths.empty(), pattern, ": no shard files match this pattern");
  std::sort(paths.begin(), paths.end());
  return paths;
}

// ---- ShardDataset ------------------------------------------------------------------------

ShardDataset::ShardDataset(const std::vector<std::string>& paths, int64_t vocab_size,
                           int64_t document_start_id)
    : document_start_id_(document_start_id) {
  HAM_CHECK(!paths.empty(), "ShardDataset: no shard files given");
  offsets_.push_back(0);
  for (const auto& pattern : paths) {
    for (const auto& path : expand_shard_paths(pattern)) {
      shards_.push_back(Shard::open(path, vocab_size));
      offsets_.push_back(offsets_.back() + shards_.back().size());
    }
  }
}

void ShardDataset::read(int64_t begin, int64_t count, int64_t* out) const {
  HAM_CHECK(begin >= 0 && count >= 0 && begin + count <= size(), "ShardDataset: tokens [", begin, ", ",
            begin + count, ") outside ", size(), " tokens in ", shards_.size(), " shards");
  // The shard holding `begin`: the last one whose first token is <= begin.
  size_t s = size_t(std::upper_bound(offsets_.begin(), offsets_.end(), begin) - offsets_.begin()) - 1;
  while (count > 0) {
    int64_t local = begin - offsets_[s];
    int64_t take = std::min(count, shards_[s].size() - local);
    shards_[s].read(local, take, out);
    out += take;
    begin += take;
    count -= take;
    ++s;
  }
}

std::vector<int64_t> ShardDataset::tokens(int64_t begin, int64_t count) const {
  std::vector<int64_t> out(size_t(std::max<int64_t>(count, 0)));
  read(begin, count, out.data());
  return out;
}


// ---- Tokenizing text into shards ---------------------------------------------------------

namespace {

// Fills shards of options.shard_tokens tokens, cutting documents where a shard ends (as
// llm.c's data scripts do), and names them PREFIX_SPLIT_000000.bin, ... Tokens go to disk
// as they come; the header's count is patched in when a shard is closed, so memory stays
// small whatever the shard size.
class ShardWriter {
 public:
  ShardWriter(std::string prefix, std::string split, int64_t shard_tokens, int width,
              std::vector<std::string>& written)
      : prefix_(std::move(prefix)), split_(std::move(split)), shard_tokens_(shard_tokens),
        width_(width), written_(written) {}
  ~ShardWriter() {
    try {
      close();
    } catch (...) {  // only reached while another error unwinds; that one is reported
    }
  }

  void append(const std::vector<int64_t>& tokens) {
    const int64_t limit = width_ == 2 ? 65536 : (int64_t(1) << 32);
    for (int64_t t : tokens) {
      if (!out_.is_open()) open();
      HAM_CHECK(t >= 0 && t < limit, path_, ": token ", t, " does not fit a ", 8 * width_, "-bit shard");
      if (width_ == 2) {
        uint16_t v = uint16_t(t);
        bytes_.append(reinterpret_cast<const char*>(&v), 2);
      } else {
        uint32_t v = uint32_t(t);
        bytes_.append(reinterpret_cast<const char*>(&v), 4);
      }
      if (++count_ == shard_tokens_) close();
    }
    write_bytes();
  }

  void close() {
    if (!out_.is_open()) return;
    write_bytes();
    int32_t count = int32_t(count_);
    out_.seekp(8);
    out_.write(reinterpret_cast<const char*>(&count), 4);
    out_.close();
    HAM_CHECK(out_, path_, ": writing the shard failed");
    written_.push_back(path_);
  }

 private:
  void open() {
    path_ = fmt::format("{}_{}_{:06d}.bin", prefix_, split_, written_.size());
    out_.open(path_, std::ios::binary | std::ios::trunc);
    HAM_CHECK(out_, path_, ": cannot create shard file: ", std::strerror(errno));
    int32_t header[256] = {};
    header[0] = width_ == 2 ? kShardMagicUint16 : kShardMagicUint32;
    header[1] = width_ == 2 ? kShardVersionUint16 : kShardVersionUint32;
    out_.write(reinterpret_cast<const char*>(header), sizeof(header));
    count_ = 0;
  }
  void write_bytes() {
    if (bytes_.empty()) return;
    out_.write(bytes_.data(), std::streamsize(bytes_.size()));
    bytes_.clear();
  }

  std::string prefix_, split_;
  int64_t shard_tokens_;
  int width_;
  std::vector<std::string>& written_;
  std::ofstream out_;
  std::string path_;
  std::string bytes_;  // encoded tokens not yet written
  int64_t count_ = 0;
};

}  // namespace

TokenizeSummary tokenize_to_shards(const Tokenizer& tokenizer, const std::vector<std::string>& inputs,
                                   const std::string& out_prefix, const TokenizeOptions& options) {
  HAM_CHECK(!inputs.empty(), "tokenize: no input files");
  HAM_CHECK(options.shard_tokens > 0 && options.shard_tokens <= INT32_MAX,
            "tokenize: tokens per shard must be in [1, 2^31), got ", options.shard_tokens);
  HAM_CHECK(options.validation_fraction >= 0 && options.validation_fraction < 1,
            "tokenize: validation fraction must be in [0, 1), got ", options.validation_fraction);
  const int64_t doc_start = tokenizer.document_start_id();
  HAM_CHECK(doc_start >= 0, tokenizer.name(),
            ": the tokenizer has no end-of-text or beginning-of-sequence token to start documents with");

  // First pass: count documents, so that the last ones can form the validation split.
  int64_t total_documents = 0;
  for (const auto& path : inputs) {
    total_documents += int64_t(read_documents(path, options.one_document_per_file).size());
  }
  HAM_CHECK(total_documents > 0, "tokenize: the input files hold no text");
  const int64_t val_documents = held_out_documents(total_documents, options.validation_fraction);

  TokenizeSummary summary;
  summary.token_width = shard_token_width(tokenizer.vocab_size());
  ShardWriter train(out_prefix, "train", options.shard_tokens, summary.token_width, summary.train_shards);
  ShardWriter val(out_prefix, "val", options.shard_tokens, summary.token_width, summary.val_shards);
  int64_t index = 0;
  std::vector<int64_t> tokens;
  for (const auto& path : inputs) {
    for (const auto& document : read_documents(path, options.one_document_per_file)) {
      bool is_val = index++ >= total_documents - val_documents;
      tokens.assign(1, doc_start);
      std::vector<int64_t> ids = tokenizer.encode(document);
      tokens.insert(tokens.end(), ids.begin(), ids.end());
      (is_val ? val : train).append(tokens);
      (is_val ? summary.val_documents : summary.train_documents) += 1;
      (is_val ? summary.val_tokens : summary.train_tokens) += int64_t(tokens.size());
    }
  }
  train.close();
  val.close();
  return summary;
}

}  // namespace ham
