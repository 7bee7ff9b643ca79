/* Double-include test, C TU 2: the C headers, each included twice. */
#include <mooncake_rs.h>
#include <store_c.h>
#include <mooncake_rs.h>
#include <store_c.h>

const char *double_include_c2(void);
const char *double_include_c2(void) { return mc_version(); }
