#include "deltaserve/common/logging.h"

#include <spdlog/sinks/stdout_color_sinks.h>
#include <unistd.h>

#include <cstdio>

namespace deltaserve {

void init_logging(std::string_view level) {
    auto logger = spdlog::get("deltaserve");
    if (!logger) {
        logger = spdlog::stderr_color_mt("deltaserve");
        logger->set_pattern("[%H:%M:%S.%e] [%^%l%$] %v");
        spdlog::set_default_logger(logger);
    }
    spdlog::set_level(spdlog::level::from_str(std::string(level)));
}

ProgressBar::ProgressBar(std::string_view label)
    : label_(label), enabled_(isatty(STDERR_FILENO) == 1) {}

ProgressBar::~ProgressBar() { finish(); }

void ProgressBar::update(double fraction) {
    if (!enabled_ || done_) return;
    const int percent = static_cast<int>(fraction * 100.0 + 0.5);
    if (percent == last_percent_) return;
    last_percent_ = percent;
    constexpr int kWidth = 30;
    const int filled = percent * kWidth / 100;
    std::fprintf(stderr, "\r%s [", label_.c_str());
    for (int i = 0; i < kWidth; ++i) std::fputc(i < filled ? '#' : ' ', stderr);
    std::fprintf(stderr, "] %3d%%", percent);
    std::fflush(stderr);
}

void ProgressBar::finish() {
    if (!enabled_ || done_) return;
    update(1.0);
    std::fputc('\n', stderr);
    done_ = true;
}

}  // namespace deltaserve
