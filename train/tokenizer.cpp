#include "train/tokenizer.h"

#ifndef HAM_WITHOUT_ICU
#include <unicode/uchar.h>
#endif

#include <array>
#include <climits>
#include <functional>
#include <mutex>
#include <queue>
#include <string>
#include <unordered_map>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/file_io.h"
#include "train/text_data.h"

namespace ham {

namespace {

using json = nlohmann::json;

// ---- UTF-8 -------------------------------------------------------------------------------

struct Utf8Char {
  char32_t code_point;  // the byte itself when !valid
  int length;           // bytes taken from the input (1 for an invalid byte)
  bool valid;
};

// Strict decoding: overlong forms, surrogates and values past U+10FFFF are invalid, and an
// invalid sequence yields one byte so that decoding always makes progress.
Utf8Char decode_utf8(std::string_view s, size_t i) {
  auto byte = [&](size_t k) { return uint8_t(s[k]); };
  uint8_t b0 = byte(i);
  if (b0 < 0x80) return {b0, 1, true};
  int length;
  char32_t cp, min;
  if ((b0 & 0xE0) == 0xC0) {
    length = 2, cp = b0 & 0x1F, min = 0x80;
  } else if ((b0 & 0xF0) == 0xE0) {
    length = 3, cp = b0 & 0x0F, min = 0x800;
  } else if ((b0 & 0xF8) == 0xF0) {
    length = 4, cp = b0 & 0x07, min = 0x10000;
  } else {
    return {b0, 1, false};
  }
  if (i + size_t(length) > s.size()) return {b0, 1, false};
  for (int k = 1; k < length; ++k) {
    uint8_t b = byte(i + size_t(k));
    if ((b & 0xC0) != 0x80) return {b0, 1, false};
    cp = (cp << 6) | (b & 0x3F);
  }
  if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return {b0, 1, false};
  return {cp, length, true};
}

void append_utf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out += char(cp);
  } else if (cp < 0x800) {
    out += char(0xC0 | (cp >> 6));
    out += char(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += char(0xE0 | (cp >> 12));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  } else {
    out += char(0xF0 | (cp >> 18));
    out += char(0x80 | ((cp >> 12) & 0x3F));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  }
}

// Messages stay on one line even when a token or a parser message holds control bytes.
std::string printable(std::string_view s) {
  std::string out;
  for (unsigned char c : s) {
    if (c == '\n') {
      out += "\\n";
    } else if (c == '\\') {
      out += "\\\\";
    } else if (c < 0x20 || c == 0x7F) {
      out += fmt::format("\\x{:02x}", c);
    } else {
      out += char(c);
    }
  }
  return out;
}

// ---- Character classes of the GPT-2 pattern ----------------------------------------------

enum class CharClass : uint8_t { kLetter, kNumber, kSpace, kOther };

// \s is the Unicode White_Space property, \p{L} the letter categories (Lu Ll Lt Lm Lo) and
// \p{N} the number categories (Nd Nl No), as in the regex engines Hugging Face uses.
CharClass classify_with_icu(char32_t cp) {
#ifdef HAM_WITHOUT_ICU
  HAM_FAIL("BPE tokenizer: this build has no ICU for Unicode character classes (configure "
           "with -DHAM_ICU=ON and libicu-dev installed)");
#else
  UChar32 c = UChar32(cp);
  if (u_isUWhiteSpace(c)) return CharClass::kSpace;
  uint32_t category_mask = U_GET_GC_MASK(c);
  if (category_mask & U_GC_L_MASK) return CharClass::kLetter;
  if (category_mask & U_GC_N_MASK) return CharClass::kNumber;
  return CharClass::kOther;
#endif
}

// ASCII is most of the text, so its classes come from a table (filled by ICU, so the two
// paths cannot disagree).
const std::array<CharClass, 128>& ascii_classes() {
  static const std::array<CharClass, 128> table = [] {
    std::array<CharClass, 128> t{};
    for (char32_t c = 0; c < 128; ++c) t[c] = classify_with_icu(c);
    return t;
  }();
  return table;
}

inline CharClass classify(const Utf8Char& ch) {
  if (!ch.valid) return CharClass::kOther;
  if (ch.code_point < 128) return ascii_classes()[ch.code_point];
  return classify_with_icu(ch.code_point);
}

// Calls `emit(piece)` for each piece of the GPT-2 pattern, left to right. At each position
// the alternatives are tried in the pattern's order; the character classes are disjoint,
// so the first character after the optional space decides among ` ?\p{L}+`, ` ?\p{N}+` and
// ` ?[^\s\p{L}\p{N}]+`.
template <class Emit>
void for_each_gpt2_pretoken(std::string_view text, Emit&& emit) {
  const size_t n = text.size();
  size_t i = 0;
  // End of the run of characters of class `cls` starting at `from`.
  auto run_end = [&](size_t from, CharClass cls) {
    size_t k = from;
    while (k < n) {
      Utf8Char ch = decode_utf8(text, k);
      if (classify(ch) != cls) break;
      k += size_t(ch.length);
    }
    return k;
  };
  while (i < n) {
    // 's 't 're 've 'm 'll 'd
    if (text[i] == '\'' && i + 1 < n) {
      char a = text[i + 1];
      char b = i + 2 < n ? text[i + 2] : '\0';
      size_t len = 0;
      if (a == 's' || a == 't' || a == 'm' || a == 'd') {
        len = 2;
      } else if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) {
        len = 3;
      }
      if (len > 0) {
        emit(text.substr(i, len));
        i += len;
        continue;
      }
    }
    Utf8Char first = decode_utf8(text, i);
    CharClass first_class = classify(first);
    if (first_class != CharClass::kSpace) {
      size_t end = run_end(i, first_class);
      emit(text.substr(i, end - i));
      i = end;
      continue;
    }
    // A single ' ' joins the letters, numbers or other symbols that follow it.
    if (text[i] == ' ' && i + 1 < n) {
      Utf8Char next = decode_utf8(text, i + 1);
      CharClass next_class = classify(next);
      if (next_class != CharClass::kSpace) {
        size_t end = run_end(i + 1, next_class);
        emit(text.substr(i, end - i));
        i = end;
        continue;
      }
    }
    // \s+(?!\S): a white-space run, less its last character when text follows, so that
    // character can lead the next word; \s+ takes a lone white-space character before text.
    size_t end = i, last_start = i;
    while (end < n) {
      Utf8Char ch = decode_utf8(text, end);
      if (classify(ch) != CharClass::kSpace) break;
      last_start = end;
      end += size_t(ch.length);
    }
    if (end < n && last_start > i) end = last_start;
    emit(text.substr(i, end - i));
    i = end;
  }
}

