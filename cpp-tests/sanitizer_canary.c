/* asan preset only: proves LeakSanitizer is linked and active in this environment. The test
 * `asan.leak_canary` passes only when LeakSanitizer reports this deliberate leak. */
#include <stdio.h>
#include <stdlib.h>

void *volatile canary_sink;

int main(void) {
    canary_sink = malloc(4242);
    canary_sink = NULL; /* the only reference is gone: a definite leak */
    printf("leak planted\n");
    return 0;
}
