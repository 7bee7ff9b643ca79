/* Installed-package smoke test (C): version, then an embedded put/get round trip. */
#include <mooncake_rs.h>
#include <stdio.h>
#include <string.h>

int main(void) {
    mc_store_t *store = mc_store_new();
    mc_setup_config_t config;
    mc_setup_config_init(&config);
    config.master_server_addr = "embedded";
    char out[16] = {0};
    int ok = store != NULL && mc_store_setup(store, &config) == 0 &&
             mc_store_put(store, "consumer", "installed", 9, NULL) == 0 &&
             mc_store_get_into(store, "consumer", out, sizeof out) == 9 &&
             memcmp(out, "installed", 9) == 0;
    mc_store_free(store);
    printf("consumer_c: mooncake_rs %s: %s\n", mc_version(), ok ? "ok" : "FAILED");
    return ok ? 0 : 1;
}
