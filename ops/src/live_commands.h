// The live halves of deltactl sessions and tiers (live_commands.cpp).
#pragma once

#include <string>
#include <vector>

#include "command_support.h"

namespace deltaserve::ops {

int print_live_sessions(std::vector<api::SessionRow> rows, const Common& c,
                        const std::string& sort_by, const std::string* tenant,
                        const std::string* node);
int print_live_tiers(const std::vector<api::NodeStats>& nodes, const Common& c);

}  // namespace deltaserve::ops