// ---- GPT-2's byte <-> character map ------------------------------------------------------

bool byte_is_printable(int b) {
  return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
}

const std::array<char32_t, 256>& byte_to_code_point() {
  static const std::array<char32_t, 256> table = [] {
    std::array<char32_t, 256> t{};
    char32_t next_unprintable = 256;
    for (int b = 0; b < 256; ++b) t[b] = byte_is_printable(b) ? char32_t(b) : next_unprintable++;
    return t;
  }();
  return table;
}

// Inverse map: code points 0..323 -> byte, -1 where no byte maps there.
const std::array<int16_t, 324>& code_point_to_byte() {
  static const std::array<int16_t, 324> table = [] {
    std::array<int16_t, 324> t;
    t.fill(-1);
    for (int b = 0; b < 256; ++b) t[byte_to_code_point()[b]] = int16_t(b);
    return t;
  }();
  return table;
}

// The bytes a byte-level piece stands for; characters outside the map (only in hand-made
// special tokens) stand for their own UTF-8.
std::string byte_level_piece_bytes(std::string_view piece) {
  std::string out;
  for (size_t i = 0; i < piece.size();) {
    Utf8Char ch = decode_utf8(piece, i);
    int byte = ch.valid && ch.code_point < 324 ? code_point_to_byte()[ch.code_point] : -1;
    if (byte >= 0) {
      out += char(byte);
    } else {
      out.append(piece.substr(i, size_t(ch.length)));
    }
    i += size_t(ch.length);
  }
  return out;
}

std::string byte_fallback_piece(int byte) { return fmt::format("<0x{:02X}>", byte); }

// ---- Small helpers -----------------------------------------------------------------------

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
template <class Value>
using StringMap = std::unordered_map<std::string, Value, StringHash, std::equal_to<>>;

uint64_t pair_key(int32_t left, int32_t right) {
  return (uint64_t(uint32_t(left)) << 32) | uint32_t(right);
}

// Splits `text` at occurrences of the given tokens (longest match at the leftmost
// position); text pieces go to on_text(piece, begins_at_input_start), matches to on_token.
struct AddedToken {
  std::string content;
  int32_t id = 0;
  bool special = false;
};

template <class OnText, class OnToken>
void split_at_added_tokens(std::string_view text, const std::vector<AddedToken>& tokens,
                           bool include_special, OnText&& on_text, OnToken&& on_token) {
  std::array<bool, 256> may_start{};
  bool any = false;
  for (const auto& t : tokens) {
    if (t.content.empty() || (t.special && !include_special)) continue;
    may_start[uint8_t(t.content[0])] = true;
    any = true;
  }
  if (!any) {
    on_text(text, true);
    return;
  }
  size_t segment_begin = 0, i = 0;
  while (i < text.size()) {
    if (!may_start[uint8_t(text[i])]) {
      ++i;
      continue;
    }
    const AddedToken* best = nullptr;
    for (const auto& t : tokens) {
      if (t.content.empty() || (t.special && !include_special)) continue;
      if (text.compare(i, t.content.size(), t.content) == 0 &&
          (!best || t.content.size() > best->content.size())) {
        best = &t;
      }
    }
    if (!best) {
      ++i;
      continue;
    }
    if (i > segment_begin) on_text(text.substr(segment_begin, i - segment_begin), segment_begin == 0);
    on_token(*best);
    i += best->content.size();
    segment_begin = i;
  }
  if (segment_begin < text.size()) on_text(text.substr(segment_begin), segment_begin == 0);
}

}  // namespace

// ---- Public helpers ----------------------------------------------------------------------

bool has_unicode_classes() {
#ifdef HAM_WITHOUT_ICU
  return false;
#else
  return true;
#endif
}

std::vector<std::string_view> split_gpt2_pretokens(std::string_view text) {
  std::vector<std::string_view> pieces;
  for_each_gpt2_pretoken(text, [&](std::string_view piece) { pieces.push_back(piece); });
  return pieces;
}

std::string byte_level_char(uint8_t byte) {
  std::string out;
  append_utf8(out, byte_to_code_point()[byte]);
  return out;
}

// ---- RawBytesTokenizer -------------------------------------------------------------------

static_assert(RawBytesTokenizer::kEndOfText == ByteTokenizer::kEndOfText &&
                  RawBytesTokenizer::kVocabSize == ByteTokenizer::kVocabSize,
              "the bytes tokenizer must keep ByteTokenizer's ids");

std::vector<int64_t> RawBytesTokenizer::encode(std::string_view text) const {
  return ByteTokenizer().encode(text);
}

