// Must NOT compile: kv/ sits below forward/ in the data flow, so the kv library does not see
// forward's headers. The test "Layering.WrongWayIncludeFailsToBuild" builds this file as part of
// kvl_kv's include set and expects the build to fail.
#include "kvl/forward.h"
