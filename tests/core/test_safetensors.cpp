#include "core/safetensors.h"

#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <string>

#include "core/crc32c.h"

namespace ham {
namespace {

namespace fs = std::filesystem;

std::string le64(uint64_t n) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[size_t(i)] = char((n >> (8 * i)) & 0xff);
  return out;
}

// A file: 8-byte little-endian header length, the header, the data section.
std::string file_bytes(const std::string& header, const std::string& data = "") {
  return le64(header.size()) + header + data;
}

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void write_file(const fs::path& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out << bytes;
}

std::string tensor_bytes(const Tensor& t) {
  Tensor host = t.to(Device::cpu());
  return std::string(static_cast<const char*>(host.raw_data()), host.nbytes());
}

// A fresh directory per test, removed afterwards.
class SafetensorsFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() /
           ("ham_safetensors_" + std::to_string(::getpid()) + "_" + info->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Names of the directory's entries other than `except`.
  std::vector<std::string> other_entries(const std::string& except) const {
    std::vector<std::string> names;
    for (const auto& entry : fs::directory_iterator(dir_)) {
      if (entry.path().filename() != except) names.push_back(entry.path().filename().string());
    }
    return names;
  }

  fs::path dir_;
};

std::vector<std::pair<std::string, Tensor>> every_dtype() {
  return {
      {"f32", Tensor::from_vector<float>({1.5f, -2.25f, 3e-8f, 1e30f, 0.0f, -0.0f}, {2, 3})},
      {"f64", Tensor::from_vector<double>({3.141592653589793, -1e-300, 1e300}, {3})},
      {"bf16", Tensor::from_vector<BFloat16>(
                   {float_to_bf16(1.0f), float_to_bf16(-3.5f), BFloat16{0x7fc0}, BFloat16{0x0001}},
                   {2, 2})},
      {"i32", Tensor::from_vector<int32_t>({std::numeric_limits<int32_t>::min(), -1, 0,
                                            std::numeric_limits<int32_t>::max()},
                                           {4})},
      {"i64", Tensor::from_vector<int64_t>({int64_t(1) << 60, -7}, {1, 2})},
      {"u8", Tensor::from_vector<uint8_t>({0, 1, 128, 255, 7}, {5})},
      {"scalar", Tensor::scalar(42.5)},
      {"empty_rows", Tensor::zeros({0, 5}, DType::F64)},
      {"empty_cols", Tensor::zeros({3, 0}, DType::I32)},
  };
}

void expect_same_tensors(const std::vector<std::pair<std::string, Tensor>>& expected,
                         const SafetensorsFile& file) {
  ASSERT_EQ(file.tensors.size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    const auto& [name, tensor] = expected[i];
    SCOPED_TRACE(name);
    EXPECT_EQ(file.tensors[i].first, name);  // file order is the order given to save
    const Tensor& loaded = file.at(name);
    EXPECT_EQ(loaded.dtype(), tensor.dtype());
    EXPECT_EQ(loaded.shape(), tensor.shape());
    EXPECT_TRUE(loaded.device().is_cpu());
    EXPECT_EQ(tensor_bytes(loaded), tensor_bytes(tensor));
  }
}

TEST_F(SafetensorsFiles, RoundTripEveryDtypeWithMetadata) {
  auto tensors = every_dtype();
  std::map<std::string, std::string> metadata{{"format", "pt"}, {"step", "1200"},
                                              {"note", "quote \" and ünïcode"}};
  fs::path path = dir_ / "model.safetensors";
  save_safetensors(path.string(), tensors, metadata);
  SafetensorsFile file = load_safetensors(path.string());
  expect_same_tensors(tensors, file);
  EXPECT_EQ(file.metadata, metadata);
  EXPECT_EQ(file.label, path.string());
  EXPECT_TRUE(file.contains("bf16"));
  EXPECT_FALSE(file.contains("missing"));
  EXPECT_TRUE(std::isnan(file.at("bf16").to_vector<float>()[2]));
  EXPECT_EQ(file.at("scalar").dim(), 0);
  EXPECT_EQ(file.at("scalar").item(), 42.5);
  EXPECT_TRUE(other_entries("model.safetensors").empty());  // no temp file left
  // The in-memory writer produces the same bytes.
  EXPECT_EQ(read_file(path), serialize_safetensors(tensors, metadata));
}

TEST_F(SafetensorsFiles, EmptyFileListAndNoMetadataRoundTrip) {
  fs::path path = dir_ / "empty.safetensors";
  save_safetensors(path.string(), {});
  EXPECT_EQ(read_file(path), file_bytes(R"({"__metadata__":{"ham.data_crc32c":"00000000"}} )"));
  SafetensorsFile file = load_safetensors(path.string());
  EXPECT_TRUE(file.tensors.empty());
  EXPECT_TRUE(file.metadata.empty());
}

TEST(Safetensors, HeaderIsPaddedWithSpacesToAMultipleOf8) {
  for (int length = 1; length <= 16; ++length) {
    std::string name(size_t(length), 'w');
    std::string bytes = serialize_safetensors({{name, Tensor::zeros({3}, DType::BF16)}});
    uint64_t header_size = 0;
    std::memcpy(&header_size, bytes.data(), 8);
    EXPECT_EQ(header_size % 8, 0u) << name;
    EXPECT_EQ(bytes.size(), 8 + header_size + 6);
    std::string header = bytes.substr(8, header_size);
    size_t close = header.rfind('}');
    EXPECT_LT(header.size() - close, 9u);
    EXPECT_EQ(header.find_first_not_of(' ', close + 1), std::string::npos) << header;
  }
}

TEST(Safetensors, BytesMatchHandAssembledFile) {
  Tensor a = Tensor::from_vector<float>({1.0f, -2.0f}, {2});
  Tensor b = Tensor::from_vector<uint8_t>({0xab}, {1, 1});
  std::string header =
      R"({"__metadata__":{"k":"v","ham.data_crc32c":"d22a8636"},)"
      R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
      R"("b":{"dtype":"U8","shape":[1,1],"data_offsets":[8,9]}})";
  header.append((8 - header.size() % 8) % 8, ' ');
  ASSERT_EQ(header.size(), 168u);  // 162 bytes of JSON + 6 spaces
  // CRC-32C of these 9 bytes: d22a8636 (a bitwise CRC in Python gives the same).
  std::string data("\x00\x00\x80\x3f\x00\x00\x00\xc0\xab", 9);
  std::string expected = std::string("\xa8\x00\x00\x00\x00\x00\x00\x00", 8) + header + data;
  EXPECT_EQ(serialize_safetensors({{"a", a}, {"b", b}}, {{"k", "v"}}), expected);
  SafetensorsFile file = parse_safetensors(expected, "hand.safetensors");
  EXPECT_EQ(file.at("a").to_vector<float>(), (std::vector<float>{1.0f, -2.0f}));
  EXPECT_EQ(file.at("b").to_vector<int64_t>(), (std::vector<int64_t>{0xab}));
  EXPECT_EQ(file.metadata.at("k"), "v");
}

TEST(Safetensors, ReaderAcceptsAnyKeyOrderAndSortsByOffset) {
  std::string header =
      R"({"z":{"dtype":"I32","shape":[1],"data_offsets":[0,4]},)"
      R"("e":{"shape":[0],"data_offsets":[4,4],"dtype":"F64"},)"
      R"("a":{"data_offsets":[4,6],"dtype":"BF16","shape":[]}})";
  SafetensorsFile file =
      parse_safetensors(file_bytes(header, std::string("\x05\x00\x00\x00\x80\x3f", 6)), "x");
  ASSERT_EQ(file.tensors.size(), 3u);
  EXPECT_EQ(file.tensors[0].first, "z");
  EXPECT_EQ(file.tensors[1].first, "e");
  EXPECT_EQ(file.tensors[2].first, "a");
  EXPECT_EQ(file.at("z").item(), 5.0);
  EXPECT_EQ(file.at("a").item(), 1.0);
  EXPECT_EQ(file.at("e").numel(), 0);
}

// Asserts that fn throws a one-line ham::Error that names `label` and contains every keyword.
void expect_error(const std::function<void()>& fn, const std::string& label,
                  const std::vector<std::string>& keywords) {
  try {
    fn();
    ADD_FAILURE() << "no error; expected one containing '" << keywords.front() << "'";
  } catch (const Error& e) {
    std::string message = e.what();
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
    EXPECT_EQ(message.rfind(label, 0), 0u) << "message should start with the label: " << message;
    for (const std::string& keyword : keywords) {
      EXPECT_NE(message.find(keyword), std::string::npos) << "'" << keyword << "' in: " << message;
    }
  }
}

const std::string kLabel = "bad.safetensors";

void expect_rejected(const std::string& bytes, const std::vector<std::string>& keywords) {
  expect_error([&] { parse_safetensors(bytes, kLabel); }, kLabel, keywords);
}

std::string f32_entry(const std::string& name, const std::string& shape, uint64_t begin,
                      uint64_t end) {
  return "\"" + name + R"(":{"dtype":"F32","shape":)" + shape + R"(,"data_offsets":[)" +
         std::to_string(begin) + "," + std::to_string(end) + "]}";
}

// The checksum's metadata text for `data`: 8 lowercase hex digits of its CRC-32C.
std::string checksum_of(const std::string& data) {
  char text[9];
  std::snprintf(text, sizeof(text), "%08x", crc32c(data));
  return text;
}

// "{e1,e2,...}" (built by appending: GCC 12 warns falsely on "literal" + std::string&&).
std::string json_object(const std::vector<std::string>& entries) {
  std::string out = "{";
  for (size_t i = 0; i < entries.size(); ++i) {
    if (i) out += ",";
    out += entries[i];
  }
  return out + "}";
}

TEST(SafetensorsRejects, FileShorterThan8Bytes) {
  expect_rejected("", {"0 bytes", "shorter than the 8-byte header length"});
  expect_rejected(std::string("\x02\x00\x00\x00\x00", 5), {"5 bytes", "shorter"});
}

TEST(SafetensorsRejects, HeaderLengthOverLimit) {
  expect_rejected(le64(100'000'001) + "{}", {"header length 100000001", "exceeds"});
  expect_rejected(le64(std::numeric_limits<uint64_t>::max()), {"exceeds"});
}

TEST(SafetensorsRejects, TruncatedHeader) {
  expect_rejected(le64(100) + R"({"a":{"dtype")", {"header of 100 bytes", "past end of file"});
}

TEST(SafetensorsRejects, HeaderNotUtf8) {
  expect_rejected(file_bytes("{\"\xff\xfe\":1}"), {"not valid UTF-8"});
  expect_rejected(file_bytes("{\"\xc0\xaf\":1}"), {"UTF-8"});          // overlong '/'
  expect_rejected(file_bytes("{\"\xed\xa0\x80\":1}"), {"UTF-8"});      // surrogate
}

TEST(SafetensorsRejects, HeaderNotJson) {
  expect_rejected(file_bytes(R"({"a":)"), {"not valid JSON"});
  expect_rejected(file_bytes("{} {}"), {"not valid JSON"});
  expect_rejected(file_bytes(""), {"not valid JSON"});
}

TEST(SafetensorsRejects, HeaderNotAnObject) {
  expect_rejected(file_bytes("[1, 2]"), {"not a JSON object", "array"});
}

TEST(SafetensorsRejects, DuplicateTensorKey) {
  expect_rejected(file_bytes(json_object({f32_entry("w", "[1]", 0, 4), f32_entry("w", "[1]", 4, 8)}),
                             std::string(8, '\0')),
                  {"'w'", "more than once"});
}

TEST(SafetensorsRejects, EntryMissingOrMistypedFields) {
  expect_rejected(file_bytes(R"({"w":{"dtype":"F32","shape":[1]}})", "abcd"),
                  {"tensor 'w'", "missing \"data_offsets\""});
  expect_rejected(file_bytes(R"({"w":{"shape":[1],"data_offsets":[0,4]}})", "abcd"),
                  {"tensor 'w'", "missing \"dtype\""});
  expect_rejected(file_bytes(R"({"w":{"dtype":"F32","data_offsets":[0,4]}})", "abcd"),
                  {"tensor 'w'", "missing \"shape\""});
  expect_rejected(file_bytes(R"({"w":7})"), {"tensor 'w'", "must be a JSON object"});
  expect_rejected(file_bytes(R"({"w":{"dtype":32,"shape":[1],"data_offsets":[0,4]}})", "abcd"),
                  {"tensor 'w'", "\"dtype\" must be a string"});
  expect_rejected(file_bytes(R"({"w":{"dtype":"F32","shape":4,"data_offsets":[0,4]}})", "abcd"),
                  {"tensor 'w'", "\"shape\" must be an array"});
}

TEST(SafetensorsRejects, NegativeOrNonIntegerShape) {
  expect_rejected(file_bytes(json_object({f32_entry("w", "[2,-1]", 0, 4)}), "abcd"),
                  {"tensor 'w'", "negative dimension -1"});
  expect_rejected(file_bytes(json_object({f32_entry("w", "[1.5]", 0, 4)}), "abcd"),
                  {"tensor 'w'", "non-integer dimension"});
  expect_rejected(file_bytes(json_object({f32_entry("w", R"(["1"])", 0, 4)}), "abcd"),
                  {"tensor 'w'", "non-integer dimension"});
}

TEST(SafetensorsRejects, ShapeWhoseElementCountOverflows) {
  expect_rejected(file_bytes(json_object({f32_entry("w", "[4294967296,4294967296]", 0, 4)}), "abcd"),
                  {"tensor 'w'", "overflows"});
  expect_rejected(file_bytes(json_object({f32_entry("w", "[18446744073709551615]", 0, 4)}), "abcd"),
                  {"tensor 'w'", "overflows"});
  // numel fits int64 but numel * 4 bytes does not.
  expect_rejected(file_bytes(json_object({f32_entry("w", "[4611686018427387904,2]", 0, 4)}), "abcd"),
                  {"tensor 'w'", "overflows"});
}

TEST(SafetensorsRejects, MalformedDataOffsets) {
  expect_rejected(file_bytes(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[4]}})", "abcd"),
                  {"tensor 'w'", "data_offsets"});
  expect_rejected(file_bytes(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[-4,0]}})", "abcd"),
                  {"tensor 'w'", "data_offsets"});
  expect_rejected(file_bytes(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[4,0]}})", "abcd"),
                  {"tensor 'w'", "begin > end"});
}

