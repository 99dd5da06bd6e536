#include "core/file_io.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "tests/error_testing.h"

namespace ham {
namespace {

namespace fs = std::filesystem;
using testing::expect_error;

class FileIo : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("ham_file_io_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  int64_t entries() const {
    return std::distance(fs::directory_iterator(dir_), fs::directory_iterator());
  }
  fs::path dir_;
};

TEST_F(FileIo, ReadsWhatItWroteAndReplacesTheOldFileWhole) {
  std::string big(300000, 'x');  // more than one read's buffer
  for (size_t i = 0; i < big.size(); i += 7) big[i] = char(i % 256);
  write_file_atomically(path("a.bin"), big);
  EXPECT_EQ(read_file(path("a.bin"), "the test file"), big);
  write_file_atomically(path("a.bin"), "short");
  EXPECT_EQ(read_file(path("a.bin"), "the test file"), "short");
  write_file_atomically(path("empty"), "");
  EXPECT_EQ(read_file(path("empty"), "the test file"), "");
  EXPECT_EQ(entries(), 2);  // no temporary file left beside them
}

TEST_F(FileIo, UnreadableAndUnwritablePathsAreOneLineErrorsNamingThem) {
  expect_error([&] { read_file(path("missing"), "the prompt"); },
               {path("missing"), "cannot read the prompt", "No such file"});
  expect_error([&] { read_file(dir_.string(), "the text file"); }, {dir_.string(), "directory"});
  write_file_atomically(path("kept"), "old");
  // The target is a directory: the rename fails, the temporary file goes, the rest stays.
  fs::create_directories(path("a_directory/inside"));
  expect_error([&] { write_file_atomically(path("a_directory"), "new"); },
               {path("a_directory"), "cannot write", "renaming"});
  expect_error([&] { write_file_atomically(path("no/such/dir/file"), "new"); },
               {path("no/such/dir/file"), "cannot write", "creating"});
  EXPECT_EQ(read_file(path("kept"), "the kept file"), "old");
  EXPECT_EQ(entries(), 2);
}

}  // namespace
}  // namespace ham
