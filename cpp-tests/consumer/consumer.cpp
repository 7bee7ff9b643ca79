// Installed-package smoke test (C++ wrapper): an embedded put/get round trip through RealClient.
#include <mooncake_rs.hpp>

#include <cstdio>
#include <string>

int main() {
    std::shared_ptr<mooncake_rs::RealClient> client = mooncake_rs::RealClient::create();
    bool ok = client != nullptr &&
              client->setup_real("localhost", "P2PHANDSHAKE", 16 << 20, 16 << 20, "tcp", "",
                                 "embedded") == 0 &&
              client->put("consumer", std::string("installed")) == 0;
    std::shared_ptr<mooncake_rs::BufferHandle> got = ok ? client->get_buffer("consumer") : nullptr;
    ok = got != nullptr && std::string(static_cast<char *>(got->ptr()), got->size()) == "installed";
    std::printf("consumer_cxx: %s\n", ok ? "ok" : "FAILED");
    return ok ? 0 : 1;
}