TEST(SafetensorsRejects, ByteCountDiffersFromShape) {
  expect_rejected(file_bytes(json_object({f32_entry("w", "[2]", 0, 4)}), "abcd"),
                  {"tensor 'w'", "f32[2]", "needs 8 bytes", "hold 4"});
}

TEST(SafetensorsRejects, OverlappingOffsets) {
  expect_rejected(
      file_bytes(json_object({f32_entry("a", "[2]", 0, 8), f32_entry("b", "[2]", 4, 12)}),
                 std::string(12, '\0')),
      {"'b'", "overlap", "'a'"});
}

TEST(SafetensorsRejects, GapBetweenOrBeforeTensors) {
  expect_rejected(
      file_bytes(json_object({f32_entry("a", "[1]", 0, 4), f32_entry("b", "[1]", 8, 12)}),
                 std::string(12, '\0')),
      {"gap of 4 bytes", "'a'", "'b'"});
  expect_rejected(file_bytes(json_object({f32_entry("a", "[1]", 4, 8)}), std::string(8, '\0')),
                  {"gap of 4 bytes", "first tensor 'a'"});
}

TEST(SafetensorsRejects, TrailingBytesAfterLastTensor) {
  expect_rejected(file_bytes(json_object({f32_entry("a", "[1]", 0, 4)}), std::string(6, '\0')),
                  {"2 trailing bytes"});
  expect_rejected(file_bytes("{}", "x"), {"1 trailing bytes"});
}

