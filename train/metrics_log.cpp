#include "train/metrics_log.h"

#include <unistd.h>

#include <bit>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <system_error>

#include "core/error.h"

namespace ham {
namespace {

namespace fs = std::filesystem;

void create_parent_directories(const fs::path& file) {
  if (file.has_parent_path()) {
    std::error_code ec;
    fs::create_directories(file.parent_path(), ec);
    HAM_CHECK(!ec, file.parent_path().string(), ": cannot create directory: ", ec.message());
  }
}

void append_little_endian(std::string& out, uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out += char(uint8_t(value >> (8 * i)));
}

std::string host_name() {
  char buffer[256] = {};
  if (gethostname(buffer, sizeof(buffer) - 1) != 0 || buffer[0] == '\0') return "localhost";
  return buffer;
}

}  // namespace

double unix_time_now() {
  using namespace std::chrono;
  return duration<double>(system_clock::now().time_since_epoch()).count();
}

// ---- JSON lines ------------------------------------------------------------------------------

JsonlMetricsWriter::JsonlMetricsWriter(const std::string& path) : path_(path) {
  create_parent_directories(path);
  out_.open(path, std::ios::out | std::ios::app);
  HAM_CHECK(out_.is_open(), path, ": cannot open the metrics log for appending");
}

void JsonlMetricsWriter::write(int64_t step, const NamedScalars& scalars, double time) {
  nlohmann::ordered_json line;
  line["step"] = step;
  line["time"] = time;
  for (const auto& [name, value] : scalars) {
    HAM_CHECK(name != "step" && name != "time" && !line.contains(name), path_,
              ": metric name '", name, "' is reserved or repeated");
    if (std::isfinite(value)) {
      line[name] = value;
    } else {
      line[name] = nullptr;
    }
  }
  out_ << line.dump() << '\n';
  out_.flush();
  HAM_CHECK(out_.good(), path_, ": writing the metrics log failed");
}

// ---- Masked CRC-32C and protobuf --------------------------------------------------------------------

uint32_t masked_crc32c(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }

uint32_t unmasked_crc32c(uint32_t masked) {
  uint32_t rotated = masked - 0xa282ead8u;
  return (rotated << 15) | (rotated >> 17);
}

void ProtoWriter::append_varint(std::string& out, uint64_t value) {
  while (value >= 0x80) {
    out += char(uint8_t(value) | 0x80);
    value >>= 7;
  }
  out += char(uint8_t(value));
}

void ProtoWriter::key(uint32_t field, uint32_t wire_type) {
  append_varint(bytes_, (uint64_t(field) << 3) | wire_type);
}

void ProtoWriter::varint_field(uint32_t field, uint64_t value) {
  key(field, 0);
  append_varint(bytes_, value);
}

void ProtoWriter::double_field(uint32_t field, double value) {
  key(field, 1);
  append_little_endian(bytes_, std::bit_cast<uint64_t>(value), 8);
}

void ProtoWriter::bytes_field(uint32_t field, std::string_view bytes) {
  key(field, 2);
  append_varint(bytes_, bytes.size());
  bytes_.append(bytes);
}

void ProtoWriter::float_field(uint32_t field, float value) {
  key(field, 5);
  append_little_endian(bytes_, std::bit_cast<uint32_t>(value), 4);
}

// ---- Event files -----------------------------------------------------------------------------

namespace {
constexpr uint32_t kEventWallTime = 1, kEventStep = 2, kEventFileVersion = 3, kEventSummary = 5;
constexpr uint32_t kSummaryValue = 1;
constexpr uint32_t kValueTag = 1, kValueSimpleValue = 2;
}  // namespace

std::string encode_file_version_event(double wall_time) {
  ProtoWriter event;
  event.double_field(kEventWallTime, wall_time);
  event.bytes_field(kEventFileVersion, "brain.Event:2");
  return event.bytes();
}

std::string encode_scalar_event(double wall_time, int64_t step, const NamedScalars& scalars) {
  ProtoWriter summary;
  for (const auto& [tag, value] : scalars) {
    ProtoWriter entry;
    entry.bytes_field(kValueTag, tag);
    entry.float_field(kValueSimpleValue, float(value));
    summary.bytes_field(kSummaryValue, entry.bytes());
  }
  ProtoWriter event;
  event.double_field(kEventWallTime, wall_time);
  // int64 fields encode negative values as ten-byte two's-complement varints.
  event.varint_field(kEventStep, uint64_t(step));
  event.bytes_field(kEventSummary, summary.bytes());
  return event.bytes();
}

std::string frame_record(std::string_view data) {
  std::string length;
  append_little_endian(length, data.size(), 8);
  std::string record = length;
  append_little_endian(record, masked_crc32c(crc32c(length)), 4);
  record.append(data);
  append_little_endian(record, masked_crc32c(crc32c(data)), 4);
  return record;
}

TensorBoardWriter::TensorBoardWriter(const std::string& log_dir) {
  std::error_code ec;
  fs::create_directories(log_dir, ec);
  HAM_CHECK(!ec, log_dir, ": cannot create the TensorBoard log directory: ", ec.message());
  double now = unix_time_now();
  char seconds[32];
  std::snprintf(seconds, sizeof(seconds), "%010lld", static_cast<long long>(now));
  std::string base = (fs::path(log_dir) / ("events.out.tfevents." + std::string(seconds) + "." +
                                           host_name()))
                         .string();
  path_ = base;
  for (int suffix = 1; fs::exists(path_); ++suffix) path_ = base + "." + std::to_string(suffix);
  out_.open(path_, std::ios::out | std::ios::binary | std::ios::trunc);
  HAM_CHECK(out_.is_open(), path_, ": cannot create the TensorBoard event file");
  write_record(encode_file_version_event(now));
  flush();
}

TensorBoardWriter::~TensorBoardWriter() {
  if (out_.is_open()) out_.flush();
}

void TensorBoardWriter::write_record(std::string_view data) {
  std::string record = frame_record(data);
  out_.write(record.data(), std::streamsize(record.size()));
  HAM_CHECK(out_.good(), path_, ": writing the TensorBoard event file failed");
}

void TensorBoardWriter::add_scalar(const std::string& tag, int64_t step, double value,
                                   double wall_time) {
  write_record(encode_scalar_event(wall_time, step, {{tag, value}}));
}

void TensorBoardWriter::add_scalars(int64_t step, const NamedScalars& scalars,
                                    double wall_time) {
  if (!scalars.empty()) write_record(encode_scalar_event(wall_time, step, scalars));
}

void TensorBoardWriter::flush() {
  out_.flush();
  HAM_CHECK(out_.good(), path_, ": flushing the TensorBoard event file failed");
}

// ---- Both ------------------------------------------------------------------------------------

MetricsLogger::MetricsLogger(const std::string& run_dir)
    : jsonl_((fs::path(run_dir) / "metrics.jsonl").string()), tensorboard_(run_dir) {}

void MetricsLogger::log(int64_t step, const NamedScalars& scalars) {
  double now = unix_time_now();
  jsonl_.write(step, scalars, now);
  tensorboard_.add_scalars(step, scalars, now);
  tensorboard_.flush();
}

}  // namespace ham
