// The OpenAI chat fields deltaserve does not serve yet and that would change the answer if
// they were ignored: a request that sets one to anything but its neutral value is refused
// naming it (api/README.md's field table lists every field and what is done with it).
#pragma once

#include "deltaserve/common/status.h"
#include "json_fields.h"

namespace deltaserve::api {

// kInvalidArgument naming the first such field j sets.
Status refuse_unserved_fields(const RequestJson& j);

}  // namespace deltaserve::api
