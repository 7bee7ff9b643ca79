// Double-include test, C++ TU "a": every public header, each included twice.
#include <mooncake_rs.h>
#include <store_c.h>
#include <mooncake_rs.hpp>
#include <mooncake_rs.h>
#include <store_c.h>
#include <mooncake_rs.hpp>

// The address of an inline function of the wrapper: one definition program-wide (ODR).
const void *double_include_a() {
    return reinterpret_cast<const void *>(&mooncake_rs::detail::c_keys);
}
