/* example_check.h: the one assertion macro the C examples share (not part of the library API).
 * EXPECT_EQ records a failure and keeps going; the example's exit status is CHECK_EXIT_STATUS(). */
#ifndef MOONCAKE_RS_EXAMPLE_CHECK_H
#define MOONCAKE_RS_EXAMPLE_CHECK_H

#include <stdio.h>

static int example_failures = 0;

#define EXPECT_EQ(actual, expected)                                                            \
    do {                                                                                       \
        long long a_ = (long long)(actual), e_ = (long long)(expected);                        \
        if (a_ != e_) {                                                                        \
            fprintf(stderr, "%s:%d: %s == %lld, expected %lld\n", __FILE__, __LINE__, #actual, \
                    a_, e_);                                                                   \
            example_failures++;                                                                \
        }                                                                                      \
    } while (0)

static inline int example_exit_status(const char *name) {
    printf("%s: %s (%d failed checks)\n", name, example_failures ? "FAILED" : "ok",
           example_failures);
    return example_failures ? 1 : 0;
}

#endif
