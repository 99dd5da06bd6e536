#include "train/metrics_log.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <regex>
#include <sstream>
#include <string>

#include "core/error.h"

namespace ham {
namespace {

namespace fs = std::filesystem;

// A fresh directory per test, removed afterwards.
class ScratchDir {
 public:
  explicit ScratchDir(const std::string& name)
      : path_(fs::temp_directory_path() /
              ("ham_metrics_" + name + "_" + std::to_string(::getpid()))) {
    fs::remove_all(path_);
  }
  ~ScratchDir() { fs::remove_all(path_); }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

std::vector<std::string> read_lines(const fs::path& path) {
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

// ---- An independent reader: bitwise CRC, TFRecord framing and the protobuf subset --------

uint32_t bitwise_crc32c(std::string_view bytes) {
  uint32_t reg = 0xFFFFFFFFu;
  for (unsigned char byte : bytes) {
    reg ^= byte;
    for (int bit = 0; bit < 8; ++bit) reg = (reg >> 1) ^ ((reg & 1) ? 0x82F63B78u : 0u);
  }
  return reg ^ 0xFFFFFFFFu;
}

uint32_t mask(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }

uint64_t little_endian(std::string_view bytes) {
  uint64_t value = 0;
  for (size_t i = 0; i < bytes.size(); ++i) value |= uint64_t(uint8_t(bytes[i])) << (8 * i);
  return value;
}

// Splits an event file into record payloads, checking both CRCs of every record.
std::vector<std::string> read_records(const std::string& file) {
  std::vector<std::string> records;
  size_t at = 0;
  while (at < file.size()) {
    if (file.size() - at < 12) throw std::runtime_error("truncated record header");
    std::string_view length_bytes(file.data() + at, 8);
    if (little_endian(std::string_view(file.data() + at + 8, 4)) !=
        mask(bitwise_crc32c(length_bytes))) {
      throw std::runtime_error("bad length CRC");
    }
    uint64_t length = little_endian(length_bytes);
    at += 12;
    if (file.size() - at < length + 4) throw std::runtime_error("truncated record data");
    std::string data = file.substr(at, size_t(length));
    uint64_t stored_crc = little_endian(std::string_view(file.data() + at + length, 4));
    if (stored_crc != mask(bitwise_crc32c(data))) {
      throw std::runtime_error("bad data CRC");
    }
    records.push_back(data);
    at += size_t(length) + 4;
  }
  return records;
}

struct ProtoField {
  uint32_t number = 0;
  uint32_t wire_type = 0;
  uint64_t integer = 0;  // varint, fixed64 and fixed32 payloads
  std::string bytes;     // length-delimited payload
};

uint64_t read_varint(std::string_view data, size_t& at) {
  uint64_t value = 0;
  for (int shift = 0; shift < 70; shift += 7) {
    if (at >= data.size()) throw std::runtime_error("truncated varint");
    uint8_t byte = uint8_t(data[at++]);
    value |= uint64_t(byte & 0x7F) << shift;
    if (!(byte & 0x80)) return value;
  }
  throw std::runtime_error("varint too long");
}

std::vector<ProtoField> parse_message(std::string_view data) {
  std::vector<ProtoField> fields;
  size_t at = 0;
  while (at < data.size()) {
    uint64_t key = read_varint(data, at);
    ProtoField field;
    field.number = uint32_t(key >> 3);
    field.wire_type = uint32_t(key & 7);
    switch (field.wire_type) {
      case 0: field.integer = read_varint(data, at); break;
      case 1:
        field.integer = little_endian(data.substr(at, 8));
        at += 8;
        break;
      case 2: {
        uint64_t length = read_varint(data, at);
        field.bytes = std::string(data.substr(at, size_t(length)));
        at += size_t(length);
        break;
      }
      case 5:
        field.integer = little_endian(data.substr(at, 4));
        at += 4;
        break;
      default: throw std::runtime_error("unexpected wire type");
    }
    if (at > data.size()) throw std::runtime_error("field past the end");
    fields.push_back(field);
  }
  return fields;
}

struct DecodedEvent {
  std::optional<double> wall_time;
  std::optional<int64_t> step;
  std::optional<std::string> file_version;
  std::vector<std::pair<std::string, float>> scalars;
};

DecodedEvent decode_event(const std::string& data) {
  DecodedEvent event;
  for (const ProtoField& field : parse_message(data)) {
    if (field.number == 1 && field.wire_type == 1) {
      double wall_time;
      std::memcpy(&wall_time, &field.integer, 8);
      event.wall_time = wall_time;
    } else if (field.number == 2 && field.wire_type == 0) {
      event.step = int64_t(field.integer);
    } else if (field.number == 3 && field.wire_type == 2) {
      event.file_version = field.bytes;
    } else if (field.number == 5 && field.wire_type == 2) {
      for (const ProtoField& value : parse_message(field.bytes)) {
        if (value.number != 1 || value.wire_type != 2) throw std::runtime_error("not a Value");
        std::string tag;
        std::optional<float> simple_value;
        for (const ProtoField& part : parse_message(value.bytes)) {
          if (part.number == 1 && part.wire_type == 2) tag = part.bytes;
          if (part.number == 2 && part.wire_type == 5) {
            uint32_t bits = uint32_t(part.integer);
            float number;
            std::memcpy(&number, &bits, 4);
            simple_value = number;
          }
        }
        if (!simple_value) throw std::runtime_error("Value without simple_value");
        event.scalars.emplace_back(tag, *simple_value);
      }
    } else {
      throw std::runtime_error("unexpected Event field " + std::to_string(field.number));
    }
  }
  return event;
}

// ---- CRC and encoding --------------------------------------------------------------------

TEST(Crc32c, ReaderCrcAgreesWithTheWriters) {
  // The reader below checks the records with its own bitwise CRC.
  EXPECT_EQ(bitwise_crc32c("123456789"), 0xE3069283u);
  std::string bytes;
  for (int i = 0; i < 300; ++i) bytes += char((i * 37 + 11) & 0xFF);
  EXPECT_EQ(bitwise_crc32c(bytes), crc32c(bytes));
}

TEST(MaskedCrc32c, RotatesAndOffsets) {
  EXPECT_EQ(masked_crc32c(0), 0xA282EAD8u);
  EXPECT_EQ(masked_crc32c(0xE3069283u), 0xC78AB0E5u);
  EXPECT_EQ(masked_crc32c(0x8A9136AAu), 0x0FD7FFFAu);
  for (uint32_t crc : {0u, 1u, 0xE3069283u, 0xFFFFFFFFu, 0x80000000u}) {
    EXPECT_EQ(unmasked_crc32c(masked_crc32c(crc)), crc);
  }
}

TEST(TensorBoard, ProtobufWireFormat) {
  std::string out;
  ProtoWriter::append_varint(out, 300);
  EXPECT_EQ(out, std::string("\xAC\x02", 2));
  out.clear();
  ProtoWriter::append_varint(out, 0);
  EXPECT_EQ(out, std::string("\x00", 1));
  out.clear();
  ProtoWriter::append_varint(out, uint64_t(-1));  // int64 -1: ten bytes
  EXPECT_EQ(out, std::string("\xFF\xFF\xFF\xFF\xFF\xFF\xFF\xFF\xFF\x01", 10));

  ProtoWriter message;
  message.varint_field(2, 150);
  message.bytes_field(1, "hi");
  message.float_field(2, 1.0f);
  message.double_field(1, 2.0);
  EXPECT_EQ(message.bytes(),
            std::string("\x10\x96\x01"                      // field 2 varint 150
                        "\x0A\x02hi"                        // field 1, 2 bytes
                        "\x15\x00\x00\x80\x3F"              // field 2 fixed32 1.0f
                        "\x09\x00\x00\x00\x00\x00\x00\x00\x40",  // field 1 fixed64 2.0
                        3 + 4 + 5 + 9));
}

TEST(TensorBoard, RecordFraming) {
  std::string record = frame_record("abc");
  ASSERT_EQ(record.size(), 8u + 4u + 3u + 4u);
  EXPECT_EQ(little_endian(std::string_view(record).substr(0, 8)), 3u);
  EXPECT_EQ(uint32_t(little_endian(std::string_view(record).substr(8, 4))),
            mask(bitwise_crc32c(record.substr(0, 8))));
  EXPECT_EQ(record.substr(12, 3), "abc");
  EXPECT_EQ(uint32_t(little_endian(std::string_view(record).substr(15, 4))),
            mask(bitwise_crc32c("abc")));
}

// ---- Event files -------------------------------------------------------------------------

TEST(TensorBoard, EventFileParsesBack) {
  ScratchDir dir("events");
  std::string path;
  {
    TensorBoardWriter writer((dir.path() / "run").string());
    path = writer.path();
    writer.add_scalar("train/loss", 1, 2.5, 1000.25);
    writer.add_scalar("train/loss", 2, 2.25, 1001.5);
    writer.add_scalars(3, {{"train/lr", 1e-3}, {"val/loss", 3.0}}, 1002.0);
    writer.flush();
  }
  // events.out.tfevents.<10-digit seconds>.<hostname>
  char host[256] = {};
  ASSERT_EQ(gethostname(host, sizeof(host) - 1), 0);
  std::string name = fs::path(path).filename().string();
  std::smatch match;
  ASSERT_TRUE(std::regex_match(name, match, std::regex(R"(events\.out\.tfevents\.(\d{10})\.(.+))")))
      << name;
  EXPECT_EQ(match[2].str(), std::string(host));
  double seconds = std::stod(match[1].str());
  EXPECT_NEAR(seconds, unix_time_now(), 600);

  std::vector<std::string> records = read_records(read_file(path));
  ASSERT_EQ(records.size(), 4u);
  DecodedEvent header = decode_event(records[0]);
  EXPECT_EQ(header.file_version, std::optional<std::string>("brain.Event:2"));
  ASSERT_TRUE(header.wall_time.has_value());
  EXPECT_NEAR(*header.wall_time, seconds, 1.0);
  EXPECT_FALSE(header.step.has_value());

  DecodedEvent first = decode_event(records[1]);
  EXPECT_EQ(first.wall_time, std::optional<double>(1000.25));
  EXPECT_EQ(first.step, std::optional<int64_t>(1));
  ASSERT_EQ(first.scalars.size(), 1u);
  EXPECT_EQ(first.scalars[0].first, "train/loss");
  EXPECT_EQ(first.scalars[0].second, 2.5f);
  EXPECT_EQ(decode_event(records[2]).scalars[0].second, 2.25f);

  DecodedEvent both = decode_event(records[3]);
  EXPECT_EQ(both.step, std::optional<int64_t>(3));
  ASSERT_EQ(both.scalars.size(), 2u);
  EXPECT_EQ(both.scalars[0].first, "train/lr");
  EXPECT_EQ(both.scalars[0].second, 1e-3f);
  EXPECT_EQ(both.scalars[1].first, "val/loss");
  EXPECT_EQ(both.scalars[1].second, 3.0f);
}

TEST(TensorBoard, ReaderRejectsCorruption) {
  // The test reader's CRC checks are live: a flipped byte anywhere is caught.
  std::string file = frame_record(encode_file_version_event(1.0)) +
                     frame_record(encode_scalar_event(2.0, 7, {{"x", 1.0}}));
  ASSERT_EQ(read_records(file).size(), 2u);
  for (size_t at : {size_t(0), size_t(9), size_t(14), file.size() - 1}) {
    std::string broken = file;
    broken[at] = char(broken[at] ^ 0x10);
    EXPECT_THROW(read_records(broken), std::runtime_error) << "flipped byte " << at;
  }
}

TEST(TensorBoard, SecondWriterInTheSameSecondGetsItsOwnFile) {
  ScratchDir dir("two_writers");
  TensorBoardWriter first(dir.path().string()), second(dir.path().string());
  EXPECT_NE(first.path(), second.path());
  int event_files = 0;
  for (const auto& entry : fs::directory_iterator(dir.path())) {
    event_files += entry.path().filename().string().find("tfevents") != std::string::npos;
  }
  EXPECT_EQ(event_files, 2);
}

TEST(TensorBoard, RealTensorBoardReadsTheFile) {
  fs::path script = fs::path(HAM_SOURCE_DIR) / "scripts" / "check_tensorboard_events.py";
  if (!fs::exists(script)) GTEST_SKIP() << script.string() << " is not there";
  if (std::system("python3 -c 'import tensorboard' > /dev/null 2>&1") != 0) {
    GTEST_SKIP() << "the tensorboard Python package is not installed "
                    "(pip install tensorboard to run this check)";
  }
  ScratchDir dir("real_reader");
  std::string path;
  {
    TensorBoardWriter writer(dir.path().string());
    path = writer.path();
    writer.add_scalar("train/loss", 1, 2.5);
    writer.add_scalar("train/loss", 2, 2.25);
    writer.add_scalars(2, {{"train/lr", 0.5}, {"val/loss", 3.0}});
    writer.add_scalar("train/loss", 1000000, -1.5);
  }
  std::string command = "python3 '" + script.string() + "' '" + path +
                        "' train/loss=1:2.5 train/loss=2:2.25 train/lr=2:0.5 val/loss=2:3 "
                        "train/loss=1000000:-1.5";
  EXPECT_EQ(std::system(command.c_str()), 0) << command;

  // TensorBoard checks the CRCs itself: with the last record's data CRC broken it drops that
  // record, so its acceptance above vouches for the CRCs.
  std::string bytes = read_file(path);
  bytes[bytes.size() - 2] = char(bytes[bytes.size() - 2] ^ 0x01);
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
  std::string last_only = "python3 '" + script.string() + "' '" + path +
                          "' train/loss=1000000:-1.5 2> /dev/null";
  EXPECT_NE(std::system(last_only.c_str()), 0) << "tensorboard accepted a corrupted record";
}

// ---- JSON lines --------------------------------------------------------------------------

TEST(Metrics, JsonLinesFlushPerLineAndAppendOnResume) {
  ScratchDir dir("jsonl");
  fs::path path = dir.path() / "nested" / "metrics.jsonl";
  {
    JsonlMetricsWriter writer(path.string());
    writer.write(1, {{"loss", 2.5}, {"lr", 1e-3}}, 100.5);
    // Flushed already: readable while the writer is open.
    EXPECT_EQ(read_lines(path).size(), 1u);
    writer.write(2, {{"loss", std::nan("")}, {"grad_norm", INFINITY}}, 101.0);
    EXPECT_EQ(read_lines(path).size(), 2u);
  }
  {
    JsonlMetricsWriter resumed(path.string());
    resumed.write(3, {{"loss", 2.0}}, 102.0);
  }
  std::vector<std::string> lines = read_lines(path);
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[0], R"({"step":1,"time":100.5,"loss":2.5,"lr":0.001})");
  nlohmann::json second = nlohmann::json::parse(lines[1]);
  EXPECT_EQ(second["step"], 2);
  EXPECT_TRUE(second["loss"].is_null()) << "NaN is written as null";
  EXPECT_TRUE(second["grad_norm"].is_null());
  nlohmann::json third = nlohmann::json::parse(lines[2]);
  EXPECT_EQ(third["step"], 3);
  EXPECT_EQ(third["loss"], 2.0);
}

TEST(Metrics, ReservedAndRepeatedNamesAreErrors) {
  ScratchDir dir("jsonl_names");
  JsonlMetricsWriter writer((dir.path() / "m.jsonl").string());
  EXPECT_THROW(writer.write(1, {{"step", 1.0}}), Error);
  EXPECT_THROW(writer.write(1, {{"loss", 1.0}, {"loss", 2.0}}), Error);
}

TEST(Metrics, UnwritablePathIsNamed) {
  ScratchDir dir("jsonl_blocked");
  fs::create_directories(dir.path());
  std::ofstream(dir.path() / "file") << "x";
  std::string bad = (dir.path() / "file" / "metrics.jsonl").string();
  try {
    JsonlMetricsWriter writer(bad);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find((dir.path() / "file").string()), std::string::npos)
        << e.what();
  }
}

TEST(Metrics, LoggerWritesBothFiles) {
  ScratchDir dir("logger");
  std::string event_path;
  {
    MetricsLogger logger(dir.path().string());
    logger.log(10, {{"loss", 1.25}});
    logger.log(20, {{"loss", 1.0}, {"tokens_per_second", 5000}});
    event_path = logger.tensorboard().path();
  }
  std::vector<std::string> lines = read_lines(dir.path() / "metrics.jsonl");
  ASSERT_EQ(lines.size(), 2u);
  nlohmann::json last = nlohmann::json::parse(lines[1]);
  EXPECT_EQ(last["tokens_per_second"], 5000.0);
  std::vector<std::string> records = read_records(read_file(event_path));
  ASSERT_EQ(records.size(), 3u);
  DecodedEvent event = decode_event(records[2]);
  EXPECT_EQ(event.step, std::optional<int64_t>(20));
  ASSERT_EQ(event.scalars.size(), 2u);
  EXPECT_EQ(event.scalars[1].first, "tokens_per_second");
  EXPECT_EQ(event.wall_time, std::optional<double>(double(last["time"])))
      << "both files carry the same time stamp";
}

}  // namespace
}  // namespace ham
