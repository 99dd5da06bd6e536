#include "train/text_data.h"

#include <algorithm>
#include <string>

#include "core/error.h"
#include "core/file_io.h"
#include "train/tokenizer.h"

namespace ham {

std::vector<int64_t> ByteTokenizer::encode(std::string_view text) const {
  std::vector<int64_t> ids;
  ids.reserve(text.size());
  for (unsigned char c : text) ids.push_back(int64_t(c));
  return ids;
}

std::string ByteTokenizer::decode(const std::vector<int64_t>& ids) const {
  std::string out;
  for (int64_t id : ids) {
    if (id == kEndOfText) {
      out += "<|endoftext|>";
    } else {
      HAM_CHECK(id >= 0 && id < 256, "ByteTokenizer::decode: id ", id, " is not a byte");
      out += char(id);
    }
  }
  return out;
}

std::vector<std::string> split_documents(std::string_view text) {
  static constexpr std::string_view kMarker = "<|endoftext|>";
  std::vector<std::string> docs;
  std::string current;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t eol = text.find('\n', pos);
    size_t end = eol == std::string_view::npos ? text.size() : eol + 1;
    std::string_view line = text.substr(pos, end - pos);
    std::string_view trimmed = line;
    while (!trimmed.empty() && (trimmed.back() == '\n' || trimmed.back() == '\r')) {
      trimmed.remove_suffix(1);
    }
    if (trimmed == kMarker) {
      if (!current.empty()) docs.push_back(std::move(current));
      current.clear();
    } else {
      current.append(line);
    }
    pos = end;
  }
  if (!current.empty()) docs.push_back(std::move(current));
  return docs;
}

std::vector<std::string> read_documents(const std::string& path, bool one_document_per_file) {
  std::string text = read_file(path, "the text file");
  if (one_document_per_file) {
    if (text.empty()) return {};
    return {std::move(text)};
  }
  return split_documents(text);
}

int64_t held_out_documents(int64_t total_documents, double validation_fraction) {
  if (validation_fraction <= 0 || total_documents < 2) return 0;
  return std::max<int64_t>(1, int64_t(double(total_documents) * validation_fraction));
}

std::pair<TokenStream, TokenStream> TokenStream::from_text(std::string_view text,
                                                           double validation_fraction,
                                                           const std::string& source,
                                                           const Tokenizer* tokenizer) {
  HAM_CHECK(validation_fraction >= 0 && validation_fraction < 1, source,
            ": validation fraction must be in [0, 1), got ", validation_fraction);
  std::vector<std::string> docs = split_documents(text);
  HAM_CHECK(!docs.empty(), source, ": no text to train on");
  const size_t n_val = size_t(held_out_documents(int64_t(docs.size()), validation_fraction));
  const int64_t doc_start = tokenizer ? tokenizer->document_start_id() : ByteTokenizer::kEndOfText;
  HAM_CHECK(doc_start >= 0, source, ": the tokenizer ", tokenizer ? tokenizer->name() : "",
            " has no end-of-text or beginning-of-sequence token to start documents with");
  std::vector<int64_t> train, val;
  for (size_t i = 0; i < docs.size(); ++i) {
    auto& dst = i < docs.size() - n_val ? train : val;
    dst.push_back(doc_start);
    auto ids = tokenizer ? tokenizer->encode(docs[i]) : ByteTokenizer().encode(docs[i]);
    dst.insert(dst.end(), ids.begin(), ids.end());
  }
  return {TokenStream(std::move(train), doc_start), TokenStream(std::move(val), doc_start)};
}

void TokenStream::read(int64_t begin, int64_t count, int64_t* out) const {
  HAM_CHECK(begin >= 0 && count >= 0 && begin + count <= size(), "TokenStream::read: [", begin,
            ", ", begin + count, ") outside a stream of ", size(), " tokens");
  std::copy(tokens_.begin() + begin, tokens_.begin() + begin + count, out);
}

TokenBatch TokenSource::batch_at(const std::vector<int64_t>& starts, int64_t seq_len) const {
  const int64_t B = int64_t(starts.size());
  const int64_t doc_start = document_start_id();
  std::vector<int64_t> inputs(size_t(B * seq_len)), targets(size_t(B * seq_len));
  std::vector<int64_t> doc_ids(size_t(B * seq_len)), positions(size_t(B * seq_len));
  std::vector<int64_t> window(size_t(seq_len + 1));
  for (int64_t b = 0; b < B; ++b) {
    int64_t s = starts[size_t(b)];
    HAM_CHECK(s >= 0 && s + seq_len + 1 <= size(), "batch_at: window [", s, ", ",
              s + seq_len + 1, ") outside a stream of ", size(), " tokens");
    read(s, seq_len + 1, window.data());
    int64_t doc = 0, pos = 0;
    for (int64_t t = 0; t < seq_len; ++t) {
      int64_t token = window[size_t(t)];
      if (token == doc_start && t > 0) {
        ++doc;
        pos = 0;
      }
      size_t i = size_t(b * seq_len + t);
      inputs[i] = token;
      targets[i] = window[size_t(t + 1)];
      doc_ids[i] = doc;
      positions[i] = pos++;
    }
  }
  return {Tensor::from_vector(inputs, {B, seq_len}), Tensor::from_vector(targets, {B, seq_len}),
          Tensor::from_vector(doc_ids, {B, seq_len}), Tensor::from_vector(positions, {B, seq_len})};
}

TokenBatch TokenSource::sample(int64_t batch, int64_t seq_len, Generator& gen) const {
  HAM_CHECK(size() > seq_len + 1, "sample: the data holds ", size(),
            " tokens, too few for windows of ", seq_len + 1);
  Tensor starts = randint({batch}, gen, 0, size() - seq_len - 1);
  return batch_at(starts.to_vector<int64_t>(), seq_len);
}

std::vector<TokenBatch> TokenSource::sequential(int64_t batch, int64_t seq_len,
                                                int64_t max_batches) const {
  std::vector<TokenBatch> out;
  std::vector<int64_t> starts;
  for (int64_t s = 0; s + seq_len + 1 <= size(); s += seq_len) {
    starts.push_back(s);
    if (int64_t(starts.size()) == batch) {
      out.push_back(batch_at(starts, seq_len));
      starts.clear();
      if (int64_t(out.size()) == max_batches) return out;
    }
  }
  if (!starts.empty()) out.push_back(batch_at(starts, seq_len));
  return out;
}

}  // namespace ham
