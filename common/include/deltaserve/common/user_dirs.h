// Per-user folders, as XDG's base directory spec names them (llama.cpp's and Hugging Face's
// caches follow it too).
#pragma once

#include <string>

namespace deltaserve {

// deltaserve's data folder: $XDG_DATA_HOME/deltaserve, else $HOME/.local/share/deltaserve;
// "" when neither variable is set. The default --data-dir of deltaserve serve and deltactl.
std::string default_data_dir();

}  // namespace deltaserve
