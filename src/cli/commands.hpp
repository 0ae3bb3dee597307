// The checkpoint subcommands of `microscale`: quantize, dequantize, convert, inspect.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <vector>

namespace microscale::cli {

struct Command {
  CLI::App* app;
  std::function<void()> run;  // called when this subcommand was given
};

// Registers the subcommands on `app`; their options live as long as the returned callbacks.
std::vector<Command> add_checkpoint_commands(CLI::App& app);

}  // namespace microscale::cli