TEST(SafetensorsRejects, TensorDataPastEndOfFile) {
  expect_rejected(file_bytes(json_object({f32_entry("a", "[2]", 0, 8)}), std::string(4, '\0')),
                  {"tensor 'a'", "past end of file"});
}

TEST(SafetensorsRejects, UnsupportedDtypes) {
  for (std::string dtype : {"F16", "I8", "BOOL", "F8_E4M3", "U16", "f32", ""}) {
    SCOPED_TRACE(dtype);
    expect_rejected(
        file_bytes(R"({"emb":{"dtype":")" + dtype + R"(","shape":[1],"data_offsets":[0,2]}})",
                   "ab"),
        {"tensor 'emb'", std::string("dtype ") + dtype + ",", "not supported"});
  }
}

TEST(SafetensorsRejects, MetadataNotStringToString) {
  expect_rejected(file_bytes(R"({"__metadata__":{"step":12}})"),
                  {"__metadata__", "'step'", "number"});
  expect_rejected(file_bytes(R"({"__metadata__":["a"]})"), {"__metadata__", "array"});
  expect_rejected(file_bytes(R"({"__metadata__":{"k":{"nested":"x"}}})"), {"__metadata__"});
}

TEST_F(SafetensorsFiles, LoadErrorsNameThePath) {
  fs::path missing = dir_ / "missing.safetensors";
  expect_error([&] { load_safetensors(missing.string()); }, missing.string(),
               {"cannot open", "No such file or directory"});
  fs::path truncated = dir_ / "truncated.safetensors";
  write_file(truncated, le64(64) + "{}");
  expect_error([&] { load_safetensors(truncated.string()); }, truncated.string(),
               {"past end of file"});
  expect_error([&] { load_safetensors(dir_.string()); }, dir_.string(), {"not a regular file"});
}