std::vector<int64_t> RawBytesTokenizer::encode_with_special(std::string_view text) const {
  static const std::vector<AddedToken> kSpecial = {{"<|endoftext|>", int32_t(kEndOfText), true}};
  std::vector<int64_t> ids;
  ids.reserve(text.size());
  split_at_added_tokens(
      text, kSpecial, true,
      [&](std::string_view piece, bool) {
        for (unsigned char c : piece) ids.push_back(int64_t(c));
      },
      [&](const AddedToken& token) { ids.push_back(token.id); });
  return ids;
}

std::string RawBytesTokenizer::decode(const std::vector<int64_t>& ids) const {
  return ByteTokenizer().decode(ids);
}

int64_t RawBytesTokenizer::text_bytes(int64_t id) const {
  HAM_CHECK(id >= 0 && id < kVocabSize, "bytes tokenizer: id ", id, " is neither a byte nor <|endoftext|> (256)");
  return id < 256 ? 1 : 0;
}

// ---- BpeTokenizer ------------------------------------------------------------------------

struct BpeTokenizer::Impl {
  std::string source;
  Style style = Style::kByteLevel;

  // Vocabulary: model.vocab plus added tokens. Ids without a piece have used[id] == false.
  std::vector<std::string> pieces;
  std::vector<std::string> decoded;  // the bytes each id decodes to
  std::vector<uint8_t> used;
  std::vector<uint8_t> is_added;      // decodes to its content, whatever the style
  std::vector<int32_t> text_bytes;    // decoded[id].size(), 0 for special tokens
  std::vector<uint8_t> ends_segment;  // an added token the encoder splits text at
  StringMap<int32_t> vocab;  // model.vocab only: what BPE symbols may be
  std::vector<AddedToken> added;

  struct Merge {
    int32_t rank;
    int32_t result;
  };
  std::unordered_map<uint64_t, Merge> merges;

  int32_t unk_id = -1;
  bool fuse_unk = false;
  bool byte_fallback = false;
  bool ignore_merges = false;
  // Byte-level: the id of each byte's character. Sentencepiece: the id of <0xHH>.
  std::array<int32_t, 256> byte_ids{};

  // Byte-level pre-tokenizer options.
  bool add_prefix_space = false;
  bool use_regex = true;

  // Sentencepiece: how text becomes "▁"-marked text, and how decoding undoes it.
  struct NormalizerStep {
    enum Kind { kPrepend, kReplace } kind;
    std::string from, to;  // kPrepend: `to` is prepended to non-empty text
  };
  std::vector<NormalizerStep> normalizer;
  bool metaspace = false;  // the pre_tokenizer is Metaspace (newer Llama files)
  enum class Prepend { kNever, kFirst, kAlways } metaspace_prepend = Prepend::kAlways;
  bool metaspace_split = false;
  std::string space_marker = "\xE2\x96\x81";  // "▁"
  // Decoding strips the space the encoder prepends: at the very start of the output, and
  // after each added token when every text segment got one (the Prepend normalizer).
  bool strip_first_space = false;
  bool strip_space_after_added = false;
  // No piece holds a non-"▁" character followed by "▁", so no merge can join across the
  // start of a "▁" run: text is cut there into words that encode (and cache) separately.
  bool words_split_at_markers = false;

  int64_t eot = -1, bos = -1;

  // Word cache: pre-token bytes -> ids. Cleared when full.
  static constexpr size_t kCacheLimit = size_t(1) << 18;
  static constexpr size_t kCacheMaxWordBytes = 256;
  mutable std::mutex cache_mutex;
  mutable StringMap<std::vector<int32_t>> cache;

  [[noreturn]] void fail_missing_symbol(std::string_view what) const {
    HAM_FAIL(source, ": cannot encode ", what,
             ": it is not in model.vocab and the tokenizer has no model.unk_token",
             style == Style::kSentencePiece ? " or model.byte_fallback" : "");
  }

  // Merges adjacent symbols, lowest rank first and leftmost among equal ranks (the
  // Hugging Face order). Short words scan for the best pair; long ones use a heap so that
  // a whole sentencepiece segment costs O(n log n).
  static constexpr size_t kLinearMergeMaxSymbols = 48;
  void apply_merges(std::vector<int32_t>& symbols) const {
    if (symbols.size() < 2 || merges.empty()) return;
    if (symbols.size() <= kLinearMergeMaxSymbols) {
      while (symbols.size() >= 2) {
        int32_t best_rank = INT32_MAX, best_result = -1;
        size_t best_at = 0;
        for (size_t i = 0; i + 1 < symbols.size(); ++i) {
          auto it = merges.find(pair_key(symbols[i], symbols[i + 1]));
          if (it != merges.end() && it->second.rank < best_rank) {
            best_rank = it->second.rank;
            best_result = it->second.result;
            best_at = i;
          }
        }
        if (best_result < 0) break;
        symbols[best_at] = best_result;
        symbols.erase(symbols.begin() + std::ptrdiff_t(best_at) + 1);
      }
      return;
    }
    struct Node {
      int32_t id, prev, next;
    };
    struct Candidate {
      int32_t rank, left, left_id, right_id, result;
      bool operator>(const Candidate& o) const {
        return rank != o.rank ? rank > o.rank : left > o.left;
      }
    };
    const int32_t n = int32_t(symbols.size());
    std::vector<Node> nodes(static_cast<size_t>(n));
    for (int32_t i = 0; i < n; ++i) nodes[size_t(i)] = {symbols[size_t(i)], i - 1, i + 1 < n ? i + 1 : -1};
    std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> heap;
    auto push_pair = [&](int32_t left) {
      if (left < 0) return;
      int32_t right = nodes[size_t(left)].next;
      if (right < 0) return;
      int32_t a = nodes[size_t(left)].id, b = nodes[size_t(right)].id;
      auto it = merges.find(pair_key(a, b));
      if (it != merges.end()) heap.push({it->second.rank, left, a, b, it->second.result});
    };
    for (int32_t i = 0; i + 1 < n; ++i) push_pair(i);
    while (!heap.empty()) {
      Candidate c = heap.top();
      heap.pop();
      Node& left = nodes[size_t(c.left)];
      // Stale entries: the left symbol was merged away or changed, or its neighbour did.
      if (left.id != c.left_id || left.next < 0 || nodes[size_t(left.next)].id != c.right_id) continue;
      int32_t right = left.next;
      left.id = c.result;
      left.next = nodes[size_t(right)].next;
      if (left.next >= 0) nodes[size_t(left.next)].prev = c.left;
      nodes[size_t(right)].id = -1;
      push_pair(left.prev);
      push_pair(c.left);
    }
    symbols.clear();
    for (int32_t i = 0; i >= 0; i = nodes[size_t(i)].next) symbols.push_back(nodes[size_t(i)].id);
  }

