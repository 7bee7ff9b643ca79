// Double-include test: links two C++ and two C translation units that include every public header
// twice, then checks that they agree (one inline definition, one version string).
#include <mooncake_rs.hpp>

#include <cstdio>
#include <cstring>
#include <string>

const void *double_include_a();
const void *double_include_b();
extern "C" const char *double_include_c1(void);
extern "C" const char *double_include_c2(void);

int main() {
    int failures = 0;
    if (double_include_a() != double_include_b()) {
        std::fprintf(stderr, "inline wrapper function has two addresses\n");
        failures++;
    }
    const char *version = mc_version();
    if (version == nullptr || std::strcmp(version, double_include_c1()) != 0 ||
        std::strcmp(version, double_include_c2()) != 0) {
        std::fprintf(stderr, "mc_version differs between translation units\n");
        failures++;
    }
#if defined(MC_VERSION_MAJOR) && defined(MC_VERSION_MINOR) && defined(MC_VERSION_PATCH)
    std::string macros = std::to_string(MC_VERSION_MAJOR) + "." + std::to_string(MC_VERSION_MINOR) +
                         "." + std::to_string(MC_VERSION_PATCH);
    if (version == nullptr || macros != version) {
        std::fprintf(stderr, "MC_VERSION_* macros say %s, mc_version() says %s\n", macros.c_str(),
                     version ? version : "(null)");
        failures++;
    }
#else
    std::fprintf(stderr, "MC_VERSION_MAJOR/MINOR/PATCH macros are missing from mooncake_rs.h\n");
    failures++;
#endif
    std::printf("double include: %s (mooncake_rs %s)\n", failures ? "FAILED" : "ok",
                version ? version : "(null)");
    return failures ? 1 : 0;
}