TEST(Safetensors, MissingKeyErrorNamesFileAndKey) {
  SafetensorsFile file = parse_safetensors(serialize_safetensors({{"a", Tensor::scalar(1)}}),
                                           "ckpt.safetensors");
  expect_error([&] { file.at("lm_head.weight"); }, "ckpt.safetensors",
               {"no tensor named 'lm_head.weight'"});
}

TEST(Safetensors, WriterRejectsDuplicateReservedAndUndefinedNames) {
  Tensor t = Tensor::scalar(1);
  expect_error([&] { serialize_safetensors({{"a", t}, {"b", t}, {"a", t}}); }, "safetensors",
               {"duplicate tensor name 'a'"});
  expect_error([&] { serialize_safetensors({{"__metadata__", t}}); }, "safetensors",
               {"'__metadata__' is reserved"});
  expect_error([&] { serialize_safetensors({{"u", Tensor()}}); }, "safetensors",
               {"'u' is undefined"});
}

TEST_F(SafetensorsFiles, SaveReplacesAnExistingFile) {
  fs::path path = dir_ / "ckpt.safetensors";
  save_safetensors(path.string(), {{"w", Tensor::full({4}, 1.0)}});
  save_safetensors(path.string(), {{"w", Tensor::full({2}, 2.0)}}, {{"step", "2"}});
  SafetensorsFile file = load_safetensors(path.string());
  EXPECT_EQ(file.at("w").to_vector<float>(), (std::vector<float>{2.0f, 2.0f}));
  EXPECT_EQ(file.metadata.at("step"), "2");
  EXPECT_TRUE(other_entries("ckpt.safetensors").empty());
}