  // The initial symbols of a word: one per byte (byte-level) or per character
  // (sentencepiece, with byte fallback or <unk> for characters outside the vocabulary).
  std::vector<int32_t> initial_symbols(std::string_view word) const {
    std::vector<int32_t> symbols;
    symbols.reserve(word.size());
    auto push_unknown = [&](std::string_view what) {
      if (unk_id < 0) fail_missing_symbol(what);
      if (!(fuse_unk && !symbols.empty() && symbols.back() == unk_id)) symbols.push_back(unk_id);
    };
    if (style == Style::kByteLevel) {
      for (unsigned char c : word) {
        if (byte_ids[c] >= 0) {
          symbols.push_back(byte_ids[c]);
        } else {
          push_unknown(fmt::format("byte 0x{:02X} (character '{}')", c, byte_level_char(c)));
        }
      }
      return symbols;
    }
    for (size_t i = 0; i < word.size();) {
      Utf8Char ch = decode_utf8(word, i);
      std::string_view text = word.substr(i, size_t(ch.length));
      auto it = ch.valid ? vocab.find(text) : vocab.end();
      if (it != vocab.end()) {
        symbols.push_back(it->second);
      } else if (byte_fallback) {
        for (unsigned char c : text) symbols.push_back(byte_ids[c]);
      } else {
        push_unknown(ch.valid ? fmt::format("character U+{:04X}", uint32_t(ch.code_point))
                              : fmt::format("invalid UTF-8 byte 0x{:02X}", uint32_t(ch.code_point)));
      }
      i += size_t(ch.length);
    }
    return symbols;
  }

  std::vector<int32_t> encode_word_uncached(std::string_view word) const {
    if (ignore_merges) {
      // The whole word as one piece when the vocabulary has it (Llama-3 style files).
      std::string key;
      if (style == Style::kByteLevel) {
        for (unsigned char c : word) key += byte_level_char(c);
      } else {
        key = word;
      }
      auto it = vocab.find(key);
      if (it != vocab.end()) return {it->second};
    }
    std::vector<int32_t> symbols = initial_symbols(word);
    apply_merges(symbols);
    return symbols;
  }

  void encode_word(std::string_view word, std::vector<int64_t>& out) const {
    if (word.empty()) return;
    if (word.size() > kCacheMaxWordBytes) {
      for (int32_t id : encode_word_uncached(word)) out.push_back(id);
      return;
    }
    {
      std::lock_guard<std::mutex> lock(cache_mutex);
      auto it = cache.find(word);
      if (it != cache.end()) {
        out.insert(out.end(), it->second.begin(), it->second.end());
        return;
      }
    }
    std::vector<int32_t> ids = encode_word_uncached(word);
    out.insert(out.end(), ids.begin(), ids.end());
    std::lock_guard<std::mutex> lock(cache_mutex);
    if (cache.size() >= kCacheLimit) cache.clear();
    cache.emplace(std::string(word), std::move(ids));
  }

  // "▁"-marked text of one segment (text between added tokens).
  std::string normalize(std::string_view text, bool at_input_start) const {
    std::string s(text);
    auto replace_all = [](std::string& str, const std::string& from, const std::string& to) {
      if (from.empty()) return;
      std::string result;
      size_t pos = 0;
      for (size_t hit; (hit = str.find(from, pos)) != std::string::npos; pos = hit + from.size()) {
        result.append(str, pos, hit - pos);
        result += to;
      }
      result.append(str, pos, std::string::npos);
      str = std::move(result);
    };
    for (const auto& step : normalizer) {
      if (step.kind == NormalizerStep::kPrepend) {
        if (!s.empty()) s.insert(0, step.to);
      } else {
        replace_all(s, step.from, step.to);
      }
    }
    if (metaspace) {
      replace_all(s, " ", space_marker);
      bool prepend = metaspace_prepend == Prepend::kAlways ||
                     (metaspace_prepend == Prepend::kFirst && at_input_start);
      if (prepend && !s.empty() && s.compare(0, space_marker.size(), space_marker) != 0) {
        s.insert(0, space_marker);
      }
    }
    return s;
  }

