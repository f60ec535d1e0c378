#include <stdio.h>
#include <stdlib.h>

int main(void) {
    void *p = malloc(4 << 20);
    free(p);
    puts("main: ok");
    return 0;
}