// A bit flipped anywhere in the data section (the first, a middle and the last byte of the
// tensors) fails the load with the file's name; the untouched file loads.
TEST_F(SafetensorsFiles, AFlippedBitInTheTensorDataIsACorruptFileError) {
  fs::path path = dir_ / "model.safetensors";
  save_safetensors(path.string(), every_dtype(), {{"step", "7"}});
  const std::string good = read_file(path);
  uint64_t header_size = 0;
  std::memcpy(&header_size, good.data(), 8);
  const size_t data_start = 8 + size_t(header_size);
  ASSERT_GT(good.size(), data_start + 2);
  EXPECT_NO_THROW(load_safetensors(path.string()));
  for (size_t at : {data_start, (data_start + good.size()) / 2, good.size() - 1}) {
    std::string bad = good;
    bad[at] = char(bad[at] ^ 0x10);
    std::ofstream(path, std::ios::binary | std::ios::trunc) << bad;
    expect_error([&] { load_safetensors(path.string()); }, path.string(),
                 {"tensor data fails its checksum", kDataChecksumKey, "the file is corrupt"});
  }
}

TEST(SafetensorsRejects, ChecksumThatIsMalformedOrWrong) {
  const std::string data("\x00\x00\x80\x3f", 4);
  auto with_checksum = [&](const std::string& value) {
    return file_bytes(R"({"__metadata__":{"ham.data_crc32c":")" + value + R"("},)" +
                          f32_entry("a", "[1]", 0, 4) + "}",
                      data);
  };
  expect_rejected(with_checksum("xyz"), {kDataChecksumKey, "8 lowercase hex digits", "'xyz'"});
  expect_rejected(with_checksum("0000000G"), {"8 lowercase hex digits"});
  expect_rejected(with_checksum("00000000"), {"fails its checksum", "4 data bytes"});
  const std::string right = with_checksum(checksum_of(data));
  SafetensorsFile file = parse_safetensors(right, "ok.safetensors");
  EXPECT_EQ(file.at("a").item(), 1.0);
  EXPECT_TRUE(file.metadata.empty());  // the checksum is the reader's, not the caller's
}

