// The row conversions (kernels/kv_row.h) as kvstore's code calls them. Private to kvstore/.
#pragma once

#include "deltaserve/kernels/kv_row.h"

namespace deltaserve::kvstore {

using kernels::read_kv_row;
using kernels::write_kv_row;

}  // namespace deltaserve::kvstore
