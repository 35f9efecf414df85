// mlaserve: one binary, subcommands registered from src/cli/*.cpp.
#include <algorithm>
#include <cstdio>
#include <exception>
#include <map>

#include "cli/command.h"
#include "core/error.h"
#include "core/log.h"

namespace mlaserve::cli {

std::vector<CommandInfo>& command_registry() {
  static std::vector<CommandInfo> r;
  return r;
}

}  // namespace mlaserve::cli

int main(int argc, char** argv) {
  using namespace mlaserve;
  CLI::App app{"mlaserve: DeepSeek-V3 family inference server"};
  app.require_subcommand(1);
  std::string log_level = "info";
  app.add_option("--log-level", log_level, "debug, info, warning, error")->capture_default_str();

  auto& registry = cli::command_registry();
  std::sort(registry.begin(), registry.end(), [](auto& a, auto& b) { return a.name < b.name; });
  std::map<CLI::App*, std::function<int()>> actions;
  for (auto& c : registry) {
    CLI::App* sub = app.add_subcommand(c.name, c.help);
    actions[sub] = c.setup(*sub);
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    init_logging(log_level);
    for (auto& [sub, action] : actions) {
      if (sub->parsed()) return action();
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 1;
}
