#pragma once
// Training logs people can read: a JSON-lines file (one object per logged step) and a
// TensorBoard event file written by hand (no TensorFlow or protobuf library needed).
#include <cstdint>
#include <fstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/crc32c.h"

namespace ham {

using NamedScalars = std::vector<std::pair<std::string, double>>;

// Seconds since the Unix epoch, with sub-second precision.
double unix_time_now();

// Appends {"step": s, "time": t, name: value, ...} lines to `path` (keys in the order
// given; NaN and infinities become null, which JSON can hold). Each line is flushed as it
// is written, so a crash loses nothing and `tail -f` shows progress; opening an existing
// file appends, so a resumed run continues the same log.
class JsonlMetricsWriter {
 public:
  explicit JsonlMetricsWriter(const std::string& path);  // creates parent directories
  void write(int64_t step, const NamedScalars& scalars, double time = unix_time_now());
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::ofstream out_;
};

// ---- TensorBoard event files -------------------------------------------------------------

// Records carry CRC-32Cs (core/crc32c.h) under the TFRecord mask: rotate right by 15 and add 0xa282ead8 (mod 2^32), so that a CRC of
// data that itself holds CRCs is not degenerate.
uint32_t masked_crc32c(uint32_t crc);
uint32_t unmasked_crc32c(uint32_t masked);

// Protocol-buffer wire format, just what event files need. Field keys are
// (field_number << 3) | wire_type; integers are little-endian.
class ProtoWriter {
 public:
  void varint_field(uint32_t field, uint64_t value);         // wire type 0
  void double_field(uint32_t field, double value);            // wire type 1 (fixed64)
  void bytes_field(uint32_t field, std::string_view bytes);   // wire type 2 (length-delimited)
  void float_field(uint32_t field, float value);              // wire type 5 (fixed32)
  const std::string& bytes() const { return bytes_; }

  static void append_varint(std::string& out, uint64_t value);  // 7 bits per byte, LSB first

 private:
  void key(uint32_t field, uint32_t wire_type);
  std::string bytes_;
};

// Event messages (tensorflow/core/util/event.proto, summary.proto):
//   Event{1: wall_time double, 2: step int64, 3: file_version string, 5: summary Summary}
//   Summary{1: repeated Value}, Value{1: tag string, 2: simple_value float}
std::string encode_file_version_event(double wall_time);
std::string encode_scalar_event(double wall_time, int64_t step, const NamedScalars& scalars);
// TFRecord framing: u64 length, u32 masked CRC of the length bytes, data, u32 masked CRC
// of the data.
std::string frame_record(std::string_view data);

// Writes events.out.tfevents.<10-digit seconds>.<hostname> in `log_dir` (created if
// missing; a name already taken gets a ".1", ".2", ... suffix, which TensorBoard still
// reads). The first record is the file_version event "brain.Event:2".
class TensorBoardWriter {
 public:
  explicit TensorBoardWriter(const std::string& log_dir);
  ~TensorBoardWriter();
  void add_scalar(const std::string& tag, int64_t step, double value,
                  double wall_time = unix_time_now());
  // All scalars of a step in one event.
  void add_scalars(int64_t step, const NamedScalars& scalars, double wall_time = unix_time_now());
  void flush();
  const std::string& path() const { return path_; }

 private:
  void write_record(std::string_view data);
  std::string path_;
  std::ofstream out_;
};

// Both logs for one run directory: <run_dir>/metrics.jsonl and the event file in <run_dir>.
class MetricsLogger {
 public:
  explicit MetricsLogger(const std::string& run_dir);
  void log(int64_t step, const NamedScalars& scalars);  // one time stamp for both files
  void flush() { tensorboard_.flush(); }
  const JsonlMetricsWriter& jsonl() const { return jsonl_; }
  const TensorBoardWriter& tensorboard() const { return tensorboard_; }

 private:
  JsonlMetricsWriter jsonl_;
  TensorBoardWriter tensorboard_;
};

}  // namespace ham
