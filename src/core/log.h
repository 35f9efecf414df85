#pragma once
// Logging goes through spdlog; this sets the level from the CLI's
// --log-level (debug, info, warning, error).
#include <spdlog/spdlog.h>

#include <string_view>

namespace mlaserve {

void init_logging(std::string_view level);

}  // namespace mlaserve
