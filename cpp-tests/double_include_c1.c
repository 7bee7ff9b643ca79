/* Double-include test, C TU 1: the C headers, each included twice. */
#include <mooncake_rs.h>
#include <store_c.h>
#include <mooncake_rs.h>
#include <store_c.h>

const char *double_include_c1(void);
const char *double_include_c1(void) { return mc_version(); }
