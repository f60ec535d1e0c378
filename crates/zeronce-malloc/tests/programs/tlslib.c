/* A library with thread-local storage too large for the static TLS reserve: loaded with
 * dlopen, each thread's block of it is allocated (by glibc, through malloc) on first use. */
#include <string.h>

static __thread char big[1 << 20];

int touch_tls(int v) {
    memset(big, v, sizeof big);
    return big[sizeof big - 1] + big[12345];
}
