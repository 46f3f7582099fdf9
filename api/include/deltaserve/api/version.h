// deltaserve's version (CMake's project version), as nodes report it to the gateway and the
// admin service reports it to deltactl cluster.
#pragma once

namespace deltaserve::api {

const char* deltaserve_version();

}  // namespace deltaserve::api
