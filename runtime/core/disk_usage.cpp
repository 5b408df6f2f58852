// Disk usage of a tree by nftw, each multiply linked file counted once its last link in the tree is seen.
#include "runtime/core/disk_usage.h"

#include <ftw.h>
#include <sys/stat.h>

#include <map>
#include <utility>

namespace runner::core {
namespace {

thread_local std::uint64_t usage_total = 0;
thread_local std::map<std::pair<dev_t, ino_t>, nlink_t> usage_links;  // links seen of files with several

// The blocks a file holds, counted once its last link in the tree is seen: a file linked from elsewhere too is
// not freed by deleting the tree.
int add_usage(const char*, const struct stat* info, int type, struct FTW*) {
  if (type != FTW_F && type != FTW_SL && type != FTW_D && type != FTW_DP) return 0;
  if (type == FTW_F && info->st_nlink > 1 && ++usage_links[{info->st_dev, info->st_ino}] < info->st_nlink) return 0;
  usage_total += static_cast<std::uint64_t>(info->st_blocks) * 512;
  return 0;
}

}  // namespace

std::uint64_t disk_usage(const std::string& path) {
  usage_total = 0;
  usage_links.clear();
  ::nftw(path.c_str(), add_usage, 16, FTW_PHYS);
  return usage_total;
}

}  // namespace runner::core
