/* ctor_main.c -- prints what libctor.so's constructor achieved. */
#include <stdio.h>

extern int ctor_ok, ctor_fail;

int main(void)
{
    printf("ctor ok=%d fail=%d\n", ctor_ok, ctor_fail);
    return 0;
}
