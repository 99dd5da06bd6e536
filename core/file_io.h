#pragma once
// Whole-file reads and atomic writes of the files ham keeps (configs, reports, traces,
// tokenizers). safetensors.h writes its binary files the same way with a CRC of its own.
#include <string>
#include <string_view>

namespace ham {

// The file's bytes. An unreadable path (missing, a directory, no permission) is a one-line
// error "PATH: cannot read WHAT: reason".
std::string read_file(const std::string& path, std::string_view what);

// Writes `contents` to a hidden temporary file beside `path` (".NAME.tmp.PID"), syncs it to
// disk and renames it over `path`, then syncs the directory: a reader, or the next run
// after a crash, finds the old file or the new one, never a part. On failure the temporary
// file is removed and the error names `path`.
void write_file_atomically(const std::string& path, std::string_view contents);

}  // namespace ham