  void encode_segment(std::string_view text, bool at_input_start, std::vector<int64_t>& out) const {
    if (text.empty()) return;
    if (style == Style::kByteLevel) {
      std::string prefixed;
      if (add_prefix_space && text[0] != ' ') {
        prefixed = " " + std::string(text);
        text = prefixed;
      }
      if (use_regex) {
        for_each_gpt2_pretoken(text, [&](std::string_view word) { encode_word(word, out); });
      } else {
        encode_word(text, out);
      }
      return;
    }
    std::string normalized = normalize(text, at_input_start);
    std::string_view s = normalized;
    const std::string& marker = space_marker;
    if (!(metaspace_split || words_split_at_markers)) {
      encode_word(s, out);
      return;
    }
    // Cut before each marker (Metaspace split), or before each run of markers.
    size_t word_begin = 0;
    for (size_t pos = s.find(marker, 1); pos != std::string_view::npos; pos = s.find(marker, pos + marker.size())) {
      bool follows_marker = pos >= marker.size() && s.compare(pos - marker.size(), marker.size(), marker) == 0;
      if (metaspace_split || !follows_marker) {
        encode_word(s.substr(word_begin, pos - word_begin), out);
        word_begin = pos;
      }
    }
    encode_word(s.substr(word_begin), out);
  }

  std::vector<int64_t> encode(std::string_view text, bool include_special) const {
    std::vector<int64_t> out;
    out.reserve(text.size() / 3 + 8);
    split_at_added_tokens(
        text, added, include_special,
        [&](std::string_view segment, bool at_input_start) { encode_segment(segment, at_input_start, out); },
        [&](const AddedToken& token) { out.push_back(token.id); });
    return out;
  }

  std::string decode(const std::vector<int64_t>& ids) const {
    std::string out;
    size_t segment_begin = 0;
    bool strip_pending = strip_first_space;
    for (int64_t id : ids) {
      HAM_CHECK(id >= 0 && id < int64_t(used.size()) && used[size_t(id)], source, ": decode: id ", id,
                " is not in the vocabulary (", used.size(), " ids)");
      out += decoded[size_t(id)];
      if (ends_segment[size_t(id)]) {
        segment_begin = out.size();
        strip_pending = strip_space_after_added;
        continue;
      }
      if (strip_pending && out.size() > segment_begin) {
        if (out[segment_begin] == ' ') out.erase(segment_begin, 1);
        strip_pending = false;
      }
    }
    return out;
  }
};

