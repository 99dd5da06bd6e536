#include "core/file_io.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "core/error.h"

namespace ham {

namespace {

struct Descriptor {
  int fd;
  ~Descriptor() {
    if (fd >= 0) ::close(fd);
  }
};

}  // namespace

std::string read_file(const std::string& path, std::string_view what) {
  Descriptor file{::open(path.c_str(), O_RDONLY | O_CLOEXEC)};
  HAM_CHECK(file.fd >= 0, path, ": cannot read ", what, ": ", std::strerror(errno));
  std::string contents;
  char buffer[1 << 16];
  for (;;) {
    ssize_t n = ::read(file.fd, buffer, sizeof buffer);
    if (n < 0 && errno == EINTR) continue;
    HAM_CHECK(n >= 0, path, ": cannot read ", what, ": ", std::strerror(errno));  // EISDIR for a directory
    if (n == 0) break;
    contents.append(buffer, size_t(n));
  }
  return contents;
}

void write_file_atomically(const std::string& path, std::string_view contents) {
  namespace fs = std::filesystem;
  const fs::path target(path);
  std::string name(1, '.');  // (not "." + name: GCC 12 warns of a false -Wrestrict there)
  name += target.filename().string();
  name += ".tmp.";
  name += std::to_string(::getpid());
  const std::string temp = (target.parent_path() / name).string();
  auto fail = [&](const char* step) {
    const int err = errno;
    ::unlink(temp.c_str());
    HAM_FAIL(path, ": cannot write: ", step, " ", temp, " failed: ", std::strerror(err));
  };
  {
    Descriptor file{::open(temp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644)};
    if (file.fd < 0) fail("creating");
    for (size_t done = 0; done < contents.size();) {
      ssize_t n = ::write(file.fd, contents.data() + done, contents.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) fail("writing");
      done += size_t(n);
    }
    if (::fsync(file.fd) != 0) fail("syncing");
    const int fd = file.fd;
    file.fd = -1;
    if (::close(fd) != 0) fail("closing");
  }
  if (::rename(temp.c_str(), path.c_str()) != 0) fail("renaming");
  // The rename is durable once the directory is synced; filesystems that cannot sync a
  // directory say EINVAL, which is no failure of the write.
  fs::path dir = target.parent_path();
  if (dir.empty()) dir = ".";
  Descriptor directory{::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC)};
  HAM_CHECK(directory.fd >= 0, path, ": cannot open its directory to sync it: ", std::strerror(errno));
  HAM_CHECK(::fsync(directory.fd) == 0 || errno == EINVAL, path, ": syncing its directory failed: ",
            std::strerror(errno));
}

}  // namespace ham
