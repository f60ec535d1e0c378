/* Touches a 64 MiB block and prints how much of the process is in transparent huge pages
 * (AnonHugePages of /proc/self/smaps_rollup, KiB). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(void) {
    size_t n = 64 << 20;
    char *p = malloc(n);
    memset(p, 1, n);
    volatile char *v = p; /* so the compiler keeps the block */
    long huge = -1;
    char line[256];
    FILE *f = fopen("/proc/self/smaps_rollup", "r");
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "AnonHugePages:", 14)) huge = atol(line + 14);
    if (f) fclose(f);
    printf("touched %d huge_kib %ld\n", v[n / 2], huge);
    free(p);
    return 0;
}
