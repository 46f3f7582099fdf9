#include "deltaserve/api/version.h"

namespace deltaserve::api {

const char* deltaserve_version() { return DELTASERVE_VERSION; }

}  // namespace deltaserve::api
