// The dashboard's page, script and stylesheet: the files of runtime/serve/assets/, embedded in the binary when it
// is built (embed_assets.cmake writes dashboard_assets.cpp), so that nothing is fetched at run time.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace runner::serve {

struct DashboardAsset {
  std::string_view name;          // the file's name, e.g. "dashboard.js"
  std::string_view content_type;  // e.g. "text/javascript; charset=utf-8"
  std::string_view content;
};

// Every embedded file (generated at build time).
const std::vector<DashboardAsset>& dashboard_assets();

// The embedded file of that name; none when there is none.
const DashboardAsset* find_asset(std::string_view name);

}  // namespace runner::serve
