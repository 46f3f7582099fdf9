#include "deltaserve/common/user_dirs.h"

#include <cstdlib>
#include <filesystem>

namespace deltaserve {

std::string default_data_dir() {
    namespace fs = std::filesystem;
    if (const char* xdg = std::getenv("XDG_DATA_HOME"); xdg != nullptr && xdg[0] == '/')
        return (fs::path(xdg) / "deltaserve").string();
    if (const char* home = std::getenv("HOME"); home != nullptr && home[0] != '\0')
        return (fs::path(home) / ".local" / "share" / "deltaserve").string();
    return "";
}

}  // namespace deltaserve
