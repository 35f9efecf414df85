#include "core/log.h"

#include "core/error.h"

#include <spdlog/sinks/stdout_color_sinks.h>

namespace mlaserve {

void init_logging(std::string_view level) {
  spdlog::level::level_enum l;
  if (level == "debug") l = spdlog::level::debug;
  else if (level == "info") l = spdlog::level::info;
  else if (level == "warning" || level == "warn") l = spdlog::level::warn;
  else if (level == "error") l = spdlog::level::err;
  else fail("unknown log level '{}' (debug, info, warning, error)", level);
  // Logs go to stderr so subcommands can print results on stdout.
  static auto logger = [] {
    auto lg = spdlog::stderr_color_mt("mlaserve");
    spdlog::set_default_logger(lg);
    return lg;
  }();
  (void)logger;
  spdlog::set_level(l);
  spdlog::set_pattern("[%Y-%m-%d %H:%M:%S.%e] [%^%l%$] %v");
}

}  // namespace mlaserve
