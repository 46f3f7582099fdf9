// Logging: spdlog, always to stderr (stdout carries generated text only).
#pragma once

#include <spdlog/spdlog.h>

#include <string_view>

namespace deltaserve {

// Installs the stderr logger as spdlog's default. level: trace, debug, info, warn, error,
// off. Safe to call more than once.
void init_logging(std::string_view level = "warn");

// A one-line progress bar on stderr, drawn only when stderr is a terminal.
class ProgressBar {
public:
    explicit ProgressBar(std::string_view label);
    ~ProgressBar();
    void update(double fraction);  // 0..1
    void finish();

private:
    std::string label_;
    bool enabled_;
    int last_percent_ = -1;
    bool done_ = false;
};

}  // namespace deltaserve