namespace {

using Impl = BpeTokenizer::Impl;

// Field access with one-line errors naming the file and the field.
const json& require(const json& object, const char* key, const std::string& field,
                    const std::string& source) {
  HAM_CHECK(object.is_object() && object.contains(key) && !object[key].is_null(), source,
            ": tokenizer field '", field, "' is missing");
  return object[key];
}

bool optional_bool(const json& object, const char* key, bool fallback, const std::string& field,
                   const std::string& source) {
  if (!object.contains(key) || object[key].is_null()) return fallback;
  HAM_CHECK(object[key].is_boolean(), source, ": tokenizer field '", field, "' must be true or false");
  return object[key].get<bool>();
}

std::string type_of(const json& node, const std::string& field, const std::string& source) {
  const json& type = require(node, "type", field + ".type", source);
  HAM_CHECK(type.is_string(), source, ": tokenizer field '", field, ".type' must be a string");
  return type.get<std::string>();
}

void read_vocab(const json& model, Impl& t) {
  const json& vocab = require(model, "vocab", "model.vocab", t.source);
  HAM_CHECK(vocab.is_object(), t.source, ": tokenizer field 'model.vocab' must be an object of piece -> id");
  HAM_CHECK(!vocab.empty(), t.source, ": tokenizer field 'model.vocab' is empty");
  for (const auto& [piece, id_json] : vocab.items()) {
    HAM_CHECK(id_json.is_number_integer() && id_json.get<int64_t>() >= 0 &&
                  id_json.get<int64_t>() < (int64_t(1) << 31),
              t.source, ": tokenizer field 'model.vocab' gives '", printable(piece),
              "' an id that is not a non-negative 32-bit integer");
    int64_t id = id_json.get<int64_t>();
    if (size_t(id) >= t.pieces.size()) {
      t.pieces.resize(size_t(id) + 1);
      t.used.resize(size_t(id) + 1, 0);
    }
    HAM_CHECK(!t.used[size_t(id)], t.source, ": tokenizer field 'model.vocab' gives id ", id,
              " to both '", printable(t.pieces[size_t(id)]), "' and '", printable(piece), "'");
    t.pieces[size_t(id)] = piece;
    t.used[size_t(id)] = 1;
    t.vocab.emplace(piece, int32_t(id));
  }
}

void read_merges(const json& model, Impl& t) {
  const json& merges = require(model, "merges", "model.merges", t.source);
  HAM_CHECK(merges.is_array(), t.source, ": tokenizer field 'model.merges' must be an array");
  t.merges.reserve(merges.size());
  for (size_t i = 0; i < merges.size(); ++i) {
    const json& m = merges[i];
    std::string left, right;
    if (m.is_string()) {
      // "a b": pieces never hold a plain space in the string form (byte-level writes Ġ,
      // sentencepiece ▁), so exactly one space separates them.
      const std::string& s = m.get_ref<const std::string&>();
      size_t space = s.find(' ');
      HAM_CHECK(space != std::string::npos && space > 0 && space + 1 < s.size() &&
                    s.find(' ', space + 1) == std::string::npos,
                t.source, ": tokenizer field 'model.merges[", i, "]' is \"", printable(s),
                "\", expected two pieces separated by one space");
      left = s.substr(0, space);
      right = s.substr(space + 1);
    } else {
      HAM_CHECK(m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string(), t.source,
                ": tokenizer field 'model.merges[", i, "]' must be \"a b\" or [\"a\", \"b\"], got ",
                printable(m.dump()));
      left = m[0].get<std::string>();
      right = m[1].get<std::string>();
    }
    auto find = [&](const std::string& piece) {
      auto it = t.vocab.find(piece);
      HAM_CHECK(it != t.vocab.end(), t.source, ": tokenizer field 'model.merges[", i, "]' (\"",
                printable(left), " ", printable(right), "\") names '", printable(piece),
                "', which is not in model.vocab");
      return it->second;
    };
    int32_t a = find(left), b = find(right), result = find(left + right);
    t.merges.emplace(pair_key(a, b), Impl::Merge{int32_t(i), result});  // the first rank wins
  }
}

void read_added_tokens(const json& document, Impl& t) {
  if (!document.contains("added_tokens") || document["added_tokens"].is_null()) return;
  const json& added = document["added_tokens"];
  HAM_CHECK(added.is_array(), t.source, ": tokenizer field 'added_tokens' must be an array");
  for (size_t i = 0; i < added.size(); ++i) {
    std::string field = fmt::format("added_tokens[{}]", i);
    const json& id_json = require(added[i], "id", field + ".id", t.source);
    const json& content = require(added[i], "content", field + ".content", t.source);
    HAM_CHECK(id_json.is_number_integer() && id_json.get<int64_t>() >= 0 &&
                  id_json.get<int64_t>() < (int64_t(1) << 31),
              t.source, ": tokenizer field '", field, ".id' must be a non-negative 32-bit integer");
    HAM_CHECK(content.is_string() && !content.get<std::string>().empty(), t.source,
              ": tokenizer field '", field, ".content' must be a non-empty string");
    AddedToken token{content.get<std::string>(), int32_t(id_json.get<int64_t>()),
                     optional_bool(added[i], "special", false, field + ".special", t.source)};
    size_t id = size_t(token.id);
    if (id >= t.pieces.size()) {
      t.pieces.resize(id + 1);
      t.used.resize(id + 1, 0);
    }
    HAM_CHECK(!t.used[id] || t.pieces[id] == token.content, t.source, ": tokenizer field '", field,
              "' gives id ", id, " to '", printable(token.content), "', but model.vocab gives it to '",
              printable(t.pieces[id]), "'");
    t.pieces[id] = token.content;
    t.used[id] = 1;
    t.added.push_back(std::move(token));
  }
}

void read_normalizer_step(const json& node, const std::string& field, Impl& t) {
  std::string type = type_of(node, field, t.source);
  if (type == "Sequence") {
    const json& steps = require(node, "normalizers", field + ".normalizers", t.source);
    HAM_CHECK(steps.is_array(), t.source, ": tokenizer field '", field, ".normalizers' must be an array");
    for (size_t i = 0; i < steps.size(); ++i) {
      read_normalizer_step(steps[i], fmt::format("{}.normalizers[{}]", field, i), t);
    }
  } else if (type == "Prepend") {
    const json& prepend = require(node, "prepend", field + ".prepend", t.source);
    HAM_CHECK(prepend.is_string(), t.source, ": tokenizer field '", field, ".prepend' must be a string");
    t.normalizer.push_back({Impl::NormalizerStep::kPrepend, "", prepend.get<std::string>()});
  } else if (type == "Replace") {
    const json& pattern = require(node, "pattern", field + ".pattern", t.source);
    const json& content = require(node, "content", field + ".content", t.source);
    HAM_CHECK(pattern.is_object() && pattern.contains("String") && pattern["String"].is_string(),
              t.source, ": tokenizer field '", field,
              ".pattern' must be {\"String\": ...} (regex patterns are not supported)");
    HAM_CHECK(content.is_string(), t.source, ": tokenizer field '", field, ".content' must be a string");
    t.normalizer.push_back({Impl::NormalizerStep::kReplace, pattern["String"].get<std::string>(),
                            content.get<std::string>()});
  } else {
    HAM_FAIL(t.source, ": tokenizer field '", field, ".type' is '", printable(type),
             "'; only Prepend, Replace and Sequence normalizers are supported");
  }
}

// Decides the style from the pre-tokenizer and normalizer, reading their options.
void read_pipeline(const json& document, Impl& t) {
  const json no_node;
  const json& pre = document.contains("pre_tokenizer") ? document["pre_tokenizer"] : no_node;
  const json& norm = document.contains("normalizer") ? document["normalizer"] : no_node;
  if (!norm.is_null()) read_normalizer_step(norm, "normalizer", t);

  const json* byte_level = nullptr;
  const json* metaspace = nullptr;
  if (!pre.is_null()) {
    std::string type = type_of(pre, "pre_tokenizer", t.source);
    const json* node = &pre;
    std::string field = "pre_tokenizer";
    if (type == "Sequence") {
      const json& list = require(pre, "pretokenizers", "pre_tokenizer.pretokenizers", t.source);
      HAM_CHECK(list.is_array() && list.size() == 1, t.source,
                ": tokenizer field 'pre_tokenizer.pretokenizers' must hold exactly one pre-tokenizer "
                "(ByteLevel or Metaspace); regex Split pre-tokenizers are not supported");
      node = &list[0];
      field = "pre_tokenizer.pretokenizers[0]";
      type = type_of(*node, field, t.source);
    }
    if (type == "ByteLevel") {
      byte_level = node;
      t.add_prefix_space = optional_bool(*node, "add_prefix_space", false, field + ".add_prefix_space", t.source);
      t.use_regex = optional_bool(*node, "use_regex", true, field + ".use_regex", t.source);
    } else if (type == "Metaspace") {
      metaspace = node;
      if (node->contains("replacement") && (*node)["replacement"].is_string()) {
        t.space_marker = (*node)["replacement"].get<std::string>();
      }
      HAM_CHECK(!t.space_marker.empty(), t.source, ": tokenizer field '", field, ".replacement' is empty");
      t.metaspace_split = optional_bool(*node, "split", true, field + ".split", t.source);
      if (node->contains("prepend_scheme") && (*node)["prepend_scheme"].is_string()) {
        std::string scheme = (*node)["prepend_scheme"].get<std::string>();
        if (scheme == "always") {
          t.metaspace_prepend = Impl::Prepend::kAlways;
        } else if (scheme == "first") {
          t.metaspace_prepend = Impl::Prepend::kFirst;
        } else if (scheme == "never") {
          t.metaspace_prepend = Impl::Prepend::kNever;
        } else {
          HAM_FAIL(t.source, ": tokenizer field '", field, ".prepend_scheme' is '", printable(scheme),
                   "', expected always, first or never");
        }
      } else {
        bool add = optional_bool(*node, "add_prefix_space", true, field + ".add_prefix_space", t.source);
        t.metaspace_prepend = add ? Impl::Prepend::kAlways : Impl::Prepend::kNever;
      }
    } else {
      HAM_FAIL(t.source, ": tokenizer field '", field, ".type' is '", printable(type),
               "'; only ByteLevel (GPT-2) and Metaspace (sentencepiece) pre-tokenizers are supported");
    }
  }

  if (byte_level) {
    HAM_CHECK(t.normalizer.empty(), t.source,
              ": tokenizer field 'normalizer' must be null for a ByteLevel pre-tokenizer");
    t.style = BpeTokenizer::Style::kByteLevel;
    return;
  }
  t.style = BpeTokenizer::Style::kSentencePiece;
  if (metaspace) {
    t.metaspace = true;
    t.strip_first_space = t.metaspace_prepend != Impl::Prepend::kNever;
    t.strip_space_after_added = t.metaspace_prepend == Impl::Prepend::kAlways;
    return;
  }
  // Without a pre-tokenizer the normalizer must mark spaces, as Llama-2's
  // Sequence[Prepend("▁"), Replace(" " -> "▁")] does.
  const Impl::NormalizerStep* space_step = nullptr;
  bool prepends_marker = false;
  for (const auto& step : t.normalizer) {
    if (step.kind == Impl::NormalizerStep::kReplace && step.from == " ") space_step = &step;
  }
  HAM_CHECK(space_step && !space_step->to.empty(), t.source,
            ": tokenizer field 'pre_tokenizer' is missing: expected a ByteLevel (GPT-2) or Metaspace "
            "pre-tokenizer, or a normalizer that replaces ' ' with '\u2581' (sentencepiece)");
  t.space_marker = space_step->to;
  for (const auto& step : t.normalizer) {
    if (step.kind == Impl::NormalizerStep::kPrepend && (step.to == t.space_marker || step.to == " ")) {
      prepends_marker = true;
    }
  }
  t.strip_first_space = prepends_marker;
  t.strip_space_after_added = prepends_marker;
}

void finish(Impl& t) {
  t.decoded.resize(t.pieces.size());
  t.is_added.assign(t.pieces.size(), 0);
  for (const auto& token : t.added) t.is_added[size_t(token.id)] = 1;
  t.ends_segment = t.is_added;
  t.byte_ids.fill(-1);

  if (t.style == BpeTokenizer::Style::kByteLevel) {
    for (int b = 0; b < 256; ++b) {
      auto it = t.vocab.find(byte_level_char(uint8_t(b)));
      if (it != t.vocab.end()) t.byte_ids[size_t(b)] = it->second;
    }
    for (size_t id = 0; id < t.pieces.size(); ++id) {
      t.decoded[id] = t.is_added[id] ? t.pieces[id] : byte_level_piece_bytes(t.pieces[id]);
    }
  } else {
    if (t.byte_fallback) {
      for (int b = 0; b < 256; ++b) {
        std::string piece = byte_fallback_piece(b);
        auto it = t.vocab.find(piece);
        HAM_CHECK(it != t.vocab.end(), t.source,
                  ": tokenizer field 'model.byte_fallback' is true but model.vocab has no '", piece, "'");
        t.byte_ids[size_t(b)] = it->second;
      }
    }
    for (size_t id = 0; id < t.pieces.size(); ++id) {
      const std::string& piece = t.pieces[id];
      if (t.is_added[id]) {
        t.decoded[id] = piece;
        continue;
      }
      std::string text;
      for (size_t pos = 0, hit; pos < piece.size(); pos = hit + t.space_marker.size()) {
        hit = piece.find(t.space_marker, pos);
        text.append(piece, pos, hit == std::string::npos ? std::string::npos : hit - pos);
        if (hit == std::string::npos) break;
        text += ' ';
      }
      t.decoded[id] = text;
    }
    if (t.byte_fallback) {
      // Byte pieces stay bytes even when listed as added tokens (trainers list them so).
      for (int b = 0; b < 256; ++b) {
        t.decoded[size_t(t.byte_ids[size_t(b)])] = std::string(1, char(b));
        t.ends_segment[size_t(t.byte_ids[size_t(b)])] = 0;
      }
    }
    // Can words be cut before "▁" runs? Only if no merge result may span such a cut.
    const std::string& m = t.space_marker;
    bool spanning_piece = t.vocab.find(m) == t.vocab.end();
    for (const auto& [piece, id] : t.vocab) {
      for (size_t pos = piece.find(m, 1); pos != std::string::npos && !spanning_piece; pos = piece.find(m, pos + 1)) {
        bool after_marker = pos >= m.size() && piece.compare(pos - m.size(), m.size(), m) == 0;
        if (!after_marker) spanning_piece = true;
      }
      if (spanning_piece) break;
    }
    // ignore_merges looks the whole word up first, so cutting would change its words.
    t.words_split_at_markers = !spanning_piece && !t.ignore_merges;
  }

  t.text_bytes.assign(t.pieces.size(), 0);
  for (size_t id = 0; id < t.pieces.size(); ++id) t.text_bytes[id] = int32_t(t.decoded[id].size());
  for (const auto& token : t.added) {
    if (token.special) t.text_bytes[size_t(token.id)] = 0;
  }

  // EOT and BOS by their conventional names, preferring added (special) tokens.
  auto find_named = [&](std::initializer_list<const char*> names) -> int64_t {
    for (const char* name : names) {
      for (const auto& token : t.added) {
        if (token.content == name) return token.id;
      }
    }
    for (const char* name : names) {
      auto it = t.vocab.find(std::string_view(name));
      if (it != t.vocab.end()) return it->second;
    }
    return -1;
  };
  t.eot = find_named({"<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>"});
  t.bos = find_named({"<|begin_of_text|>", "<s>", "<bos>"});
}

}  // namespace

