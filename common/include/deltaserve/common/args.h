// A small command-line parser: --flag VALUE, --flag=VALUE and boolean --flag. One rule for
// a flag given twice: a list flag (add_list) takes every occurrence, any other flag given
// twice is refused by name (a second value silently replacing the first locked out a
// tenant's key).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "deltaserve/common/status.h"

namespace deltaserve {

class ArgParser {
  public:
    ArgParser(std::string command, std::string summary)
        : command_(std::move(command)), summary_(std::move(summary)) {}

    void add(const std::string& name, std::string* target, const std::string& help);
    void add(const std::string& name, int32_t* target, const std::string& help);
    void add(const std::string& name, uint64_t* target, const std::string& help);
    void add(const std::string& name, float* target, const std::string& help);
    void add_switch(const std::string& name, bool* target, const std::string& help);
    // A list: each occurrence appends its value, split at commas (spaces around an item
    // trimmed, empty items dropped).
    void add_list(const std::string& name, std::vector<std::string>* target,
                  const std::string& help);

    // Fills the targets. Errors: kInvalidArgument naming an unknown flag, a missing value,
    // a value that does not parse, or a flag that is not a list given twice. Sets help_requested()
    // on --help / -h.
    Status parse(int argc, char** argv);
    bool help_requested() const { return help_; }
    // Whether a flag was given on the command line.
    bool given(const std::string& name) const;
    std::string usage() const;

  private:
    using Target =
        std::variant<std::string*, int32_t*, uint64_t*, float*, bool*, std::vector<std::string>*>;
    struct Flag {
        std::string name;
        Target target;
        std::string help;
        std::string default_text;
        bool seen = false;
    };
    Status set(Flag& f, const std::string& value);

    std::string command_;
    std::string summary_;
    std::vector<Flag> flags_;
    bool help_ = false;
};

// "a, b,,c" -> {"a", "b", "c"}: split at commas, spaces around an item trimmed, empty items
// dropped (a list flag's values, a list in a variable or a config value).
std::vector<std::string> split_comma_list(std::string_view list);

// Parses argv into p's targets. Returns the exit code when the command should stop here:
// 0 after printing --help to stdout, 2 after printing a one-line error; nullopt to go on.
std::optional<int> parse_flags(ArgParser& p, int argc, char** argv);

}  // namespace deltaserve