TEST(Safetensors, WriterReservesTheChecksumKey) {
  expect_error([&] { serialize_safetensors({}, {{kDataChecksumKey, "00000000"}}); },
               "safetensors", {"metadata key 'ham.data_crc32c' is reserved"});
}

TEST_F(SafetensorsFiles, FailedSaveOfInvalidListLeavesOldFileAndNoTemp) {
  fs::path path = dir_ / "ckpt.safetensors";
  save_safetensors(path.string(), {{"w", Tensor::full({4}, 1.0)}});
  std::string before = read_file(path);
  Tensor t = Tensor::full({1000}, 3.0);
  expect_error([&] { save_safetensors(path.string(), {{"w", t}, {"w", t}}); },
               "save_safetensors " + path.string(), {"duplicate tensor name 'w'"});
  EXPECT_EQ(read_file(path), before);
  EXPECT_TRUE(other_entries("ckpt.safetensors").empty());
}

// Restores the file-size limit and the SIGXFSZ disposition on scope exit.
class FileSizeLimit {
 public:
  explicit FileSizeLimit(rlim_t bytes) {
    getrlimit(RLIMIT_FSIZE, &saved_);
    previous_handler_ = std::signal(SIGXFSZ, SIG_IGN);  // so write() fails with EFBIG
    rlimit limited = saved_;
    limited.rlim_cur = bytes;
    setrlimit(RLIMIT_FSIZE, &limited);
  }
  ~FileSizeLimit() {
    setrlimit(RLIMIT_FSIZE, &saved_);
    std::signal(SIGXFSZ, previous_handler_);
  }

 private:
  rlimit saved_{};
  void (*previous_handler_)(int) = SIG_DFL;
};

TEST_F(SafetensorsFiles, WriteFailureAfterOpeningLeavesOldFileAndNoTemp) {
  fs::path path = dir_ / "ckpt.safetensors";
  save_safetensors(path.string(), {{"w", Tensor::full({4}, 1.0)}});
  std::string before = read_file(path);
  Tensor big = Tensor::zeros({1 << 18}, DType::F32);  // 1 MiB
  {
    FileSizeLimit limit(64 * 1024);
    expect_error([&] { save_safetensors(path.string(), {{"w", big}}); },
                 "save_safetensors " + path.string(),
                 {std::string("writing ") + path.string() + ".tmp.", std::strerror(EFBIG)});
  }
  EXPECT_EQ(read_file(path), before);
  EXPECT_TRUE(other_entries("ckpt.safetensors").empty());
}

TEST_F(SafetensorsFiles, SaveIntoMissingDirectoryNamesPathAndErrno) {
  fs::path path = dir_ / "no_such_dir" / "ckpt.safetensors";
  expect_error([&] { save_safetensors(path.string(), {{"w", Tensor::scalar(1)}}); },
               "save_safetensors " + path.string(), {"cannot create", "No such file or directory"});
}

TEST_F(SafetensorsFiles, SavesTensorsFromTheGpu) {
  if (!has_device_backend(DeviceKind::CUDA)) GTEST_SKIP() << "this build has no CUDA backend";
  Tensor on_gpu;
  try {
    on_gpu = Tensor::arange(10, DType::F32).to(Device::cuda());
  } catch (const Error& e) {
    GTEST_SKIP() << "no usable GPU: " << e.what();
  }
  fs::path path = dir_ / "gpu.safetensors";
  save_safetensors(path.string(), {{"x", on_gpu}});
  SafetensorsFile file = load_safetensors(path.string());
  EXPECT_TRUE(file.at("x").device().is_cpu());
  EXPECT_EQ(file.at("x").to_vector<float>(), Tensor::arange(10, DType::F32).to_vector<float>());
}

}  // namespace
}  // namespace ham