BpeTokenizer::BpeTokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
BpeTokenizer::BpeTokenizer(BpeTokenizer&&) noexcept = default;
BpeTokenizer& BpeTokenizer::operator=(BpeTokenizer&&) noexcept = default;
BpeTokenizer::~BpeTokenizer() = default;

BpeTokenizer BpeTokenizer::from_tokenizer_json(const std::string& path) {
  const std::string text = read_file(path, "the tokenizer file");
  json document;
  try {
    document = json::parse(text);
  } catch (const json::exception& e) {
    HAM_FAIL(path, ": tokenizer file is not valid JSON: ", printable(e.what()));
  }
  return from_json(document, path);
}

BpeTokenizer BpeTokenizer::from_json(const json& document, const std::string& source) {
  auto t = std::make_unique<Impl>();
  t->source = source;
  HAM_CHECK(document.is_object(), source, ": a tokenizer.json must hold a JSON object");
  const json& model = require(document, "model", "model", source);
  HAM_CHECK(model.is_object(), source, ": tokenizer field 'model' must be an object");
  std::string type = type_of(model, "model", source);
  HAM_CHECK(type == "BPE", source, ": tokenizer field 'model.type' is '", printable(type),
            "'; only BPE models are supported");
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (model.contains(key) && !model[key].is_null()) {
      HAM_CHECK(model[key].is_string() && model[key].get<std::string>().empty(), source,
                ": tokenizer field 'model.", key, "' must be empty (word-piece markers are not supported)");
    }
  }
  read_vocab(model, *t);
  read_merges(model, *t);
  t->byte_fallback = optional_bool(model, "byte_fallback", false, "model.byte_fallback", source);
  t->fuse_unk = optional_bool(model, "fuse_unk", false, "model.fuse_unk", source);
  t->ignore_merges = optional_bool(model, "ignore_merges", false, "model.ignore_merges", source);
  if (model.contains("unk_token") && !model["unk_token"].is_null()) {
    HAM_CHECK(model["unk_token"].is_string(), source, ": tokenizer field 'model.unk_token' must be a string");
    std::string unk = model["unk_token"].get<std::string>();
    auto it = t->vocab.find(unk);
    HAM_CHECK(it != t->vocab.end(), source, ": tokenizer field 'model.unk_token' is '", printable(unk),
              "', which is not in model.vocab");
    t->unk_id = it->second;
  }
  read_added_tokens(document, *t);
  read_pipeline(document, *t);
  finish(*t);
  return BpeTokenizer(std::move(t));
}

