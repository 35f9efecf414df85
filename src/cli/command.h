#pragma once
// Subcommands register themselves from their own file, so adding one never
// touches main.cpp: each file defines a static CommandRegistration.
#include <CLI/CLI.hpp>

#include <functional>
#include <string>
#include <vector>

namespace mlaserve::cli {

// Declares options on `app` and returns the action to run if this
// subcommand is chosen (exit code as result).
using CommandSetup = std::function<std::function<int()>(CLI::App& app)>;

struct CommandInfo {
  std::string name;
  std::string help;
  CommandSetup setup;
};

std::vector<CommandInfo>& command_registry();

struct CommandRegistration {
  CommandRegistration(std::string name, std::string help, CommandSetup setup) {
    command_registry().push_back({std::move(name), std::move(help), std::move(setup)});
  }
};

}  // namespace mlaserve::cli