std::vector<int64_t> BpeTokenizer::encode(std::string_view text) const { return impl_->encode(text, false); }
std::vector<int64_t> BpeTokenizer::encode_with_special(std::string_view text) const {
  return impl_->encode(text, true);
}
std::string BpeTokenizer::decode(const std::vector<int64_t>& ids) const { return impl_->decode(ids); }
int64_t BpeTokenizer::vocab_size() const { return int64_t(impl_->pieces.size()); }
int64_t BpeTokenizer::text_bytes(int64_t id) const {
  HAM_CHECK(id >= 0 && id < vocab_size(), impl_->source, ": id ", id, " is not in the vocabulary (", vocab_size(),
            " ids)");
  return impl_->text_bytes[size_t(id)];
}
int64_t BpeTokenizer::eot_id() const { return impl_->eot; }
int64_t BpeTokenizer::bos_id() const { return impl_->bos; }
BpeTokenizer::Style BpeTokenizer::style() const { return impl_->style; }

std::string BpeTokenizer::name() const {
  return fmt::format("{} ({} BPE, {} tokens)", impl_->source,
                     impl_->style == Style::kByteLevel ? "byte-level" : "sentencepiece", vocab_size());
}

int64_t BpeTokenizer::token_id(std::string_view piece) const {
  for (const auto& token : impl_->added) {
    if (token.content == piece) return token.id;
  }
  auto it = impl_->vocab.find(piece);
  return it == impl_->vocab.end() ? -1 : it->second;
}

const std::string& BpeTokenizer::piece(int64_t id) const {
  HAM_CHECK(id >= 0 && id < vocab_size() && impl_->used[size_t(id)], impl_->source, ": id ", id,
            " is not in the vocabulary (", vocab_size(), " ids)");
  return impl_->pieces[size_t(id)];
}

std::unique_ptr<Tokenizer> load_tokenizer(const std::string& spec) {
  if (spec == "bytes") return std::make_unique<RawBytesTokenizer>();
  return std::make_unique<BpeTokenizer>(BpeTokenizer::from_tokenizer_json(spec));
}

}  // namespace ham
